"""Accountants: the shared contract, exact special cases, and the tightest-of-all accountant."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import binom, norm

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import (
    DELTA_SPLITS,
    Accountant,
    BasicAccountant,
    PRVAccountant,
    RDPAccountant,
    TightestAccountant,
    get_accountant,
)
from dp_icl_plugin.errors import ConfigurationError, UnsupportedEventError


@dataclass(frozen=True)
class _Opaque(ev.DPEvent):
    """An event no accountant can analyse (unregistered: empty type_name)."""

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset()


G = ev.GaussianEvent(2.0, neighbouring="add_remove")
POISSON = ev.PoissonSampledEvent(0.01, ev.GaussianEvent(1.0, neighbouring="add_remove"), neighbouring="add_remove")
PURE = ev.PureDPEvent(0.3, neighbouring="add_remove")
APPROX = ev.ApproxDPEvent(0.3, 1e-7, neighbouring="add_remove")
EXPMECH = ev.ExponentialMechanismEvent(0.5, neighbouring="add_remove")
CURVE = ev.RDPCurveEvent((2.0, 8.0, 32.0), (0.05, 0.3, 1.5), neighbouring="add_remove")
MOZO = me.mozo_event(beta=0.081, order=14, sampling_rate=4 / 14732, steps=50)
ADADPSYN_TOKEN = me.adadpsyn_event(sigma0=10.0, sigma1=1.23, sigma2=3.0, sampling_rate=20 / 30000, steps=1, t_hat=1)

SUPPORTED = {
    "basic": [PURE, APPROX, EXPMECH],
    "rdp": [G, POISSON, PURE, EXPMECH, CURVE, MOZO, ADADPSYN_TOKEN],
    "prv": [G, POISSON, PURE, APPROX, EXPMECH],
    "auto": [G, POISSON, PURE, APPROX, EXPMECH, CURVE, MOZO],
}
UNSUPPORTED = {
    "basic": [G, POISSON, CURVE, MOZO],
    "rdp": [APPROX, ev.ComposedEvent((PURE, APPROX))],
    "prv": [CURVE, MOZO, ev.MozoTokenEvent(0.1, 4)],
    "auto": [_Opaque(neighbouring="add_remove"), ev.ComposedEvent((PURE, _Opaque(neighbouring="add_remove")))],
}
# A representative supported event per accountant for the monotonicity contracts (cheap under PRV).
REPRESENTATIVE = {
    "basic": ev.ApproxDPEvent(0.2, 1e-8, neighbouring="add_remove"),
    "rdp": POISSON,
    "prv": POISSON,
    "auto": POISSON,
}
NAMES = ["basic", "rdp", "prv", "auto"]


def _pairs(table: dict[str, list[ev.DPEvent]]) -> list:
    return [
        pytest.param(name, e, id=f"{name}-{type(e).__name__}-{i}") for name in NAMES for i, e in enumerate(table[name])
    ]


# ---------------------------------------------------------------------------------------------------------
# The contract every accountant meets
# ---------------------------------------------------------------------------------------------------------


def test_get_accountant() -> None:
    assert isinstance(get_accountant(), TightestAccountant)
    assert get_accountant("auto") is get_accountant()
    assert isinstance(get_accountant("basic"), BasicAccountant)
    assert isinstance(get_accountant("rdp"), RDPAccountant)
    assert isinstance(get_accountant("prv"), PRVAccountant)
    mine = RDPAccountant()
    assert get_accountant(mine) is mine
    for name in NAMES:
        assert get_accountant(name).name == name
    with pytest.raises(ConfigurationError):
        get_accountant("moments")


@pytest.mark.parametrize(("name", "event"), _pairs(SUPPORTED))
def test_epsilon_finite_and_positive_for_supported_events(name: str, event: ev.DPEvent) -> None:
    acc = get_accountant(name)
    assert acc.supports(event)
    eps = acc.epsilon(event, delta=1e-5)
    assert isinstance(eps, float)
    assert 0 < eps < math.inf
    # Same answer twice (cached or not) and through the composite forms.
    assert acc.epsilon(event, delta=1e-5) == eps
    assert acc.epsilon(ev.ComposedEvent((event,)), delta=1e-5) == eps


@pytest.mark.parametrize(("name", "event"), _pairs(UNSUPPORTED))
def test_unsupported_event_raises(name: str, event: ev.DPEvent) -> None:
    acc = get_accountant(name)
    assert not acc.supports(event)
    with pytest.raises(UnsupportedEventError):
        acc.epsilon(event, delta=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, math.nan, math.inf, True, "1e-5", None])
def test_bad_delta_raises(name: str, delta) -> None:
    with pytest.raises(ConfigurationError):
        get_accountant(name).epsilon(REPRESENTATIVE[name], delta=delta)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("not_an_event", [None, 1.0, {"type": "pure_dp", "epsilon": 1.0}])
def test_non_event_raises(name: str, not_an_event) -> None:
    with pytest.raises(ConfigurationError):
        get_accountant(name).epsilon(not_an_event, delta=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_epsilon_non_increasing_in_delta(name: str) -> None:
    acc = get_accountant(name)
    deltas = [1e-9, 1e-7, 1e-5, 1e-3, 0.1]
    eps = [acc.epsilon(REPRESENTATIVE[name], delta=d) for d in deltas]
    assert all(a >= b for a, b in pairwise(eps)), eps


@pytest.mark.parametrize("name", NAMES)
def test_epsilon_non_decreasing_in_composition_count(name: str) -> None:
    acc = get_accountant(name)
    event = REPRESENTATIVE[name]
    counts = [1, 3, 10, 30]
    eps = [acc.epsilon(ev.SelfComposedEvent(event, n), delta=1e-5) for n in counts]
    assert all(a <= b for a, b in pairwise(eps)), eps
    assert eps[-1] > eps[0]


@pytest.mark.parametrize("name", NAMES)
def test_composite_forms_agree(name: str) -> None:
    """An event's ε depends on its multiset of atoms only, not on how the composition is written."""
    acc = get_accountant(name)
    e = REPRESENTATIVE[name]
    forms = [
        ev.SelfComposedEvent(e, 4),
        ev.ComposedEvent((e, e, e, e)),
        ev.ComposedEvent((ev.SelfComposedEvent(e, 2), ev.ComposedEvent((e, e)))),
        ev.compose(e, e, e, e),
    ]
    values = {acc.epsilon(f, delta=1e-5) for f in forms}
    assert len(values) == 1


