"""Rényi-DP curves and the RDP → (ε, δ) conversion, checked against closed forms and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.errors import UnsupportedEventError

ORDERS = np.asarray(rdp.DEFAULT_ORDERS)
INTEGER = np.isclose(ORDERS, np.round(ORDERS)) & (ORDERS >= 2)
INT_ORDERS = tuple(float(a) for a in range(2, 65))


def test_default_orders() -> None:
    assert len(set(rdp.DEFAULT_ORDERS)) == len(rdp.DEFAULT_ORDERS)
    assert all(a > 1 for a in rdp.DEFAULT_ORDERS)
    assert set(range(2, 65)) <= set(rdp.DEFAULT_ORDERS)


# ---------------------------------------------------------------------------------------------------------
# Gaussian and Poisson-subsampled Gaussian
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5, 40.0])
def test_gaussian_closed_form(sigma: float) -> None:
    np.testing.assert_allclose(rdp.gaussian_rdp(ORDERS, sigma), ORDERS / (2 * sigma**2), rtol=1e-15)
    # The event's curve depends on the noise multiplier only, whatever the sensitivity it scales by.
    for sensitivity in (1.0, math.sqrt(2), 2.0):
        np.testing.assert_allclose(
            rdp.event_rdp(ev.GaussianEvent(sigma, sensitivity, neighbouring="add_remove")),
            ORDERS / (2 * sigma**2),
            rtol=1e-15,
        )


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_poisson_with_rate_one_is_the_gaussian(sigma: float) -> None:
    expected = rdp.gaussian_rdp(ORDERS, sigma)
    np.testing.assert_array_equal(rdp.poisson_subsampled_gaussian_rdp(ORDERS, 1.0, sigma), expected)
    np.testing.assert_array_equal(
        rdp.event_rdp(
            ev.PoissonSampledEvent(1.0, ev.GaussianEvent(sigma, neighbouring="add_remove"), neighbouring="add_remove")
        ),
        expected,
    )


@pytest.mark.parametrize(("q", "sigma"), [(1e-3, 0.6), (0.01, 1.0), (0.2, 0.8), (0.9, 2.0)])
def test_poisson_below_gaussian_at_every_order(q: float, sigma: float) -> None:
    sub = rdp.poisson_subsampled_gaussian_rdp(ORDERS, q, sigma)
    full = rdp.gaussian_rdp(ORDERS, sigma)
    assert np.all(sub < full)
    assert np.all(sub > 0) and np.all(np.isfinite(sub))  # fractional orders too (MTZ 2019, §3.3)
    # Non-decreasing in the order (Rényi divergence is) and in the sampling rate.
    order = np.argsort(ORDERS)
    assert np.all(np.diff(sub[order]) >= -1e-12)
    assert np.all(rdp.poisson_subsampled_gaussian_rdp(ORDERS, q / 2, sigma) <= sub)


@pytest.mark.parametrize(
    ("alpha", "q", "sigma"),
    [(1.5, 0.01, 1.0), (1.1, 0.0125, 0.7), (1.25, 0.5, 3.0), (2.5, 0.05, 2.0), (1.75, 0.2, 0.5), (7.3, 0.01, 1.0)],
)
def test_fractional_orders_match_numerical_integration(alpha: float, q: float, sigma: float) -> None:
    """The series is an upper bound within 1e-6 of the Rényi divergence integrated numerically."""
    from scipy import integrate, stats

    def integrand(z: float) -> float:
        log_p0 = stats.norm.logpdf(z, 0, sigma)
        log_mix = np.logaddexp(math.log1p(-q) + log_p0, math.log(q) + stats.norm.logpdf(z, 1, sigma))
        return math.exp((1 - alpha) * log_p0 + alpha * log_mix)

    value, _ = integrate.quad(integrand, -60 * sigma, 60 * sigma + 1, limit=500, epsabs=1e-14, epsrel=1e-13)
    exact = math.log(value) / (alpha - 1)
    got = rdp.poisson_subsampled_gaussian_rdp([alpha], q, sigma)[0]
    assert exact * (1 - 1e-9) <= got <= exact * (1 + 1e-5)


def _sampled_gaussian_rdp_by_quadrature(q: float, sigma: float, alpha: int) -> float:
    """ε(α) = log E_{x~N(0,σ²)}[((1−q) + q·exp((2x−1)/(2σ²)))^α] / (α−1) (Mironov, Talwar & Zhang 2019).

    The integrand lives around 0 and around α (the tilt of the q-component); integrate over a window wide
    enough for both, with those points as breakpoints.
    """

    def integrand(x: float) -> float:
        log_mix = np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))
        return math.exp(alpha * log_mix - x * x / (2 * sigma**2)) / (sigma * math.sqrt(2 * math.pi))

    lo, hi = -40 * sigma, alpha + 40 * sigma
    value, err = integrate.quad(integrand, lo, hi, points=[0.0, 0.5, float(alpha)], limit=500, epsabs=0.0, epsrel=1e-12)
    assert err <= 1e-9 * value
    return math.log(value) / (alpha - 1)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.05, 0.7), (0.2, 1.5), (20 / 30000, 0.51)])
def test_poisson_matches_brute_force_integral(q: float, sigma: float) -> None:
    alphas = list(range(2, 9))
    got = rdp.poisson_subsampled_gaussian_rdp([float(a) for a in alphas], q, sigma)
    expected = [_sampled_gaussian_rdp_by_quadrature(q, sigma, a) for a in alphas]
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-14)


# ---------------------------------------------------------------------------------------------------------
# Pure DP and bounded range
# ---------------------------------------------------------------------------------------------------------

eps_values = st.floats(min_value=1e-3, max_value=30.0)


@settings(max_examples=200, deadline=None)
@given(eps_values)
def test_pure_dp_rdp_bounds(epsilon: float) -> None:
    curve = rdp.pure_dp_rdp(ORDERS, epsilon)
    assert np.all(curve >= 0)
    assert np.all(curve <= epsilon)
    # ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Prop. 3.3).
    assert np.all(curve <= ORDERS * epsilon**2 / 2 * (1 + 1e-9) + 1e-15)
    assert np.all(np.diff(curve[np.argsort(ORDERS)]) >= -1e-12)


@pytest.mark.parametrize("epsilon", [0.01, 0.5, 1.0, 3.0])
def test_pure_dp_rdp_is_randomized_response_divergence(epsilon: float) -> None:
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    for alpha in (1.5, 2.0, 5.0, 32.0):
        rr = math.log(p**alpha * (1 - p) ** (1 - alpha) + (1 - p) ** alpha * p ** (1 - alpha)) / (alpha - 1)
        assert rdp.pure_dp_rdp([alpha], epsilon)[0] == pytest.approx(min(rr, epsilon), rel=1e-9)
    np.testing.assert_array_equal(
        rdp.event_rdp(ev.PureDPEvent(epsilon, neighbouring="add_remove")), rdp.pure_dp_rdp(ORDERS, epsilon)
    )


@settings(max_examples=200, deadline=None)
@given(eps_values)
def test_bounded_range_rdp_bounds(epsilon: float) -> None:
    curve = rdp.bounded_range_rdp(ORDERS, epsilon)
    assert np.all(curve >= 0)
    assert np.all(curve <= ORDERS * epsilon**2 / 8)
    assert np.all(curve <= rdp.pure_dp_rdp(ORDERS, epsilon))
    np.testing.assert_array_equal(
        rdp.event_rdp(ev.ExponentialMechanismEvent(epsilon, neighbouring="add_remove")), curve
    )


# ---------------------------------------------------------------------------------------------------------
# Sampling without replacement (Wang, Balle & Kasiviswanathan 2019, Theorem 9)
# ---------------------------------------------------------------------------------------------------------


def _inner_curves():
    return st.one_of(
        st.floats(0.3, 20.0).map(lambda s: (lambda js: rdp.gaussian_rdp(js, s), math.inf)),
        st.floats(0.01, 5.0).map(lambda e: (lambda js: rdp.pure_dp_rdp(js, e), e)),
        st.floats(0.01, 5.0).map(lambda e: (lambda js: rdp.bounded_range_rdp(js, e), e)),
        st.tuples(st.floats(1e-4, 1.0), st.integers(2, 64)).map(
            lambda b: (lambda js: np.where(np.asarray(js) <= b[1], 4 * b[0] * b[1], np.inf), math.inf)
        ),
    )


rates = st.floats(min_value=1e-5, max_value=1.0)


@settings(max_examples=80, deadline=None)
@given(_inner_curves(), rates)
def test_without_replacement_never_exceeds_inner(inner, gamma: float) -> None:
    inner_rdp, eps_inf = inner
    got = rdp.without_replacement_rdp(INT_ORDERS, gamma, inner_rdp, eps_inf)
    base = inner_rdp(np.asarray(INT_ORDERS))
    assert np.all(got <= base)
    assert np.all(got >= 0)


@pytest.mark.slow  # over 1 s: the full suite, not the unit layer
@settings(max_examples=80, deadline=None)
@given(_inner_curves(), rates, rates)
def test_without_replacement_monotone_in_sampling_rate(inner, g1: float, g2: float) -> None:
    inner_rdp, eps_inf = inner
    lo, hi = sorted((g1, g2))
    small = rdp.without_replacement_rdp(INT_ORDERS, lo, inner_rdp, eps_inf)
    large = rdp.without_replacement_rdp(INT_ORDERS, hi, inner_rdp, eps_inf)
    assert np.all(small <= large * (1 + 1e-12) + 1e-300)


@pytest.mark.parametrize(("gamma", "sigma"), [(0.01, 2.0), (1e-3, 0.8), (0.3, 5.0)])
def test_without_replacement_theorem_9_by_hand(gamma: float, sigma: float) -> None:
    """α = 2 and α = 3 written out from the theorem for a Gaussian inner mechanism (ε(∞) = ∞)."""
    e = {j: j / (2 * sigma**2) for j in (2, 3)}
    term2 = gamma**2 * math.comb(2, 2) * min(4 * math.expm1(e[2]), math.exp(e[2]) * 2)
    eps2 = min(math.log1p(term2) / 1, e[2])
    term2_3 = gamma**2 * math.comb(3, 2) * min(4 * math.expm1(e[2]), math.exp(e[2]) * 2)
    term3 = gamma**3 * math.comb(3, 3) * math.exp(2 * e[3]) * 2
    eps3 = min(math.log1p(term2_3 + term3) / 2, e[3])
    got = rdp.without_replacement_rdp([2.0, 3.0], gamma, lambda js: rdp.gaussian_rdp(js, sigma))
    np.testing.assert_allclose(got, [eps2, eps3], rtol=1e-10)


def test_without_replacement_uses_epsilon_inf_cap() -> None:
    # Pure ε-DP inner: (e^ε − 1)^j < 2 for small ε tightens every term.
    gamma, epsilon = 0.05, 0.2
    capped = rdp.without_replacement_rdp(INT_ORDERS, gamma, lambda js: rdp.pure_dp_rdp(js, epsilon), epsilon)
    uncapped = rdp.without_replacement_rdp(INT_ORDERS, gamma, lambda js: rdp.pure_dp_rdp(js, epsilon))
    assert np.all(capped <= uncapped)
    assert np.any(capped < uncapped)
    # The event path passes the inner ε(∞) for pure-DP inner events.
    event = ev.SampledWithoutReplacementEvent(gamma, ev.PureDPEvent(epsilon, neighbouring="replace_one"))
    np.testing.assert_allclose(rdp.event_rdp(event, INT_ORDERS), capped, rtol=1e-12)


def test_without_replacement_event_of_mozo_token() -> None:
    beta, order, gamma = 0.081, 14, 4 / 14732
    event = ev.SampledWithoutReplacementEvent(gamma, ev.MozoTokenEvent(beta, order))
    curve = rdp.event_rdp(event, INT_ORDERS)
    a = np.asarray(INT_ORDERS)
    assert np.all(np.isinf(curve[a > order]))
    assert np.all(np.isfinite(curve[a <= order]))
    assert np.all(curve[a <= order] <= 4 * beta * order)


# ---------------------------------------------------------------------------------------------------------
# Conversion and composition
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alpha", "rho", "delta"), [(2.0, 0.5, 1e-5), (14.0, 0.01, 1 / 14732), (1.5, 3.0, 1e-3)])
def test_rdp_to_epsilon_single_order_balle_formula(alpha: float, rho: float, delta: float) -> None:
    eps, best = rdp.rdp_to_epsilon([alpha], np.array([rho]), delta)
    expected = rho + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
    assert eps == pytest.approx(expected, rel=1e-12)
    assert best == alpha


def test_rdp_to_epsilon_takes_the_best_order_and_ignores_infinite_ones() -> None:
    orders = [2.0, 4.0, 8.0, 16.0]
    curve = np.array([np.inf, 0.2, 0.4, np.inf])
    eps, best = rdp.rdp_to_epsilon(orders, curve, 1e-5)
    per_order = [rdp.rdp_to_epsilon([a], np.array([r]), 1e-5)[0] for a, r in zip(orders, curve, strict=True)]
    assert eps == min(per_order)
    assert best == orders[int(np.argmin(per_order))]
    assert rdp.rdp_to_epsilon(orders, np.full(4, np.inf), 1e-5)[0] == math.inf


def test_rdp_to_epsilon_is_never_negative() -> None:
    eps, _ = rdp.rdp_to_epsilon([2.0], np.array([0.0]), 0.9)
    assert eps == 0.0


def test_event_rdp_adds_compositions_order_by_order() -> None:
    g, p = ev.GaussianEvent(2.0, neighbouring="add_remove"), ev.PureDPEvent(0.3, neighbouring="add_remove")
    event = ev.ComposedEvent((ev.SelfComposedEvent(g, 3), p, ev.SelfComposedEvent(ev.ComposedEvent((p, g)), 2)))
    expected = 5 * rdp.gaussian_rdp(ORDERS, 2.0) + 3 * rdp.pure_dp_rdp(ORDERS, 0.3)
    np.testing.assert_allclose(rdp.event_rdp(event), expected, rtol=1e-12)


def test_event_rdp_refuses_unsupported_events() -> None:
    with pytest.raises(UnsupportedEventError):
        rdp.event_rdp(ev.ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove"))
    with pytest.raises(UnsupportedEventError):
        rdp.event_rdp(
            ev.ComposedEvent(
                (ev.PureDPEvent(1.0, neighbouring="add_remove"), ev.ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove"))
            )
        )


# ---------------------------------------------------------------------------------------------------------
# Raw curves and MOZO tokens
# ---------------------------------------------------------------------------------------------------------


def test_rdp_curve_uses_next_larger_listed_order() -> None:
    curve = ev.RDPCurveEvent(orders=(2.0, 4.0, 8.0), epsilons=(0.1, 0.3, 0.9), neighbouring="add_remove")
    query = (1.5, 2.0, 2.5, 3.0, 4.0, 4.0000001, 7.9, 8.0, 8.5, 64.0)
    expected = [0.1, 0.1, 0.3, 0.3, 0.3, 0.9, 0.9, 0.9, math.inf, math.inf]
    np.testing.assert_array_equal(rdp.event_rdp(curve, query), expected)


def test_rdp_curve_capped_by_epsilon_inf() -> None:
    curve = ev.RDPCurveEvent(
        orders=(2.0, 4.0, 8.0), epsilons=(0.1, 0.3, 0.9), epsilon_inf=0.5, neighbouring="add_remove"
    )
    np.testing.assert_array_equal(rdp.event_rdp(curve, (2.0, 3.0, 8.0, 100.0)), [0.1, 0.3, 0.5, 0.5])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(1.01, 500.0), min_size=1, max_size=8, unique=True),
    st.lists(st.floats(0.0, 50.0), min_size=8, max_size=8),
    st.floats(1.01, 600.0),
)
def test_rdp_curve_is_a_valid_reading_of_the_listed_bounds(orders, eps, query: float) -> None:
    curve = ev.RDPCurveEvent(tuple(orders), tuple(eps[: len(orders)]), neighbouring="add_remove")
    got = rdp.event_rdp(curve, (query,))[0]
    larger = [e for a, e in zip(curve.orders, curve.epsilons, strict=True) if a >= query]
    assume(not any(abs(a - query) < 1e-9 for a in curve.orders) or query in curve.orders)
    if not larger:
        assert got == math.inf
    else:
        # Never more than the next larger listed order's bound, and a bound some listed order ≥ α proves.
        assert got <= larger[0]
        assert got in larger


def test_mozo_token_rdp() -> None:
    token = ev.MozoTokenEvent(beta=0.1, order=5)
    np.testing.assert_array_equal(rdp.event_rdp(token, (1.5, 2.0, 5.0, 5.5, 6.0)), [2.0, 2.0, 2.0, math.inf, math.inf])
