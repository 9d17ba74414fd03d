"""Every Rényi-DP curve this library and Google's ``dp-accounting`` both implement, side by side.

Where both compute the same quantity the values agree to float rounding; where ``dp-accounting`` uses a
looser or tighter valid bound, the stated order holds (ours is never the optimistic one of two equal-purpose
formulas, except where it is exact and theirs an upper bound).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as theirs

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp

INTEGER = np.array([2.0, 3.0, 4.0, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0])
FRACTIONAL = np.array([1.1, 1.25, 1.5, 1.75, 2.5, 3.5, 7.3, 12.5])
SETTINGS = [(1e-3, 0.6), (0.01, 1.0), (20 / 1600, 0.7), (0.2, 0.8), (0.5, 3.0), (0.9, 2.0)]


def _their_curve(event: dp_event.DpEvent, orders: np.ndarray, relation=NeighboringRelation.ADD_OR_REMOVE_ONE):
    accountant = theirs.RdpAccountant(orders=list(orders), neighboring_relation=relation)
    accountant.compose(event)
    return np.asarray(accountant._rdp, dtype=float)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.5])
def test_gaussian(sigma: float) -> None:
    orders = np.concatenate([FRACTIONAL, INTEGER])
    ours = rdp.event_rdp_at(ev.GaussianEvent(sigma, neighbouring=ev.ADD_REMOVE), orders)
    np.testing.assert_allclose(ours, _their_curve(dp_event.GaussianDpEvent(sigma), orders), rtol=1e-12)


@pytest.mark.parametrize(("q", "sigma"), SETTINGS)
def test_poisson_subsampled_gaussian_integer_orders_agree(q: float, sigma: float) -> None:
    event = ev.PoissonSampledEvent(q, ev.GaussianEvent(sigma, neighbouring=ev.ADD_REMOVE), neighbouring=ev.ADD_REMOVE)
    theirs_ = _their_curve(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), INTEGER)
    np.testing.assert_allclose(rdp.event_rdp_at(event, INTEGER), theirs_, rtol=1e-9)


@pytest.mark.parametrize(("q", "sigma"), SETTINGS)
def test_poisson_subsampled_gaussian_fractional_orders(q: float, sigma: float) -> None:
    """Both evaluate MTZ 2019 §3.3's two-sided series. dp-accounting adds the terms' magnitudes (an upper bound
    that can sit far above, or not converge: ∞); the alternating series here is exact up to its added last term
    (checked against numerical integration in test_rdp.py). Ours is finite everywhere, never above theirs, and
    never above the next integer order."""
    event = ev.PoissonSampledEvent(q, ev.GaussianEvent(sigma, neighbouring=ev.ADD_REMOVE), neighbouring=ev.ADD_REMOVE)
    ours = rdp.event_rdp_at(event, FRACTIONAL)
    theirs_ = _their_curve(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), FRACTIONAL)
    assert np.all(np.isfinite(ours)) and np.all(ours > 0)
    assert np.all(ours <= theirs_ * (1 + 1e-6) + 1e-15)  # ∞ where theirs did not converge
    ceiling = rdp.event_rdp_at(event, np.ceil(FRACTIONAL))
    assert np.all(ours <= ceiling * (1 + 1e-12))


@pytest.mark.parametrize(("q", "sigma"), [(4 / 14732, 0.8), (0.01, 1.0), (0.1, 2.0), (20 / 30000, 1.23)])
def test_sampling_without_replacement_gaussian(q: float, sigma: float) -> None:
    """WBK 2019 Theorem 9 (general inner mechanism, ours) against dp-accounting's Gaussian-specialised
    evaluation of the same theorem: equal at α = 2 and wherever the cap min(·, inner) binds, and never
    below theirs."""
    n, m = 1_000_000, round(q * 1_000_000)
    q = m / n
    ours = rdp.event_rdp_at(
        ev.SampledWithoutReplacementEvent(q, ev.GaussianEvent(sigma, neighbouring=ev.REPLACE_ONE)), INTEGER
    )
    theirs_ = _their_curve(
        dp_event.SampledWithoutReplacementDpEvent(n, m, dp_event.GaussianDpEvent(sigma)),
        INTEGER,
        NeighboringRelation.REPLACE_ONE,
    )
    assert ours[0] == pytest.approx(theirs_[0], rel=1e-9)
    assert np.all(ours >= theirs_ * (1 - 1e-9))
    assert np.all(ours <= rdp.gaussian_rdp(INTEGER, sigma) * (1 + 1e-12))


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 2.0, 8.0])
def test_pure_dp_is_binary_randomized_response(epsilon: float) -> None:
    """Pure ε-DP's curve is that of ε-randomized response; dp-accounting's randomized response with two
    buckets (replace-one) and noise parameter p = 2/(1 + e^ε) is the same mechanism."""
    orders = np.concatenate([FRACTIONAL, INTEGER])
    p = 2.0 / (1.0 + math.exp(epsilon))
    theirs_ = _their_curve(dp_event.RandomizedResponseDpEvent(p, 2), orders, NeighboringRelation.REPLACE_ONE)
    ours = rdp.event_rdp_at(ev.PureDPEvent(epsilon, neighbouring=ev.REPLACE_ONE), orders)
    np.testing.assert_allclose(ours, np.minimum(theirs_, epsilon), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("epsilon0", [0.01, 0.3, 1.0, 4.0])
def test_bounded_range_is_zcdp_capped_by_pure_dp(epsilon0: float) -> None:
    orders = np.concatenate([FRACTIONAL, INTEGER])
    zcdp = _their_curve(dp_event.ZCDpEvent(epsilon0**2 / 8.0), orders)
    pure = rdp.pure_dp_rdp(orders, epsilon0)
    ours = rdp.event_rdp_at(ev.ExponentialMechanismEvent(epsilon0, neighbouring=ev.ADD_REMOVE), orders)
    np.testing.assert_allclose(ours, np.minimum(zcdp, pure), rtol=1e-12)


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), [(0.01, 1.0, 1000, 1e-5), (20 / 1600, 0.7, 36, 1 / 1600)])
def test_rdp_to_epsilon_matches_their_conversion(q: float, sigma: float, steps: int, delta: float) -> None:
    """The same curve converted with Balle et al. 2020 (their default conversion) gives the same ε."""
    orders = INTEGER
    event = ev.PoissonSampledEvent(q, ev.GaussianEvent(sigma, neighbouring=ev.ADD_REMOVE), neighbouring=ev.ADD_REMOVE)
    curve = steps * rdp.event_rdp_at(event, orders)
    ours, _ = rdp.rdp_to_epsilon(orders, curve, delta)
    theirs_, _ = theirs.compute_epsilon(orders, curve, delta)
    assert ours == pytest.approx(theirs_, rel=1e-9)
