"""Pay as you go (issue 42, item 1): a decoder's share kept on the ledger as an allowance and drawn on one token
mechanism at a time; the ledger admits a draw only while the draws under its cover fit the cover's filter caps.

What must hold: exactly the calibrated number of token mechanisms fit, and not one more; an answer pays for the
mechanisms it ran (not its limit; a token a schema or the choices force is free); a refused draw commits nothing
and stops the answer (or hands it to the public model, which reads no record); the spend survives a restart and
is shared by processes; bad settings are refused before any charge.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from postgres_server import postgres_database_fixture, postgres_server_fixture  # noqa: F401
from test_decoding import Counting, backend, clip, mozo

from dp_icl_plugin import (
    AllowanceSpentError,
    BudgetManager,
    ConfigurationError,
    PrivacyBudget,
)
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.allowance import (
    allowance_budget,
    allowance_label,
    allowance_orders,
    draw_cost,
    epsilon_spent,
)
from dp_icl_plugin.accounting.rdp import rdp_to_epsilon
from dp_icl_plugin.decoding.pay_as_you_go import TokenAllowance, calibrate_per_token

# the decoders' weak-release warning (tiny shares on a fake model) is beside the point here
pytestmark = pytest.mark.filterwarnings("ignore::dp_icl_plugin.errors.WeakReleaseWarning")

LEDGER = PrivacyBudget(8.0, 1e-3)
TOKEN = me.mozo_event(beta=0.05, order=8.0, sampling_rate=0.01, steps=1)  # 160 fit an allowance of ε = 2


def ledger(where: str | Path | None = None) -> BudgetManager:
    return BudgetManager(LEDGER, ledger=where)


def capacity(allowance: TokenAllowance, event: ev.DPEvent) -> int:
    """The most draws of ``event`` the allowance's caps admit (public arithmetic, recomputed here)."""
    cost = draw_cost(event, "replace_one", allowance.filter.orders)
    caps = allowance.filter.caps * (1 - 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_order = np.where(cost > 0, np.floor(caps / cost), np.inf)
    return int(np.max(np.where(np.isfinite(caps), per_order, -1)))


# -- the ledger as a filter -----------------------------------------------------------------------------------
def test_exactly_the_draws_that_fit_the_caps_are_admitted_and_then_none() -> None:
    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    n = capacity(allowance, TOKEN)
    assert n == 160
    for _ in range(n):
        allowance.draw(TOKEN)
    before = m.history()
    with pytest.raises(AllowanceSpentError, match="cannot pay this draw"):
        allowance.draw(TOKEN)
    assert m.history() == before  # nothing committed
    draws, eps = allowance.spent()
    assert draws == n and 1.9 < eps <= 2.0
    # what the ledger certifies: the cover alone, whatever was drawn
    assert 1.99 < m.spent().epsilon <= 2.0


@settings(max_examples=40, deadline=None)
@given(
    betas=st.lists(st.floats(0.005, 0.5), min_size=1, max_size=60),
    epsilon=st.floats(1.5, 6.0),
)
def test_whatever_the_sequence_of_draws_the_admitted_ones_convert_to_the_cover(betas, epsilon) -> None:
    """Property: adaptively mixed per-token events, each admitted or refused; what was admitted always fits the
    cover's (ε, δ) by the filter's conversion (δ split over its orders)."""
    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=epsilon, delta=1e-4)
    spent = np.zeros(len(allowance.filter.orders))
    for beta in betas:
        event = me.mozo_event(beta=beta, order=8.0, sampling_rate=0.01, steps=1)
        try:
            allowance.draw(event)
        except AllowanceSpentError:
            continue
        spent = spent + draw_cost(event, "replace_one", allowance.filter.orders)
    f = allowance.filter
    if spent.any():
        eps, _ = rdp_to_epsilon(f.orders, spent, f.conversion_delta / len(f.orders))
        assert eps <= epsilon * (1 + 1e-9)
    assert allowance.spent()[1] == pytest.approx(epsilon_spent(f, spent))


