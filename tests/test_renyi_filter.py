"""The individual Rényi filter: caps, admission, exact fit, persistence, process safety."""

from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin import ConfigurationError, GaussianEvent, LedgerError, LedgerFormatError
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost, RenyiFilter
from dp_icl_plugin.accounting.individual_filter import order_caps
from dp_icl_plugin.accounting.rdp import rdp_to_epsilon
from dp_icl_plugin.errors import FilterMismatchError
from dp_icl_plugin.retrieval.retriever import noise_for_uses


def gaussian_cost(sigma: float, budget: IndividualBudget, delta: float = 0.0) -> ReleaseCost:
    return ReleaseCost.of(GaussianEvent(sigma, neighbouring="add_remove"), budget.orders, delta=delta)


def test_caps_convert_back_to_the_target_epsilon_at_each_orders_share_of_delta() -> None:
    b = IndividualBudget(epsilon=1.0, delta=1e-5)
    m = len(b.orders)
    for alpha, cap in zip(b.orders, b.caps, strict=True):
        if math.isfinite(cap):
            eps, _ = rdp_to_epsilon([alpha], np.array([cap]), b.conversion_delta / m)
            assert eps == pytest.approx(1.0, abs=1e-12)
    assert b.approximate_delta == pytest.approx(5e-6)
    assert np.isneginf(order_caps(0.5, 1e-9, (1.5,))).all()  # conversion alone exceeds ε at α = 1.5


@pytest.mark.parametrize("uses", [1, 2, 7])
def test_calibrated_noise_fits_exactly_uses_releases_and_not_one_more(uses: int) -> None:
    b = IndividualBudget(epsilon=2.0, delta=1e-6, approximate_delta=0.0)
    sigma = noise_for_uses(b, uses=uses, sensitivity=math.sqrt(2))
    f = RenyiFilter(b)
    cost = ReleaseCost.of(
        GaussianEvent(sigma / math.sqrt(2), sensitivity=math.sqrt(2), neighbouring="add_remove"), b.orders
    )
    units = np.arange(3)
    for _ in range(uses):
        assert f.charge(units, cost).all()
    assert not f.charge(units, cost).any()
    # A slightly smaller σ would not have allowed the last use: the calibration is tight.
    tighter = ReleaseCost.of(GaussianEvent(sigma * 0.999 / math.sqrt(2), neighbouring="add_remove"), b.orders)
    g = RenyiFilter(b)
    assert sum(bool(g.charge(units[:1], tighter)[0]) for _ in range(uses + 1)) == uses - 1


@settings(max_examples=60, deadline=None)
@given(
    sigmas=st.lists(st.floats(0.3, 20.0), min_size=1, max_size=25),
    deltas=st.lists(st.sampled_from([0.0, 1e-7, 3e-7]), min_size=25, max_size=25),
    who=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True), min_size=25, max_size=25),
)
def test_the_filter_never_admits_a_unit_past_its_budget(sigmas, deltas, who) -> None:
    b = IndividualBudget(epsilon=1.5, delta=1e-5, approximate_delta=1e-6)
    f = RenyiFilter(b)
    for sigma, d, units in zip(sigmas, deltas, who, strict=False):
        ids = np.asarray(units)
        before, _ = f.spent(ids)
        admitted = f.charge(ids, gaussian_cost(sigma, b, d))
        after, after_d = f.spent(ids)
        # Refused units pay nothing; admitted units pay exactly the cost.
        np.testing.assert_array_equal(after[~admitted], before[~admitted])
        np.testing.assert_allclose(
            after[admitted] - before[admitted], np.broadcast_to(gaussian_cost(sigma, b).rdp, after[admitted].shape)
        )
        # Every unit stays within its cap at some order and within its approximate δ.
        fits = (after <= b.caps * (1 + 1e-12)).any(axis=1) | (after.sum(axis=1) == 0)
        assert fits.all()
        assert (after_d <= b.approximate_delta * (1 + 1e-12)).all()
        # Its (ε, δ) loss so far never exceeds the budget.
        assert (f.epsilon_spent(ids) <= b.epsilon + 1e-9).all()


