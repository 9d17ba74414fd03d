"""BudgetManager: atomic check-and-commit, no overspend, no refunds, durable spend, clear errors."""

from __future__ import annotations

import math
import threading
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin import (
    ApproxDPEvent,
    BudgetExhaustedError,
    BudgetManager,
    BudgetMismatchError,
    ConfigurationError,
    GaussianEvent,
    PoissonSampledEvent,
    PrivacyBudget,
    PureDPEvent,
    SampledWithoutReplacementEvent,
    UnsupportedEventError,
)
from dp_icl_plugin.accounting import RDPCurveEvent, get_accountant
from dp_icl_plugin.accounting import method_events as me


@pytest.fixture(params=["memory", "sqlite"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> BudgetManager:
    ledger = None if request.param == "memory" else tmp_path / "l.db"
    m = BudgetManager(PrivacyBudget(epsilon=1.0, delta=1e-6), ledger=ledger)
    yield m
    m.close()


def test_spend_commits_until_exhausted_then_refuses_without_committing(manager: BudgetManager) -> None:
    for i in range(10):
        entry = manager.spend(PureDPEvent(0.1, neighbouring="replace_one"), label=f"call-{i}")
        assert entry.id == i + 1
    with pytest.raises(BudgetExhaustedError) as info:
        manager.spend(PureDPEvent(0.1, neighbouring="replace_one"), label="one-too-many")
    assert len(manager.history()) == 10  # nothing committed by the refusal
    assert info.value.requested_epsilon == pytest.approx(0.1, rel=1e-4)  # PLD: pure ε-DP is slightly below ε at δ > 0
    assert info.value.remaining_epsilon < 1e-3  # ten 0.1-DP charges compose to just under 1.0 (PLD)
    assert info.value.total_epsilon > 1.0
    assert manager.spent().epsilon == pytest.approx(1.0, rel=1e-3)
    assert manager.remaining().epsilon < 1e-3


def test_refused_charge_reports_requested_and_remaining(manager: BudgetManager) -> None:
    manager.spend(PureDPEvent(0.75, neighbouring="replace_one"), label="a")
    with pytest.raises(BudgetExhaustedError) as info:
        manager.spend(PureDPEvent(0.5, neighbouring="replace_one"), label="b")
    assert info.value.requested_epsilon == pytest.approx(0.5, rel=1e-4)
    assert info.value.remaining_epsilon == pytest.approx(0.25, rel=1e-4)  # PLD: pure ε-DP is slightly below ε at δ > 0
    assert "nothing was committed" in str(info.value)
    manager.spend(PureDPEvent(0.25, neighbouring="replace_one"), label="c")  # what is left still fits exactly
    assert manager.label_counts() == {"a": 1, "c": 1}


def test_would_fit_is_a_dry_run(manager: BudgetManager) -> None:
    assert manager.would_fit(PureDPEvent(1.0, neighbouring="replace_one"))
    assert not manager.would_fit(PureDPEvent(1.5, neighbouring="replace_one"))
    assert manager.history() == []


def test_history_keeps_labels_events_and_time_order(manager: BudgetManager) -> None:
    e1, e2 = (
        PureDPEvent(0.2, neighbouring="replace_one"),
        me.tang_event(noise_multiplier=2.0, sampling_rate=0.01, steps=10),
    )
    manager.spend(e1, label="selector")
    manager.spend(e2, label="retriever")
    hist = manager.history()
    assert [h.label for h in hist] == ["selector", "retriever"]
    assert [h.event for h in hist] == [e1, e2]
    assert hist[0].timestamp <= hist[1].timestamp
    assert hist[0].committed_at.tzinfo is not None


def test_spent_uses_the_tightest_accountant(manager: BudgetManager) -> None:
    event = me.tang_event(noise_multiplier=3.0, sampling_rate=0.01, steps=10)
    manager.spend(event, label="x")
    expected = get_accountant("auto").epsilon(event, delta=1e-6)
    assert manager.spent().epsilon == pytest.approx(expected, abs=1e-12)
    assert expected <= get_accountant("rdp").epsilon(event, delta=1e-6)


def test_one_replace_one_ledger_holds_poisson_and_without_replacement_charges(manager: BudgetManager) -> None:
    ar_gaussian = GaussianEvent(5.0, neighbouring="add_remove")
    manager.spend(PoissonSampledEvent(0.1, ar_gaussian, neighbouring="add_remove"), label="poisson")  # converted
    wor = SampledWithoutReplacementEvent(0.1, GaussianEvent(5.0, neighbouring="replace_one"))
    manager.spend(wor, label="wor")
    assert manager.neighbouring == "replace_one"
    assert [e.event.neighbouring for e in manager.history()] == ["add_remove", "replace_one"]  # stored as charged
    assert 0 < manager.spent().epsilon < 1.0


def test_an_add_remove_ledger_refuses_replace_one_charges_before_committing() -> None:
    manager = BudgetManager(PrivacyBudget(1.0, 1e-6, neighbouring="add_remove"))
    wor = SampledWithoutReplacementEvent(0.1, GaussianEvent(5.0, neighbouring="replace_one"))
    with pytest.raises(UnsupportedEventError, match="add/remove ledger"):
        manager.spend(wor, label="wor")
    with pytest.raises(UnsupportedEventError):
        manager.would_fit(PureDPEvent(0.1, neighbouring="replace_one"))
    assert manager.history() == []
    manager.spend(PureDPEvent(0.1, neighbouring="add_remove"), label="ok")
    assert manager.spent().epsilon == pytest.approx(0.1, rel=1e-4)  # PLD: pure ε-DP is slightly below ε at δ > 0


@pytest.mark.parametrize("label", ["", "   ", "x" * 201, "bad\nlabel", None, 3])
def test_bad_labels_are_rejected(manager: BudgetManager, label: object) -> None:
    with pytest.raises(ConfigurationError):
        manager.spend(PureDPEvent(0.1, neighbouring="replace_one"), label=label)  # type: ignore[arg-type]
    assert manager.history() == []


def test_non_events_and_unsupported_events_are_rejected(tmp_path: Path) -> None:
    m = BudgetManager(PrivacyBudget(1.0, 1e-6))
    with pytest.raises(ConfigurationError):
        m.spend(0.5, label="x")  # type: ignore[arg-type]
    prv_only = BudgetManager(PrivacyBudget(1.0, 1e-6), accountant="prv")
    with pytest.raises(UnsupportedEventError):
        prv_only.spend(RDPCurveEvent(orders=(2.0,), epsilons=(0.1,), neighbouring="replace_one"), label="x")
    with pytest.raises(ConfigurationError):
        BudgetManager(PrivacyBudget(1.0, 1e-6), accountant="nope")


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(0.0, 1e-6), (-1.0, 1e-6), (math.inf, 1e-6), (math.nan, 1e-6), (1.0, 0.0), (1.0, 1.0), (1.0, -0.1)],
)
def test_bad_budgets_are_rejected(epsilon: float, delta: float) -> None:
    with pytest.raises(ConfigurationError):
        PrivacyBudget(epsilon, delta)