def test_accountant_constructor_validation() -> None:
    with pytest.raises(ConfigurationError):
        RDPAccountant(orders=())
    with pytest.raises(ConfigurationError):
        RDPAccountant(orders=(1.0, 2.0))
    with pytest.raises(ConfigurationError):
        PRVAccountant(eps_error=0.0)
    with pytest.raises(ConfigurationError):
        PRVAccountant(delta_error=1.0)
    assert isinstance(BasicAccountant(), Accountant)


# ---------------------------------------------------------------------------------------------------------
# Basic composition is exact
# ---------------------------------------------------------------------------------------------------------


def up(exact: Fraction) -> float:
    """The smallest float ≥ ``exact``: the tightest total basic composition may report."""
    nearest = float(exact)
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < exact else nearest


def test_basic_ten_pure_tenths_is_the_smallest_float_above_their_sum() -> None:
    basic = get_accountant("basic")
    exact = 10 * Fraction(0.1)  # the float 0.1 is a little above 1/10, so ten of them are above 1
    assert exact > 1 and float(exact) == 1.0  # round-to-nearest would report 1.0, below the total
    for event in (
        ev.SelfComposedEvent(ev.PureDPEvent(0.1, neighbouring="add_remove"), 10),
        ev.ComposedEvent((ev.PureDPEvent(0.1, neighbouring="add_remove"),) * 10),
    ):
        assert basic.epsilon(event, delta=1e-5) == math.nextafter(1.0, math.inf)
    assert sum([0.1] * 10) != 1.0  # naive float summation would not be exact either


def test_basic_sums_exactly_rounds_up_and_respects_delta() -> None:
    basic = BasicAccountant()
    event = ev.compose(
        ev.SelfComposedEvent(ev.ApproxDPEvent(0.1, 1e-6, neighbouring="add_remove"), 7),
        ev.PureDPEvent(0.2, neighbouring="add_remove"),
        ev.ExponentialMechanismEvent(0.3, neighbouring="add_remove"),
    )
    expected_eps = up(7 * Fraction(0.1) + Fraction(0.2) + Fraction(0.3))
    used_delta = up(7 * Fraction(1e-6))
    assert basic.epsilon(event, delta=1e-5) == expected_eps
    assert basic.epsilon(event, delta=used_delta) == expected_eps
    assert basic.epsilon(event, delta=math.nextafter(used_delta, 0.0)) == math.inf


