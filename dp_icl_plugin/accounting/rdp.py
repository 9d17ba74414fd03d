"""Rényi-DP curves of privacy events and the RDP → (ε, δ) conversion; pure numpy.

Every function returns the RDP ε(α) at each order of ``orders`` (``inf`` where no bound is known).
References:
- Gaussian: Mironov 2017, Prop. 7: α / (2σ²).
- Poisson-subsampled Gaussian (add/remove): Mironov, Talwar & Zhang 2019, §3.3: the closed form at
  integer α ≥ 2, the two-sided series at fractional α. Replace-one: the weak triangle inequality from
  the add/remove curve (Mironov 2017, Prop. 11; :func:`weak_triangle`).
- Pure ε-DP: the Rényi divergence of randomized response with parameter ε, which dominates every ε-DP
  pair (each is a post-processing of it); also ≤ ε.
- Bounded-range ε0 (the exponential mechanism): ε0²/8-zCDP, Cesar & Rogers 2021.
- Sampling without replacement (replace-one): Wang, Balle & Kasiviswanathan 2019, Theorem 9.
- Conversion: Balle et al. 2020: ε = ρ + log((α−1)/α) − (log δ + log α)/(α−1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.errors import UnsupportedEventError

__all__ = [
    "DEFAULT_ORDERS",
    "HOLDER_EXPONENTS",
    "bounded_range_rdp",
    "event_rdp",
    "event_rdp_at",
    "gaussian_rdp",
    "poisson_subsampled_gaussian_rdp",
    "pure_dp_rdp",
    "rdp_to_epsilon",
    "replace_one_poisson_subsampled_gaussian_rdp",
    "weak_triangle",
    "without_replacement_rdp",
]

DEFAULT_ORDERS: tuple[float, ...] = (
    1.25,
    1.5,
    1.75,
    2.5,
    3.5,
    4.5,
    5.5,
    *map(float, range(2, 65)),
    72.0,
    80.0,
    96.0,
    112.0,
    128.0,
    160.0,
    192.0,
    256.0,
    384.0,
    512.0,
)
"""Orders used by default: fine near 1 for large ε, integers (needed by the subsampling bounds)."""

Orders = Sequence[float] | np.ndarray


def _as_orders(orders: Orders) -> np.ndarray:
    return np.asarray(orders, dtype=float)


def _is_integer(a: np.ndarray) -> np.ndarray:
    return np.isclose(a, np.round(a), rtol=0, atol=1e-12) & (a >= 2)


def _log_binom(n: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    return gammaln(np.asarray(n) + 1) - gammaln(np.asarray(k) + 1) - gammaln(np.asarray(n) - np.asarray(k) + 1)


def gaussian_rdp(orders: Orders, noise_multiplier: float) -> np.ndarray:
    """RDP of the Gaussian mechanism with noise multiplier σ: α / (2σ²).

    Args:
        orders: the Rényi orders α (> 1).
        noise_multiplier: σ (std over sensitivity).
    """
    with np.errstate(over="ignore", under="ignore"):  # σ near 0 gives inf (no privacy), σ huge gives 0
        return _as_orders(orders) / 2.0 / noise_multiplier / noise_multiplier


def poisson_subsampled_gaussian_rdp(
    orders: Orders, sampling_rate: float, noise_multiplier: float, *, series_below: float = math.inf
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian (add/remove) at every order (Mironov, Talwar & Zhang 2019, §3.3).

    Integer α: ε(α) = log Σ_k C(α,k) (1−q)^(α−k) q^k exp((k²−k)/(2σ²)) / (α−1). Fractional α: the series of
    :func:`_log_a_fractional`, and never more than the next integer order's value (ε is non-decreasing in α);
    at fractional orders ≥ ``series_below`` only the latter (cheaper, and close there).

    Args:
        orders: the Rényi orders α (> 1).
        sampling_rate: q, in (0, 1].
        noise_multiplier: σ.
        series_below: fractional orders from here on take the next integer order's value only.
    """
    a = _as_orders(orders)
    if sampling_rate >= 1.0:
        return gaussian_rdp(a, noise_multiplier)
    out = np.full(a.shape, np.inf)
    for i, alpha in enumerate(a.tolist()):
        ceiling = math.ceil(alpha - 1e-12)
        out[i] = _integer_poisson_rdp(ceiling, sampling_rate, noise_multiplier)
        if not _is_integer(np.asarray(alpha)) and alpha < series_below:
            log_a = _log_a_fractional(alpha, sampling_rate, noise_multiplier)
            out[i] = min(out[i], log_a / (alpha - 1.0))
    return out