def test_a_draw_is_refused_against_anything_but_its_allowance_and_commits_nothing() -> None:
    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    first = allowance.draw(TOKEN)
    cover = allowance.cover
    assert cover is not None and first.event.covered_by == cover.id
    draw = ev.FilteredReleaseEvent(TOKEN, cover.id, neighbouring="replace_one")
    before = m.history()
    with pytest.raises(ConfigurationError, match="labelled 'mozo-<kind>:bot'"):
        m.spend(draw, label="mozo-token:another")
    with pytest.raises(ConfigurationError, match="labelled"):
        m.spend(draw, label="clip-blend-token:bot")
    plain = m.spend(ev.ApproxDPEvent(1.0, 1e-4, neighbouring="replace_one"), label="mozo-answer")
    with pytest.raises(ConfigurationError, match="not a filter cover"):  # an entry that is no cover frees nothing
        m.spend(ev.FilteredReleaseEvent(TOKEN, plain.id, neighbouring="replace_one"), label="mozo-token:bot")
    # an allowance cover under the other relation is no allowance of this ledger
    wrong = m.spend(ev.ApproxDPEvent(0.5, 1e-5, neighbouring="add_remove"), label=allowance_label("mozo", "other"))
    with pytest.raises(ConfigurationError, match="under the ledger's relation"):
        m.spend(ev.FilteredReleaseEvent(TOKEN, wrong.id, neighbouring="replace_one"), label="mozo-token:other")
    # a draw with no RDP analysis cannot be checked against the caps
    approx = ev.ApproxDPEvent(0.01, 1e-9, neighbouring="replace_one")
    with pytest.raises(ConfigurationError, match="RDP releases only"):
        m.spend(ev.FilteredReleaseEvent(approx, cover.id, neighbouring="replace_one"), label="mozo-token:bot")
    # a draw may not carry a cover's label (it would pass for one at the next start)
    with pytest.raises(ConfigurationError, match="labelled"):
        m.spend(draw, label=allowance.label)
    assert [e.label for e in m.history()] == [e.label for e in before] + [
        "mozo-answer",
        allowance_label("mozo", "other"),
    ]


def test_a_named_allowance_survives_a_restart_without_a_second_cover(tmp_path: Path) -> None:
    where = tmp_path / "ledger.db"
    first = TokenAllowance(ledger(where), component="mozo", epsilon=2.0, delta=1e-4, name="support-bot")
    n = capacity(first, TOKEN)
    for _ in range(n - 3):
        first.draw(TOKEN)
    again = TokenAllowance(ledger(where), component="mozo", epsilon=2.0, delta=1e-4, name="support-bot")
    assert again.cover is not None and first.cover is not None and again.cover.id == first.cover.id
    for _ in range(3):
        again.draw(TOKEN)
    with pytest.raises(AllowanceSpentError):
        again.draw(TOKEN)
    assert again.spent()[0] == n
    assert BudgetManager.open(where).label_counts()[first.label] == 1
    with pytest.raises(ConfigurationError, match="another budget"):
        TokenAllowance(ledger(where), component="mozo", epsilon=2.5, delta=1e-4, name="support-bot")
    with pytest.raises(ConfigurationError, match="allowance_name"):
        TokenAllowance(ledger(where), component="mozo", epsilon=2.0, delta=1e-4, name="a b")