def test_approx_dp_events_spend_delta(manager: BudgetManager) -> None:
    manager.spend(ApproxDPEvent(0.1, 4e-7, neighbouring="replace_one"), label="a")
    manager.spend(ApproxDPEvent(0.1, 4e-7, neighbouring="replace_one"), label="b")
    with pytest.raises(BudgetExhaustedError):  # 1.2e-6 of δ exceeds the budget's 1e-6
        manager.spend(ApproxDPEvent(0.1, 4e-7, neighbouring="replace_one"), label="c")


def test_sqlite_spend_survives_a_restart(ledger_path: Path) -> None:
    first = BudgetManager(PrivacyBudget(2.0, 1e-6), ledger=ledger_path)
    first.spend(PureDPEvent(1.5, neighbouring="replace_one"), label="before-restart")
    first.close()
    second = BudgetManager.open(ledger_path)
    assert second.budget == PrivacyBudget(2.0, 1e-6)
    assert second.spent().epsilon == pytest.approx(1.5, rel=1e-4)
    with pytest.raises(BudgetExhaustedError):
        second.spend(PureDPEvent(1.0, neighbouring="replace_one"), label="after-restart")
    same_budget = BudgetManager(PrivacyBudget(2.0, 1e-6), ledger=ledger_path)
    assert same_budget.spent().epsilon == pytest.approx(1.5, rel=1e-4)
    with pytest.raises(BudgetMismatchError):
        BudgetManager(PrivacyBudget(3.0, 1e-6), ledger=ledger_path)