def test_basic_composition_never_reports_less_than_the_exact_sum_pinned() -> None:
    """Regression (issue 27, defect 3): the sums were rounded to the nearest float, which can be below them.

    1 + 2⁻⁵³ lies halfway between 1 and the next float and rounds (to even) to 1; so does 0.5 + 2⁻⁵⁴ to 0.5.
    """
    basic = BasicAccountant()
    pure = ev.compose(
        ev.PureDPEvent(1.0, neighbouring="add_remove"), ev.PureDPEvent(2.0**-53, neighbouring="add_remove")
    )
    assert basic.epsilon(pure, delta=1e-5) == math.nextafter(1.0, math.inf)  # was 1.0
    approx = ev.compose(
        ev.ApproxDPEvent(0.1, 0.5, neighbouring="add_remove"),
        ev.ApproxDPEvent(0.1, 2.0**-54, neighbouring="add_remove"),
    )
    assert basic.epsilon(approx, delta=0.5) == math.inf  # δ used is 0.5 + 2⁻⁵⁴ > 0.5; was reported at δ = 0.5
    assert basic.epsilon(approx, delta=math.nextafter(0.5, 1.0)) == up(Fraction(0.2))
    # So a basic-composition ledger no longer admits 1 + 2⁻⁵³ into a budget of 1.
    from dp_icl_plugin import BudgetExhaustedError, BudgetManager, PrivacyBudget

    ledger = BudgetManager(PrivacyBudget(1.0, 1e-6), accountant="basic")
    ledger.spend(ev.PureDPEvent(1.0, neighbouring="replace_one"), label="a")
    with pytest.raises(BudgetExhaustedError):
        ledger.spend(ev.PureDPEvent(2.0**-53, neighbouring="replace_one"), label="b")


# Floats of every magnitude, with the tiny and the huge side by side (where rounding loses the most).
POSITIVE = st.one_of(
    st.floats(min_value=1e-300, max_value=1e300, allow_subnormal=False),
    st.floats(min_value=1e-20, max_value=10.0),
    st.sampled_from([0.1, 0.2, 0.3, 1.0, 2.0**-53, 2.0**-54, 1.0 + 2.0**-52]),
)
DELTAS = st.one_of(
    st.floats(min_value=1e-300, max_value=1e-3, allow_subnormal=False), st.sampled_from([1e-3, 2.0**-60, 1e-6])
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(POSITIVE, st.integers(1, 1000)), min_size=1, max_size=12))
def test_basic_epsilon_is_never_below_the_exact_sum(terms: list[tuple[float, int]]) -> None:
    event = ev.compose(*(ev.SelfComposedEvent(ev.PureDPEvent(e, neighbouring="add_remove"), n) for e, n in terms))
    exact = sum((n * Fraction(e) for e, n in terms), Fraction(0))
    reported = BasicAccountant().epsilon(event, delta=1e-5)
    assert reported == up(exact) if exact <= Fraction(sys.float_info.max) else reported == math.inf
    assert reported >= exact


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(DELTAS, st.integers(1, 50)), min_size=1, max_size=12))
def test_basic_reports_epsilon_only_at_a_delta_covering_the_exact_sum(terms: list[tuple[float, int]]) -> None:
    event = ev.compose(
        *(ev.SelfComposedEvent(ev.ApproxDPEvent(0.5, d, neighbouring="add_remove"), n) for d, n in terms)
    )
    exact = sum((n * Fraction(d) for d, n in terms), Fraction(0))
    assert exact < 1
    basic = BasicAccountant()
    for delta in {float(exact), math.nextafter(float(exact), 1.0), math.nextafter(float(exact), 0.0)}:
        if 0 < delta < 1:
            assert (basic.epsilon(event, delta=delta) < math.inf) == (exact <= Fraction(delta))


@settings(max_examples=300, deadline=None)
@given(st.lists(POSITIVE, min_size=1, max_size=6))
def test_adding_up_bounds_is_never_below_the_exact_sum(terms: list[float]) -> None:
    from dp_icl_plugin.accounting.accountants import add_up

    exact = sum(map(Fraction, terms), Fraction(0))
    total = add_up(*terms)
    assert total >= exact and (total == up(exact) or total == math.inf)
    assert add_up(*terms, math.inf) == math.inf


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=1e-300, max_value=1.0, exclude_max=True, allow_subnormal=False),
    st.sampled_from(DELTA_SPLITS),
    DELTAS,
)
def test_splits_of_delta_never_hand_out_more_than_delta(delta: float, share: float, used: float) -> None:
    from dp_icl_plugin.accounting.accountants import left_over, split_delta

    first, rest = split_delta(delta, share)
    assert first > 0 and rest > 0 and Fraction(first) + Fraction(rest) <= Fraction(delta)
    if used < delta:
        left = left_over(delta, used)
        assert left > 0 and Fraction(used) + Fraction(left) <= Fraction(delta)