WORKER = textwrap.dedent(
    """
    import sys, threading
    from dp_icl_plugin import AllowanceSpentError, BudgetManager
    from dp_icl_plugin.accounting import events as ev
    from dp_icl_plugin.accounting import method_events as me
    m = BudgetManager.open(sys.argv[1])
    cover, label = int(sys.argv[2]), sys.argv[3]
    token = me.mozo_event(beta=0.1, order=8.0, sampling_rate=0.01, steps=1)
    draw = ev.FilteredReleaseEvent(token, cover, neighbouring="replace_one")
    done = []
    def work():
        n = 0
        for _ in range(40):
            try:
                m.spend(draw, label=label)
                n += 1
            except AllowanceSpentError:
                pass
        done.append(n)
    threads = [threading.Thread(target=work) for _ in range(3)]
    [t.start() for t in threads]; [t.join() for t in threads]
    print(sum(done))
    """
)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_draws_racing_from_processes_and_threads_admit_exactly_the_allowances_capacity(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The ledger's check, not the decoders' one-at-a-time rule, is what bounds the draws: committed straight to the
    ledger by 4 processes × 3 threads, exactly the capacity is admitted."""
    where: str | Path = request.getfixturevalue("pg_dsn") if store == "postgresql" else tmp_path / "race.db"
    m = ledger(where)
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="shared")
    token = me.mozo_event(beta=0.1, order=8.0, sampling_rate=0.01, steps=1)  # 23 fit
    allowance.draw(token)
    assert allowance.cover is not None
    n = capacity(allowance, token)
    assert n < 4 * 3 * 40 and allowance.draws_left(token) == n - 1
    args = [str(where), str(allowance.cover.id), allowance.draw_label]
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    admitted = 1
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()
        admitted += int(out)
    assert admitted == n
    assert BudgetManager.open(where).label_counts()["mozo-token:shared"] == n


OPENER = textwrap.dedent(
    """
    import sys
    from dp_icl_plugin import BudgetManager, ConfigurationError
    from dp_icl_plugin.decoding.pay_as_you_go import TokenAllowance
    m = BudgetManager.open(sys.argv[1])
    try:
        TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="shared")
    except ConfigurationError as exc:
        print("refused:", exc)
    else:
        print("opened")
    """
)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_named_allowance_is_held_by_one_process_at_a_time(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A second process (another worker, another host) opening the allowance is refused before anything is
    charged; once the first lets it go, it opens."""
    where: str | Path = request.getfixturevalue("pg_dsn") if store == "postgresql" else tmp_path / "lease.db"
    m = ledger(where)
    held = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="shared")

    def other() -> str:
        return subprocess.run(
            [sys.executable, "-c", OPENER, str(where)], capture_output=True, text=True, timeout=120, check=True
        ).stdout

    assert "held by another process" in other()
    assert m.history() == []
    # the same process, another spelling of the same file: the same allowance, no second lease needed
    if store == "sqlite":
        import os

        alias = os.path.relpath(where)
        again = TokenAllowance(ledger(alias), component="mozo", epsilon=2.0, delta=1e-4, name="shared")
        assert again._turns is held._turns
        del again
    held._shared.lease.release()
    assert other().strip() == "opened"


# -- the decoders ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_the_calibrated_share_pays_for_n_queries_answers_of_expected_tokens_and_no_more(make) -> None:
    m = ledger()
    decoder = make(m, pay_per_token=True, n_queries=3, max_tokens=6, epsilon=2.0)
    assert decoder.answers_left is None and decoder.allowance is not None
    token = decoder._steps_event(1)
    assert capacity(decoder.allowance, token) >= 18  # 3 × 6 fit ...
    assert decoder.allowance.epsilon_of(token, 18) <= 2.0
    # ... and the noise is the least that fits: a slightly larger beta / smaller tau does not
    bigger = type(decoder)  # noqa: F841  (the check below is on the event directly)
    if hasattr(decoder, "beta"):
        tighter = me.mozo_event(beta=decoder.beta * 1.001, order=8.0, sampling_rate=decoder.sampling_rate, steps=1)
    else:
        tighter = me.clip_blend_event(
            clip=decoder.clip,
            subset_size=decoder.subset_size,
            temperature=decoder.temperature / 1.001,
            steps=1,
            neighbouring="replace_one",
        )
    assert decoder.allowance.epsilon_of(tighter, 18) > 2.0 or capacity(decoder.allowance, tighter) < 18


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_an_answer_pays_one_draw_per_token_mechanism_it_ran(make) -> None:
    m = ledger()
    decoder = make(m, pay_per_token=True, n_queries=20, max_tokens=30, epsilon=4.0)
    rng = np.random.default_rng(0)
    ran = []
    for _ in range(12):
        answer = decoder.generate("a b", rng=rng)
        # the mechanisms an answer ran: its tokens, plus the end-of-sequence token that ended it
        ran.append(len(answer.token_ids) + (answer.finish_reason == "stop"))
    assert (
        decoder.allowance.spent()[0] == sum(ran) == m.label_counts()[f"{decoder.kind}-token:{decoder.allowance.owner}"]
    )
    assert min(ran) < 30  # some answers ended early: they paid less than their limit
    assert m.label_counts()[decoder.allowance.label] == 1