def test_threads_never_overspend() -> None:
    manager = BudgetManager(PrivacyBudget(4.0, 1e-8))
    successes: list[int] = []

    def worker() -> None:
        for _ in range(10):
            try:
                manager.spend(PureDPEvent(0.25, neighbouring="replace_one"), label="t")
                successes.append(1)
            except BudgetExhaustedError:
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(successes) == 16 == len(manager.history())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=0.7), min_size=1, max_size=25))
def test_pure_dp_charges_never_exceed_the_budget(charges: list[float]) -> None:
    """Property: whatever is attempted, the committed pure-DP charges sum to at most ε (basic composition
    is tight for so few large charges at δ = 1e-12), and each refusal would have overspent."""
    manager = BudgetManager(PrivacyBudget(1.0, 1e-12))
    committed: list[float] = []
    for c in charges:
        try:
            manager.spend(PureDPEvent(c, neighbouring="replace_one"), label="p")
            committed.append(c)
        except BudgetExhaustedError:
            assert sum(map(Fraction, [*committed, c])) > 1  # basic composition alone would admit it otherwise
    assert math.fsum(committed) <= 1.0
    assert manager.spent().epsilon <= 1.0
    assert len(manager.history()) == len(committed)


def test_a_refusal_names_the_relation_conversion_and_a_delta_no_epsilon_can_pay() -> None:
    # a kNN cover refused on an 8.0 ledger said "this charge alone: 7.99996" without naming the conversion that
    # doubled it, and "epsilon would reach inf" where the converted delta was the cause
    ledger = BudgetManager(PrivacyBudget(8.0, 1e-5))
    with pytest.raises(BudgetExhaustedError, match="group privacy over two records: epsilon doubles") as caught:
        ledger.spend(ApproxDPEvent(4.0, 1e-6, neighbouring="add_remove"), label="cover")
    assert "its delta after that conversion is 5.56e-05, above the ledger's 1e-05" in str(caught.value)
    with pytest.raises(BudgetExhaustedError) as caught:
        ledger.spend(ApproxDPEvent(1.0, 2e-5, neighbouring="replace_one"), label="a larger delta than the ledger's")
    assert "its delta is 2e-05, above the ledger's 1e-05" in str(caught.value)
    assert "group privacy" not in str(caught.value)
    with pytest.raises(BudgetExhaustedError) as caught:
        ledger.spend(ApproxDPEvent(9.0, 1e-7, neighbouring="replace_one"), label="plainly too much")
    assert "group privacy" not in str(caught.value) and "above the ledger's" not in str(caught.value)
    assert ledger.history() == []


def test_on_charge_sees_every_committed_entry_once_and_a_failing_watcher_does_not_undo_a_charge(
    manager: BudgetManager, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    stop = manager.on_charge(lambda entry: seen.append(entry.id))
    manager.on_charge(lambda entry: 1 / 0)  # an app's broken audit log
    first = manager.spend(PureDPEvent(0.4, neighbouring="replace_one"), label="a")
    second = manager.spend(PureDPEvent(0.4, neighbouring="replace_one"), label="b")
    with pytest.raises(BudgetExhaustedError):
        manager.spend(
            PureDPEvent(0.4, neighbouring="replace_one"), label="refused"
        )  # nothing committed: nothing reported
    assert seen == [first.id, second.id] == [e.id for e in manager.history()]
    assert "on_charge callback failed" in caplog.text
    stop()
    stop()  # twice is harmless
    manager.spend(PureDPEvent(0.1, neighbouring="replace_one"), label="c")
    assert len(seen) == 2
    with pytest.raises(ConfigurationError, match="callable"):
        manager.on_charge("print")  # type: ignore[arg-type]