class _SpyAccountant(TightestAccountant):
    """Records the δ each part of a split composition is analysed at."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[frozenset[ev.DPEvent], float]] = []

    def _cached(self, atoms, delta):  # type: ignore[no-untyped-def]
        self.calls.append((frozenset(atoms), delta))
        return super()._cached(atoms, delta)


@pytest.mark.parametrize("delta", [1e-5, 1e-6, 1e-4, 3e-7])
def test_the_tightest_accountant_splits_delta_without_exceeding_it(delta: float) -> None:
    """Regression (issue 27, defect 3): the parts of a split got share·δ and (1 − share)·δ, each rounded to
    nearest (together up to an ulp above δ), and an (ε, δ_a) part left δ − δ_a rounded to nearest."""
    poisson = ev.PoissonSampledEvent(0.01, ev.GaussianEvent(1.0, neighbouring="add_remove"), neighbouring="replace_one")
    mozo = set(ev.atoms(MOZO))
    tiny = ev.ApproxDPEvent(0.5, 1e-30, neighbouring="replace_one")  # δ − 1e-30 rounds to nearest as δ itself
    for first_part in (poisson, tiny):
        spy = _SpyAccountant()
        assert spy.epsilon(ev.compose(first_part, MOZO), delta=delta) < math.inf
        first = [d for atoms, d in spy.calls if atoms == {first_part}]
        rest = [d for atoms, d in spy.calls if atoms == mozo]
        if first_part is tiny:  # first the (ε, δ) part by basic composition, the rest at the δ left
            assert Fraction(tiny.delta) + Fraction(rest.pop(0)) <= Fraction(delta)
        assert len(first) == len(rest) == len(DELTA_SPLITS)
        assert all(Fraction(a) + Fraction(b) <= Fraction(delta) for a, b in zip(first, rest, strict=True))


# ---------------------------------------------------------------------------------------------------------
# Validity and tightness against exact answers
# ---------------------------------------------------------------------------------------------------------


def _exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε of the Gaussian mechanism with sensitivity 1 and std σ (Balle & Wang 2018, Theorem 8)."""

    def excess(eps: float) -> float:
        return (
            norm.cdf(-eps * sigma + 1 / (2 * sigma)) - math.exp(eps) * norm.cdf(-eps * sigma - 1 / (2 * sigma)) - delta
        )

    return brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize(("sigma", "count"), [(2.0, 10), (1.0, 1)])
def test_gaussian_composition_against_exact_answer(sigma: float, count: int) -> None:
    # count Gaussians with multiplier σ compose exactly to one Gaussian with multiplier σ/√count.
    delta = 1e-5
    exact = _exact_gaussian_epsilon(sigma / math.sqrt(count), delta)
    event = ev.SelfComposedEvent(ev.GaussianEvent(sigma, neighbouring="add_remove"), count)
    prv_eps = get_accountant("prv").epsilon(event, delta=delta)
    rdp_eps = get_accountant("rdp").epsilon(event, delta=delta)
    pld_eps = get_accountant("pld").epsilon(event, delta=delta)
    assert exact <= prv_eps <= exact + 0.02
    assert exact <= pld_eps <= exact + 0.005  # pessimistic PLD: an upper bound, close at interval 1e-3
    assert exact <= rdp_eps
    assert get_accountant("auto").epsilon(event, delta=delta) == min(pld_eps, rdp_eps)


def test_rdp_of_pure_dp_is_a_valid_bound() -> None:
    # One ε-DP step at small δ: nothing valid can be below the exact ε of randomized response.
    eps = 1.0
    delta = 1e-6
    p = math.exp(eps) / (1 + math.exp(eps))
    exact = eps + math.log1p(-delta / p)  # δ(ε') = p(1 − e^{ε' − ε}) for ε' < ε
    assert get_accountant("rdp").epsilon(ev.PureDPEvent(eps, neighbouring="add_remove"), delta=delta) >= exact
    assert get_accountant("prv").epsilon(ev.PureDPEvent(eps, neighbouring="add_remove"), delta=delta) >= exact