def test_a_token_the_choices_force_is_free() -> None:
    m = ledger()
    decoder = mozo(m, pay_per_token=True, n_queries=4, max_tokens=3, epsilon=4.0, choices=["a b c", "a b d"])
    decoder.generate("a b", rng=np.random.default_rng(0))
    # "a b" is forced (both choices share it), then one decision
    assert decoder.allowance.spent()[0] == 1


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_a_refused_first_token_refuses_the_answer_before_anything_is_computed(make) -> None:
    m = ledger()
    decoder = make(m, pay_per_token=True, n_queries=1, max_tokens=4, epsilon=1.0)
    rng = np.random.default_rng(0)
    while True:  # spend the allowance
        try:
            decoder.generate("a b", rng=rng)
        except AllowanceSpentError:
            break
    calls, history = Counting.calls, m.history()
    with pytest.raises(AllowanceSpentError):
        decoder.generate("a b", rng=rng)
    assert Counting.calls == calls and m.history() == history


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_when_spent_stop_cuts_the_answer_and_public_goes_on_with_the_zero_shot_greedy_tokens(make) -> None:
    for when in ("stop", "public"):
        m = ledger()
        decoder = make(m, pay_per_token=True, n_queries=1, max_tokens=6, epsilon=1.0, when_spent=when)
        n = capacity(decoder.allowance, decoder._steps_event(1))
        # spend all but 2 draws elsewhere on the same allowance
        decoder.allowance.draw(decoder._steps_event(1))
        for _ in range(n - 3):
            decoder.allowance.draw(decoder._steps_event(1))
        decoder.template = type(decoder.template)(stop=None, stop_at_eos=False)
        answer = decoder.generate("a b", rng=np.random.default_rng(0))
        assert decoder.allowance.spent()[0] == n
        if when == "stop":
            assert len(answer.token_ids) == 2 and answer.finish_reason == "length"
            continue
        assert len(answer.token_ids) == 6
        # the rest is the public model's greedy continuation of the zero-shot prompt and the 2 released tokens
        b = backend()
        ids = decoder._ids("a b", None, reserve=5) + list(answer.token_ids[:2])
        for token in answer.token_ids[2:]:
            row = b.next_token_logprobs([ids])[0]
            assert token == int(np.argmax(row))
            ids.append(token)


def test_bad_per_token_settings_are_refused_before_any_charge() -> None:
    m = ledger()
    cases = [
        ({"when_spent": "public"}, "pay_per_token=True only"),
        ({"allowance_name": "x"}, "pay_per_token=True only"),
        ({"pay_per_token": True, "when_spent": "refund"}, "when_spent must be"),
        ({"pay_per_token": "yes"}, "True or False"),
        ({"pay_per_token": True, "expected_tokens": 9}, "exceeds max_tokens"),
        ({"pay_per_token": True, "expected_tokens": 0}, "expected_tokens"),
        ({"pay_per_token": True, "delta": 1e-3}, "below the ledger's"),
        ({"pay_per_token": True, "allowance_name": "no spaces"}, "allowance_name"),
        ({"pay_per_token": True, "epsilon": None, "beta": 0.1}, "needs epsilon"),
    ]
    for kw, match in cases:
        with pytest.raises(ConfigurationError, match=match):
            mozo(m, **{"max_tokens": 8, **kw})
    assert m.history() == []