@lru_cache(maxsize=65536)
def _integer_poisson_rdp(alpha: int, sampling_rate: float, noise_multiplier: float) -> float:
    k = np.arange(alpha + 1, dtype=float)
    log_q, log_1mq = math.log(sampling_rate), math.log1p(-sampling_rate)
    with np.errstate(over="ignore"):  # σ near 0: inf (no privacy); never σ² (overflows for huge σ)
        exponent = (k * k - k) / 2.0 / noise_multiplier / noise_multiplier
    terms = _log_binom(alpha, k) + k * log_q + (alpha - k) * log_1mq + exponent
    return float(logsumexp(terms)) / (alpha - 1)


FRACTIONAL_MAX_TERMS = 1 << 18


@lru_cache(maxsize=65536)
def _log_a_fractional(alpha: float, sampling_rate: float, noise_multiplier: float) -> float:
    """log A_α = log E_{N(0,σ²)}[(μ/μ0)^α] for fractional α > 1, μ = (1−q)·N(0,σ²) + q·N(1,σ²); an upper bound.

    Split at z0 = σ² log(1/q − 1) + 1/2, where q·μ1 = (1−q)·μ0, and expand (μ/μ0)^α binomially in the
    smaller of the two ratios on each side (MTZ 2019, §3.3)::

        A_α = Σ_i C(α,i) q^i (1−q)^(α−i) e^{(i²−i)/(2σ²)} Φ((z0−i)/σ)
            + Σ_i C(α,i) q^(α−i) (1−q)^i e^{(j²−j)/(2σ²)} Φ((j−z0)/σ),   j = α − i.

    Past i > α the generalised binomial C(α,i) alternates in sign and the terms shrink, so each series is
    alternating: stopping after n terms errs by less than the last term, which is added to the sum (an
    upper bound). ``inf`` if the last terms do not fall below e^−20 of the sum within FRACTIONAL_MAX_TERMS;
    the caller then keeps the next integer order's bound.
    """
    sigma2 = noise_multiplier * noise_multiplier
    if not math.isfinite(sigma2) or sigma2 == 0.0:
        return 0.0 if sigma2 > 0 else math.inf
    if sampling_rate > 1.0 - 1e-9:  # the terms barely shrink (their linear rate is log(1/q − 1) + log(1/(1−q)) ≈ 0):
        return math.inf  # no useful series; the caller keeps the next integer order's bound, at once
    z0 = sigma2 * math.log(1.0 / sampling_rate - 1.0) + 0.5
    log_q, log_1mq = math.log(sampling_rate), math.log1p(-sampling_rate)
    sigma = math.sqrt(sigma2)
    n = max(64, 2 * math.ceil(alpha), 2 * math.ceil(z0))
    while n <= FRACTIONAL_MAX_TERMS:
        i = np.arange(n, dtype=float)
        j = alpha - i
        log_coef = gammaln(alpha + 1.0) - gammaln(i + 1.0) - gammaln(j + 1.0)  # log |C(α, i)|
        sign = np.where((i > alpha) & ((i - math.ceil(alpha)) % 2 == 1), -1.0, 1.0)  # of C(α, i)
        with np.errstate(over="ignore", divide="ignore"):
            below = log_coef + i * log_q + j * log_1mq + (i * i - i) / (2.0 * sigma2) + log_ndtr((z0 - i) / sigma)
            above = log_coef + j * log_q + i * log_1mq + (j * j - j) / (2.0 * sigma2) + log_ndtr((j - z0) / sigma)
        if np.isposinf(below).any() or np.isposinf(above).any() or np.isnan(below).any() or np.isnan(above).any():
            return math.inf
        total, total_sign = logsumexp(np.concatenate([below, above]), b=np.concatenate([sign, sign]), return_sign=True)
        shrinking = below[-1] <= below[-2] and above[-1] <= above[-2]
        last = max(float(below[-1]), float(above[-1]))
        if total_sign > 0 and shrinking and last < float(total) - 20.0:
            # the truncation error of both series, plus float rounding of the cancelling sum
            return float(np.logaddexp(total, math.log(2.0) + last)) + 1e-12
        n *= 4
    return math.inf