def _exact_randomized_response_composition(eps0: float, steps: int, delta: float) -> float:
    """Optimal ε of ``steps`` compositions of ε0-randomized response (Kairouz et al. 2015)."""
    k = np.arange(steps + 1)
    pk = binom.pmf(k, steps, 1.0 / (1.0 + math.exp(eps0)))
    loss = eps0 * (steps - 2 * k)

    def excess(eps: float) -> float:
        return float(np.sum(pk * np.maximum(0.0, -np.expm1(eps - loss)))) - delta

    return brentq(excess, 0.0, steps * eps0, xtol=1e-12) if excess(0.0) > 0 else 0.0


# (event, a valid lower bound on its ε at δ = 1e-5): ε0-randomized response is ε0-DP, and ε0/2-randomized
# response is ε0-bounded-range (its log-ratios are ±ε0/2), so no valid analysis may report less.
LOWER_BOUNDED = [
    pytest.param(ev.PureDPEvent(1.0, neighbouring="add_remove"), 64, 1.0, id="pure-1x64"),
    pytest.param(ev.PureDPEvent(8.0, neighbouring="add_remove"), 8, 8.0, id="pure-8x8"),
    pytest.param(ev.PureDPEvent(3.0, neighbouring="add_remove"), 64, 3.0, id="pure-3x64"),
    pytest.param(ev.ApproxDPEvent(8.0, 1e-8, neighbouring="add_remove"), 8, 8.0, id="approx-8x8"),
    pytest.param(ev.ExponentialMechanismEvent(15.0, neighbouring="add_remove"), 8, 7.5, id="expmech-15x8"),
    pytest.param(ev.ExponentialMechanismEvent(3.0, neighbouring="add_remove"), 64, 1.5, id="expmech-3x64"),
]


@pytest.mark.parametrize(("atom", "steps", "rr_eps"), LOWER_BOUNDED)
def test_no_accountant_reports_less_than_the_exact_randomized_response(atom, steps: int, rr_eps: float) -> None:
    delta = 1e-5
    event = ev.SelfComposedEvent(atom, steps)
    lower_bound = _exact_randomized_response_composition(rr_eps, steps, delta)
    for name in NAMES:
        acc = get_accountant(name)
        if acc.supports(event):
            assert acc.epsilon(event, delta=delta) >= lower_bound - 1e-9, name


def test_rdp_best_order() -> None:
    acc = RDPAccountant()
    event = ev.SelfComposedEvent(POISSON, 100)
    best = acc.best_order(event, delta=1e-5)
    assert best in acc.orders
    restricted = RDPAccountant(orders=(best,))
    assert restricted.epsilon(event, delta=1e-5) == pytest.approx(acc.epsilon(event, delta=1e-5), rel=1e-12)


# ---------------------------------------------------------------------------------------------------------
# The tightest accountant
# ---------------------------------------------------------------------------------------------------------

AUTO_EVENTS = [
    ev.SelfComposedEvent(ev.PureDPEvent(0.1, neighbouring="add_remove"), 10),
    ev.SelfComposedEvent(POISSON, 20),
    ev.SelfComposedEvent(ev.ExponentialMechanismEvent(0.2, neighbouring="add_remove"), 50),
    ev.SelfComposedEvent(ev.GaussianEvent(3.0, neighbouring="add_remove"), 5),
    ev.SelfComposedEvent(ev.ApproxDPEvent(0.2, 1e-8, neighbouring="add_remove"), 5),
    ev.compose(
        ev.PureDPEvent(0.5, neighbouring="add_remove"),
        ev.SelfComposedEvent(ev.GaussianEvent(4.0, neighbouring="add_remove"), 3),
    ),
    MOZO,
    CURVE,
]


@pytest.mark.parametrize("event", AUTO_EVENTS, ids=lambda e: ev.event_key(e)[:60])
def test_auto_is_the_minimum_of_its_members(event: ev.DPEvent) -> None:
    auto = get_accountant("auto")
    assert isinstance(auto, TightestAccountant)
    delta = 1e-5
    per_member = auto.epsilons(event, delta=delta)
    assert set(per_member) == {m.name for m in auto.members if m.supports(event)}
    assert per_member  # something supports it
    eps = auto.epsilon(event, delta=delta)
    # Every candidate is a valid bound: the members' ε and, where PRV applies, its coarse certified upper bound.
    candidates = list(per_member.values())
    prv_member = next((m for m in auto.members if isinstance(m, PRVAccountant)), None)
    if prv_member is not None and prv_member.supports(event):
        lower, upper = prv_member.coarse_bounds(ev.atoms(event), delta)
        assert lower <= per_member["prv"] + 1e-12
        candidates.append(upper)
    assert eps == min(candidates)
    assert eps <= min(per_member.values())
    for name in per_member:
        assert eps <= get_accountant(name).epsilon(event, delta=delta)
    assert auto.fits(event, epsilon=eps, delta=delta)
    assert not auto.fits(event, epsilon=eps * (1 - 1e-9), delta=delta)