def test_per_token_calibration_fits_and_costs_a_little_noise_against_a_fixed_schedule() -> None:
    """DPS-MOZO's allowance is a filter at its one order α (no δ split): at the same number of tokens it gives the
    per-answer calibration's β (which may also try orders below α, so never less); with answers expected at half
    their limit the allowance affords a larger β."""
    from dp_icl_plugin.accounting.calibration import calibrate_mozo

    f = allowance_budget(ev.ApproxDPEvent(2.0, 1e-6, neighbouring="replace_one"), "replace_one", (8.0,))
    per_answer = calibrate_mozo(epsilon=2.0, delta=1e-6, sampling_rate=0.01, steps=4000, order=8.0).value

    def fitted(steps: int) -> float:
        return calibrate_per_token(
            lambda b: me.mozo_event(beta=b, order=8.0, sampling_rate=0.01, steps=1),
            steps=steps,
            filter_budget=f,
            neighbouring="replace_one",
            lo=1e-9,
            hi=100.0,
            find="largest",
        )

    per_token, half = fitted(4000), fitted(2000)
    assert 0.95 * per_answer < per_token <= per_answer * (1 + 1e-6) < half
    assert math.isclose(
        epsilon_spent(
            f,
            4000
            * draw_cost(me.mozo_event(beta=per_token, order=8.0, sampling_rate=0.01, steps=1), "replace_one", f.orders),
        ),
        2.0,
        rel_tol=1e-4,
    )


def test_the_filter_orders_are_written_into_the_covers_label() -> None:
    """The orders are fixed with the cover: a later change of the default cannot change an allowance's filter."""
    from dp_icl_plugin.accounting.individual_filter import FILTER_ORDERS

    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    assert allowance_orders(allowance.label) == FILTER_ORDERS and "@1.5,1.75," in allowance.label
    assert len(allowance_label("clip-blend", "x" * 64)) <= 200
    assert allowance_orders(TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, orders=(8.0,)).label) == (8.0,)


def test_two_objects_of_one_named_allowance_in_a_process_pay_one_cover() -> None:
    m = ledger()
    a = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="replica")
    b = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="replica")
    a.draw(TOKEN)
    b.draw(TOKEN)
    assert m.label_counts()[a.label] == 1 and a.cover == b.cover
    assert a.spent()[0] == b.spent()[0] == 2


def test_a_refused_draws_figures_are_not_capped_at_the_allowance() -> None:
    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    huge = me.mozo_event(beta=5.0, order=8.0, sampling_rate=1.0, steps=1)
    with pytest.raises(AllowanceSpentError) as info:
        allowance.draw(huge)
    assert info.value.requested_epsilon > 10 and info.value.total_epsilon >= info.value.requested_epsilon


def test_per_token_mozo_takes_a_non_integer_order_at_its_floor() -> None:
    m = ledger()
    decoder = mozo(m, pay_per_token=True, n_queries=2, max_tokens=4, epsilon=4.0, order=8.5)
    assert decoder.allowance is not None and allowance_orders(decoder.allowance.label) == (8.0,)
    decoder.generate("a b", rng=np.random.default_rng(0))
    with pytest.raises(ConfigurationError, match="order of at least 2"):
        mozo(m, pay_per_token=True, n_queries=2, max_tokens=4, epsilon=4.0, order=1.5)


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_answers_on_one_allowance_run_one_at_a_time_whole(make) -> None:
    """Where an answer is cut must not depend on how fast another computes: concurrent answers on one allowance
    run one after the other, each whole (its draws contiguous on the ledger), and stream in one piece."""
    import threading

    m = ledger()
    decoder = make(m, pay_per_token=True, n_queries=8, max_tokens=6, epsilon=4.0)
    decoder.template = type(decoder.template)(stop=None, stop_at_eos=False)
    seen: list[str] = []
    m.on_charge(lambda entry: seen.append(threading.current_thread().name))
    assert len(list(decoder.stream("a b", rng=np.random.default_rng(0)))) == 1
    seen.clear()

    def answer(seed: int) -> None:
        decoder.generate("a b", rng=np.random.default_rng(seed))

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    runs = [seen[0]] + [b for a, b in itertools.pairwise(seen) if a != b]
    assert len(seen) == 18 and len(runs) == 3  # each thread's 6 draws in one run