def test_a_release_needing_approximate_delta_is_refused_without_a_share() -> None:
    b = IndividualBudget(epsilon=1.0, delta=1e-5, approximate_delta=0.0)
    f = RenyiFilter(b)
    assert not f.charge(np.array([0]), gaussian_cost(5.0, b, delta=1e-9)).any()
    assert f.spent(np.array([0]))[0].sum() == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0.0, "delta": 1e-5}, "epsilon"),
        ({"epsilon": 1.0, "delta": 1.0}, "delta"),
        ({"epsilon": 1.0, "delta": 1e-5, "approximate_delta": 1e-5}, "approximate_delta"),
        ({"epsilon": 1.0, "delta": 1e-5, "orders": (1.0,)}, "order"),
        ({"epsilon": 1e-4, "delta": 1e-12}, "too small"),
    ],
)
def test_bad_budgets_are_refused(kwargs, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        IndividualBudget(**kwargs)


def test_bad_charges_are_refused_before_anything_is_charged() -> None:
    b = IndividualBudget(epsilon=1.0, delta=1e-5)
    f = RenyiFilter(b)
    cost = gaussian_cost(3.0, b)
    for units in (np.array([1, 1]), np.array([-1]), np.array([[1]]), np.array([0.5])):
        with pytest.raises(ConfigurationError):
            f.charge(units, cost)
    with pytest.raises(ConfigurationError):
        f.charge(np.array([1, 2]), [cost])
    with pytest.raises(ConfigurationError):
        f.charge(np.array([1]), ReleaseCost(np.full(3, 0.1)))
    assert len(f.all_spent()[0]) == 0


def test_sqlite_filter_persists_and_refuses_foreign_or_mismatched_files(tmp_path: Path) -> None:
    b = IndividualBudget(epsilon=1.0, delta=1e-5)
    path = tmp_path / "filter.sqlite"
    f = RenyiFilter(b, path=path, owner="index-a")
    f.charge(np.array([3, 7]), gaussian_cost(4.0, b, delta=1e-7))
    spent, spent_delta = f.spent(np.array([3, 7, 9]))
    f.close()
    g = RenyiFilter(path=path, owner="index-a")
    assert g.budget == b
    again, again_delta = g.spent(np.array([3, 7, 9]))
    np.testing.assert_array_equal(again, spent)
    np.testing.assert_array_equal(again_delta, spent_delta)
    assert again[2].sum() == 0
    with pytest.raises(FilterMismatchError, match="another index"):
        RenyiFilter(path=path, owner="index-b")
    with pytest.raises(FilterMismatchError, match="epsilon"):
        RenyiFilter(IndividualBudget(epsilon=2.0, delta=1e-5), path=path, owner="index-a")
    with pytest.raises(LedgerError, match="no filter"):
        RenyiFilter(path=tmp_path / "missing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all, just bytes")
    with pytest.raises(LedgerFormatError):
        RenyiFilter(path=junk)
    with pytest.raises(ConfigurationError, match="another owner"):  # a second live filter for index-a
        g.copy_to(tmp_path / "copy.sqlite", owner="index-a")
    copy = g.copy_to(tmp_path / "copy.sqlite", owner="index-b")
    np.testing.assert_array_equal(copy.spent(np.array([3, 7]))[0], spent[:2])
    with pytest.raises(ConfigurationError, match="only an in-memory"):
        g.move_to(tmp_path / "moved.sqlite")


def _hammer(path: str, rounds: int, queue) -> None:
    f = RenyiFilter(path=path, owner="shared")
    cost = ReleaseCost.of(GaussianEvent(6.0, neighbouring="add_remove"), f.budget.orders)
    admitted = 0
    for _ in range(rounds):
        admitted += int(f.charge(np.arange(4), cost).sum())
    queue.put(admitted)


def test_processes_sharing_a_filter_file_admit_exactly_what_fits(tmp_path: Path) -> None:
    b = IndividualBudget(epsilon=2.0, delta=1e-5, approximate_delta=0.0)
    path = tmp_path / "filter.sqlite"
    RenyiFilter(b, path=path, owner="shared").close()
    single = RenyiFilter(b)
    cost = ReleaseCost.of(GaussianEvent(6.0, neighbouring="add_remove"), b.orders)
    fits = 0
    while single.charge(np.array([0]), cost)[0]:
        fits += 1
    assert fits >= 2
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_hammer, args=(str(path), fits, queue)) for _ in range(3)]
    for w in workers:
        w.start()
    totals = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    assert sum(totals) == 4 * fits  # each of the 4 units admitted exactly `fits` times, across processes


def test_a_spend_a_rounding_step_past_the_cap_is_refused() -> None:
    """The filter keeps a relative margin below each cap for the float sums (issue 27: a 1e-12 slack *above*
    the cap admitted spend past it)."""
    from dp_icl_plugin.accounting.individual_filter import admissible

    budget = IndividualBudget(epsilon=2.0, delta=1e-5)
    caps = budget.caps
    best = int(np.nanargmax(np.where(np.isfinite(caps), caps, -np.inf)))
    spent = np.zeros((1, len(caps)))
    over = np.full(len(caps), np.inf)
    over[best] = caps[best] * (1 + 5e-13)  # past the cap by less than the old slack
    assert not admissible(budget, spent, np.zeros(1), over, 0.0)[0]
    under = np.full(len(caps), np.inf)
    under[best] = caps[best] * (1 - 2e-9)  # what noise_for_uses leaves: still fits
    assert admissible(budget, spent, np.zeros(1), under, 0.0)[0]


def test_a_move_that_fails_half_way_leaves_no_second_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing the units' spend into the new file failed after its budget was written: that file (same owner, zero
    spend) stayed at the path beside the live in-memory filter, two live filters for the same units (review of
    issue 30). The copy is now written under a private name and renamed into place only when whole."""
    from dp_icl_plugin.accounting.stores import filter_sqlite

    b = IndividualBudget(epsilon=1.0, delta=1e-5)
    f = RenyiFilter(b, owner="index-a")
    cost = gaussian_cost(10.0, b, delta=0.0)
    charges = 0
    while f.charge(np.array([1]), cost)[0]:  # unit 1 spends its whole budget
        charges += 1
    assert charges > 1

    def broken(self: object, *args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(filter_sqlite.SQLiteFilterStore, "_write", broken)
    with pytest.raises(OSError, match="disk full"):
        f.move_to(tmp_path / "moved.sqlite")
    assert list(tmp_path.iterdir()) == []  # no file, no partial file, no journal
    assert not f.charge(np.array([1]), cost)[0]  # the in-memory filter is still the only one, and still refuses 1
    monkeypatch.undo()
    moved = f.move_to(tmp_path / "moved.sqlite")
    assert not moved.charge(np.array([1]), cost)[0] and moved.charge(np.array([2]), cost)[0]


def test_move_to_writes_a_file_never_a_database(tmp_path: Path) -> None:
    f = RenyiFilter(IndividualBudget(epsilon=1.0, delta=1e-5), owner="index-a")
    with pytest.raises(ConfigurationError, match="filter file") as caught:
        f.move_to("postgresql://user:s3cret@db.example/dp")
    assert "s3cret" not in str(caught.value)