def _hybrid(approx_delta: float) -> ev.DPEvent:
    return ev.compose(ev.ApproxDPEvent(0.5, approx_delta, neighbouring="replace_one"), MOZO)


def test_auto_handles_approx_dp_next_to_rdp_only_events() -> None:
    delta = 1 / 14732
    event = _hybrid(1e-6)
    assert event.supported_accountants == frozenset()
    for name in ("basic", "rdp", "prv"):
        with pytest.raises(UnsupportedEventError):
            get_accountant(name).epsilon(event, delta=delta)
    auto = get_accountant("auto")
    assert auto.supports(event)
    eps = auto.epsilon(event, delta=delta)
    assert 0.5 < eps < math.inf
    # Basic composition of the (ε, δ) part with the RDP part at the δ left over, or better.
    assert eps <= 0.5 + get_accountant("rdp").epsilon(MOZO, delta=delta - 1e-6) * (1 + 1e-12)
    assert auto.fits(event, epsilon=eps, delta=delta)
    # No δ left for the RDP part: no finite bound.
    assert auto.epsilon(_hybrid(delta), delta=delta) == math.inf
    assert auto.epsilon(_hybrid(0.5), delta=delta) == math.inf


def test_auto_hybrid_with_pure_and_gaussian_atoms() -> None:
    # Pure-DP and Gaussian atoms (RDP-capable) go with the RDP part; ApproxDP is charged by basic composition.
    extra = ev.compose(
        ev.PureDPEvent(0.05, neighbouring="replace_one"), ev.GaussianEvent(20.0, neighbouring="replace_one")
    )
    event = ev.compose(_hybrid(1e-7), extra)
    delta = 1e-4
    expected = 0.5 + get_accountant("rdp").epsilon(ev.compose(MOZO, extra), delta=delta - 1e-7)
    assert get_accountant("auto").epsilon(event, delta=delta) <= expected * (1 + 1e-12)


def test_auto_with_custom_members() -> None:
    only_basic = TightestAccountant(members=(BasicAccountant(),))
    ten_tenths = ev.SelfComposedEvent(ev.PureDPEvent(0.1, neighbouring="add_remove"), 10)
    assert only_basic.epsilon(ten_tenths, delta=1e-5) == math.nextafter(1.0, math.inf)  # ten floats 0.1 exceed 1
    with pytest.raises(UnsupportedEventError):
        only_basic.epsilon(G, delta=1e-5)


@given(
    st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
    st.floats(min_value=1e-300, max_value=1e-2, allow_nan=False),
)
def test_group_privacy_delta_is_never_below_the_exact_value(epsilon: float, delta: float) -> None:
    """(1 + e^ε)·δ computed in floats rounds to nearest (issue 27): it is now rounded up, ≥ the exact value."""
    from decimal import Decimal, getcontext

    from dp_icl_plugin.accounting.conversion import group_of_two_delta

    getcontext().prec = 60
    exact = (1 + Decimal(epsilon).exp()) * Decimal(delta)
    assert Decimal(group_of_two_delta(epsilon, delta)) >= exact


def test_group_privacy_delta_pinned_case_rounds_up() -> None:
    from decimal import Decimal, getcontext

    from dp_icl_plugin.accounting.conversion import group_of_two_delta

    getcontext().prec = 60
    from dp_icl_plugin.accounting import events as ev
    from dp_icl_plugin.accounting.conversion import to_relation

    epsilon, delta = 1.0, 1e-5  # the plain float product is below the exact value here
    plain = (1.0 + math.exp(epsilon)) * delta
    exact = (1 + Decimal(epsilon).exp()) * Decimal(delta)
    assert Decimal(plain) < exact <= Decimal(group_of_two_delta(epsilon, delta))
    converted = to_relation(ev.ApproxDPEvent(epsilon, delta, neighbouring=ev.ADD_REMOVE), ev.REPLACE_ONE)
    assert isinstance(converted, ev.ApproxDPEvent) and Decimal(converted.delta) >= exact