def test_a_batch_larger_than_the_first_draws_left_is_refused_before_any() -> None:
    m = ledger()
    decoder = mozo(m, pay_per_token=True, n_queries=1, max_tokens=4, epsilon=1.0)
    left = decoder.allowance.draws_left(decoder._steps_event(1))
    assert left >= 4
    decoder.check_answers_left(left)
    with pytest.raises(AllowanceSpentError, match="can pay the first token"):
        decoder.check_answers_left(left + 1)
    assert m.history() == []


def test_two_spellings_of_one_ledger_share_one_cover_and_one_queue(tmp_path: Path) -> None:
    import os

    where = tmp_path / "ledger.db"
    a = TokenAllowance(ledger(where), component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    b = TokenAllowance(ledger(os.path.relpath(where)), component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    assert a._turns is b._turns
    a.draw(TOKEN)
    b.draw(TOKEN)
    assert BudgetManager.open(where).label_counts()[a.label] == 1
    # unrelated in-memory ledgers with the same name do not share a queue
    assert TokenAllowance(ledger(), component="mozo", epsilon=2.0, delta=1e-4, name="bot")._turns is not (
        TokenAllowance(ledger(), component="mozo", epsilon=2.0, delta=1e-4, name="bot")._turns
    )


def test_the_same_name_with_other_filter_orders_is_refused_not_paid_twice() -> None:
    m = ledger()
    TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot", orders=(8.0,)).draw(TOKEN)
    with pytest.raises(ConfigurationError, match="other filter orders"):
        TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot", orders=(6.0,))


def test_draws_left_is_the_count_the_ledger_admits() -> None:
    m = ledger()
    allowance = TokenAllowance(m, component="mozo", epsilon=2.0, delta=1e-4, name="bot")
    assert allowance.draws_left(TOKEN) == capacity(allowance, TOKEN) == 160
    for _ in range(37):
        allowance.draw(TOKEN)
    assert allowance.draws_left(TOKEN) == 123
    cheap = me.clip_blend_event(clip=1.0, subset_size=1000, temperature=100.0, steps=1, neighbouring="replace_one")
    assert allowance.draws_left(cheap) > 1_000_000  # in closed form, not one by one


def test_a_turn_left_by_an_interrupt_while_waiting_does_not_block_the_queue() -> None:
    import threading

    from dp_icl_plugin.timing import Turns

    turns = Turns()
    release, entered = threading.Event(), threading.Event()

    def hold() -> None:
        with turns.hold():
            entered.set()
            release.wait(5)

    first = threading.Thread(target=hold)
    first.start()
    entered.wait(5)

    class Interrupt(BaseException):
        pass

    cancelled = threading.Event()

    def interrupted() -> None:  # a waiter whose wait is interrupted (as a KeyboardInterrupt would)
        original = turns._turns.wait

        def wait(timeout=None):
            raise Interrupt

        turns._turns.wait = wait  # type: ignore[method-assign]
        try:
            with turns.hold(cancelled):
                pass
        except Interrupt:
            pass
        finally:
            turns._turns.wait = original  # type: ignore[method-assign]

    interrupted()
    release.set()
    first.join()
    done = threading.Event()
    third = threading.Thread(target=lambda: (turns.hold().__enter__(), done.set()))
    third.start()
    assert done.wait(2)  # served: the interrupted ticket left the queue