HOLDER_EXPONENTS: tuple[float, ...] = (1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0, 20.0)
"""The p tried by :func:`weak_triangle` (q = p/(p − 1)); any p > 1 gives a valid bound."""


def weak_triangle(orders: np.ndarray, curve: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Replace-one RDP at ``orders`` from an add/remove RDP ``curve`` (any real orders > 1; both directions).

    Mironov 2017, Prop. 11 with P = M(D), Q = M(D∖{x}), R = M(D'): the first term is a removal, the second
    an addition, each bounded by the add/remove curve. The smallest bound over :data:`HOLDER_EXPONENTS`.

    Args:
        orders: the Rényi orders α (> 1).
        curve: the add/remove RDP at an array of orders.
    """
    a = np.asarray(orders, dtype=float)
    best = np.full(a.shape, np.inf)
    for p in HOLDER_EXPONENTS:
        q = p / (p - 1.0)
        first = np.asarray(curve(p * a), dtype=float)
        second = np.asarray(curve(q * (a - 1.0 / p)), dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            bound = (a - 1.0 / p) / (a - 1.0) * first + second
        best = np.minimum(best, np.where(np.isnan(bound), np.inf, bound))
    return best


WEAK_TRIANGLE_MAX_ORDER = 2048.0


def replace_one_poisson_subsampled_gaussian_rdp(
    orders: Orders, sampling_rate: float, noise_multiplier: float
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian for replace-one neighbours.

    At q = 1 a Gaussian of twice the sensitivity (σ/2); below, the weak triangle inequality (Mironov 2017,
    Prop. 11) through the dataset without the record, on the add/remove curve (orders above
    WEAK_TRIANGLE_MAX_ORDER are not evaluated, which only drops candidate bounds).

    Args:
        orders: the Rényi orders α (> 1).
        sampling_rate: q, in (0, 1].
        noise_multiplier: σ.
    """
    a = _as_orders(orders)
    if sampling_rate >= 1.0:
        return gaussian_rdp(a, noise_multiplier / 2.0)

    def add_remove(b: np.ndarray) -> np.ndarray:
        out = np.full(b.shape, np.inf)
        ok = b <= WEAK_TRIANGLE_MAX_ORDER
        out[ok] = poisson_subsampled_gaussian_rdp(b[ok], sampling_rate, noise_multiplier, series_below=16.0)
        return out

    return weak_triangle(a, add_remove)


def pure_dp_rdp(orders: Orders, epsilon: float) -> np.ndarray:
    """RDP implied by pure ε-DP: the Rényi divergence of ε-randomized response, capped at ε.

    Args:
        orders: the Rényi orders α (> 1).
        epsilon: the pure ε.
    """
    a = _as_orders(orders)
    log_p = epsilon - np.logaddexp(0.0, epsilon)  # p = e^ε / (1 + e^ε)
    log_q = -np.logaddexp(0.0, epsilon)
    with np.errstate(over="ignore", invalid="ignore"):  # astronomically large ε: the cap ε is the answer
        rr = np.logaddexp(a * log_p + (1 - a) * log_q, a * log_q + (1 - a) * log_p) / (a - 1)
    rr = np.where(np.isfinite(rr), rr, epsilon)
    return np.minimum(np.maximum(rr, 0.0), epsilon)


def bounded_range_rdp(orders: Orders, epsilon: float) -> np.ndarray:
    """RDP of an ε0-bounded-range mechanism: min(α ε0²/8, pure-DP bound).

    Args:
        orders: the Rényi orders α (> 1).
        epsilon: ε0.
    """
    a = _as_orders(orders)
    return np.minimum(a * epsilon**2 / 8.0, pure_dp_rdp(a, epsilon))


def _curve_rdp(orders: Orders, curve: ev.RDPCurveEvent) -> np.ndarray:
    a = _as_orders(orders)
    known_orders = np.asarray(curve.orders)
    known = np.asarray(curve.epsilons)
    # Rényi divergence is non-decreasing in α: use the smallest value at any listed order ≥ α.
    suffix_min = np.minimum.accumulate(known[::-1])[::-1]
    idx = np.searchsorted(known_orders, a - 1e-12, side="left")
    out = np.full(a.shape, np.inf)
    ok = idx < len(known_orders)
    out[ok] = suffix_min[idx[ok]]
    return np.minimum(out, curve.epsilon_inf)


def _log_expm1(x: float) -> float:
    """log(e^x − 1) without overflow; -inf at x = 0."""
    if x <= 0:
        return -math.inf
    return x + math.log(-math.expm1(-x)) if x > 1.0 else math.log(math.expm1(x))


def without_replacement_rdp(
    orders: Orders,
    sampling_rate: float,
    inner_rdp: Callable[[np.ndarray], np.ndarray],
    inner_epsilon_inf: float = math.inf,
) -> np.ndarray:
    """Amplification by sampling without replacement (replace-one), WBK 2019 Theorem 9.

    ε'(α) ≤ 1/(α−1) · log(1 + γ² C(α,2) min{4(e^{ε(2)}−1), e^{ε(2)} min{2, (e^{ε(∞)}−1)²}}
                         + Σ_{j=3..α} γ^j C(α,j) e^{(j−1)ε(j)} min{2, (e^{ε(∞)}−1)^j}),
    for integer α ≥ 2 (``inf`` at other orders). At integer orders never larger than the inner ε(α):
    replacing one record changes at most one sampled record, so subsampling cannot hurt.

    Args:
        orders: the Rényi orders α (> 1).
        sampling_rate: γ = m/n, in (0, 1].
        inner_rdp: the inner mechanism's RDP at an array of integer orders 2, 3, ….
        inner_epsilon_inf: a bound on the inner mechanism's D_∞ (``inf`` when unknown).
    """
    a = _as_orders(orders)
    out = np.full(a.shape, np.inf)
    integer = _is_integer(a)
    if not integer.any():
        return out
    max_order = int(np.rint(a[integer].max()))
    j_all = np.arange(2, max_order + 1, dtype=float)
    inner = np.asarray(inner_rdp(j_all), dtype=float)
    log_gamma = math.log(sampling_rate)
    # log min{2, (e^{ε∞} − 1)^j}
    if math.isinf(inner_epsilon_inf):
        log_cap = np.full(j_all.shape, math.log(2.0))
    else:
        log_em1 = _log_expm1(inner_epsilon_inf)
        log_cap = np.minimum(math.log(2.0), j_all * log_em1)
    eps2 = inner[0]
    log_term2 = min(math.log(4.0) + _log_expm1(eps2), eps2 + float(log_cap[0]))
    for i in np.flatnonzero(integer):
        alpha = int(np.rint(a[i]))
        j = j_all[: alpha - 1]
        terms = j * log_gamma + _log_binom(alpha, j) + log_cap[: alpha - 1] + (j - 1) * inner[: alpha - 1]
        terms[0] = 2 * log_gamma + float(_log_binom(alpha, 2.0)) + log_term2
        log_sum = float(logsumexp(terms))
        bound = float(np.logaddexp(0.0, log_sum)) / (alpha - 1)
        out[i] = min(bound, float(inner[alpha - 2]))
    return out


def rdp_to_epsilon(orders: Orders, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """Convert an RDP curve to (ε, δ)-DP with Balle et al. 2020; returns (ε, best order).

    Args:
        orders: the Rényi orders α (> 1).
        rdp: the RDP ε at each order.
        delta: the δ, in (0, 1).

    Returns:
        ``(ε, α)``: the smallest ε (at least 0) over the orders and the order that gives it.
    """
    a = _as_orders(orders)
    rdp = np.asarray(rdp, dtype=float)
    with np.errstate(invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isfinite(rdp), eps, np.inf)
    best = int(np.argmin(eps))
    return max(float(eps[best]), 0.0), float(a[best])


@lru_cache(maxsize=4096)
def _atom_rdp(event: ev.DPEvent, orders: tuple[float, ...]) -> np.ndarray:
    a = np.asarray(orders, dtype=float)
    if isinstance(event, ev.GaussianEvent):
        return gaussian_rdp(a, event.noise_multiplier)
    if isinstance(event, ev.PoissonSampledEvent):
        inner = event.event
        assert isinstance(inner, ev.GaussianEvent)
        if event.neighbouring == ev.REPLACE_ONE:
            return replace_one_poisson_subsampled_gaussian_rdp(a, event.sampling_rate, inner.noise_multiplier)
        return poisson_subsampled_gaussian_rdp(a, event.sampling_rate, inner.noise_multiplier)
    if isinstance(event, ev.PureDPEvent):
        return pure_dp_rdp(a, event.epsilon)
    if isinstance(event, ev.ExponentialMechanismEvent):
        return bounded_range_rdp(a, event.epsilon)
    if isinstance(event, ev.RDPCurveEvent):
        return _curve_rdp(a, event)
    if isinstance(event, ev.MozoTokenEvent):
        return np.where(a <= event.order + 1e-12, event.rdp_bound, np.inf)
    if isinstance(event, ev.SampledWithoutReplacementEvent):
        inner_event = event.event
        return without_replacement_rdp(
            a,
            event.sampling_rate,
            lambda js: event_rdp(inner_event, tuple(float(x) for x in js)),
            _epsilon_inf(inner_event),
        )
    raise UnsupportedEventError(f"no RDP analysis for {event.type_name!r} events")


def _epsilon_inf(event: ev.DPEvent) -> float:
    """A bound on D_∞ (pure ε) of an event; ``inf`` when none is known."""
    total = 0.0
    for atom, count in ev.atoms(event).items():
        if isinstance(atom, (ev.PureDPEvent, ev.ExponentialMechanismEvent)):
            total += count * atom.epsilon
        elif isinstance(atom, ev.RDPCurveEvent):
            total += count * atom.epsilon_inf
        else:
            return math.inf
    return total


def event_rdp_at(event: ev.DPEvent, orders: Orders) -> np.ndarray:
    """:func:`event_rdp` at any array of orders (e.g. the orders the weak triangle inequality asks for).

    Args:
        event: an event with an RDP analysis.
        orders: the orders, any shape (flattened).

    Raises:
        UnsupportedEventError: ``event`` has no RDP analysis.
    """
    return event_rdp(event, tuple(float(x) for x in np.asarray(orders, dtype=float).ravel()))


def event_rdp(event: ev.DPEvent, orders: tuple[float, ...] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP curve of any RDP-analysable event (compositions add up order by order).

    Args:
        event: an event with an RDP analysis.
        orders: the orders.

    Raises:
        UnsupportedEventError: ``event`` has no RDP analysis.
    """
    if ev.RDP not in event.supported_accountants:
        raise UnsupportedEventError(f"no RDP analysis for {event.type_name!r} events")
    total = np.zeros(len(orders))
    for atom, count in ev.atoms(event).items():
        total = total + count * _atom_rdp(atom, orders)
    return total
