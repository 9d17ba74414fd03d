"""Numerical composition with privacy random variables (Gopi, Lee & Wutschitz 2021) via ``prv-accountant``.

Handles compositions (heterogeneous included) of Gaussian, Poisson-subsampled Gaussian, pure-DP and
(ε, δ)-DP atoms. The reported ε is the package's certified *upper* bound (estimate + ``eps_error``,
evaluated at δ − ``delta_error``), never the point estimate: with eps_error = 0.01 and
delta_error = 1e-10 this reproduces the σ of PTA's Table 4 exactly.

The truncation domain [−L, L] is computed here, not by the package: ``prv-accountant`` 0.2.0 bounds it
with ``PureDPMechanism.rdp(α) = (α−1)ε/α``, which is below the true Rényi divergence of randomized
response (ε = 5, α = 2: 2.5 instead of 4.99), so for pure-DP atoms with large ε its domain is too small
and the "certified" ε far too optimistic (64 × 5-DP came out as ε ≈ 13 at δ = 1e-5; the truth is above
250). We bound L with our own RDP curves (Gopi et al. 2021, Remark 5.6), refuse compositions whose
domain float64 cannot hold, and reject any result that is not well inside the domain.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.errors import UnsupportedEventError

__all__ = ["DEFAULT_DELTA_ERROR", "DEFAULT_EPS_ERROR", "prv_bounds", "prv_epsilon", "safe_domain"]

DEFAULT_EPS_ERROR = 0.01
DEFAULT_DELTA_ERROR = 1e-10

# Above these sizes the discretised domain grows past what one process should hold; the caller then
# falls back to the other (valid, looser) accountants.
MAX_TOTAL_COMPOSITIONS = 200_000
MAX_DISTINCT_ATOMS = 64
MAX_DOMAIN = 250.0  # exp(t) over [−L, L] must stay far from float64 overflow (t ≈ 709)
MAX_DOMAIN_POINTS = 8_000_000

_log = logging.getLogger(__name__)


def _prv_of(atom: ev.DPEvent):
    from prv_accountant import privacy_random_variables as prvs

    if isinstance(atom, ev.GaussianEvent):
        return prvs.GaussianMechanism(noise_multiplier=atom.noise_multiplier)
    if isinstance(atom, ev.PoissonSampledEvent):
        inner = atom.event
        assert isinstance(inner, ev.GaussianEvent)
        if atom.sampling_rate >= 1.0:
            return prvs.GaussianMechanism(noise_multiplier=inner.noise_multiplier)
        return prvs.PoissonSubsampledGaussianMechanism(
            sampling_probability=atom.sampling_rate, noise_multiplier=inner.noise_multiplier
        )
    if isinstance(atom, (ev.PureDPEvent, ev.ExponentialMechanismEvent)):
        return prvs.PureDPMechanism(eps=atom.epsilon)
    if isinstance(atom, ev.ApproxDPEvent):
        return prvs.ApproximateDPMechanism(epsilon=atom.epsilon, delta=atom.delta)
    raise UnsupportedEventError(f"no PRV analysis for {atom.type_name!r} events")


def _domain_rdp(atom: ev.DPEvent, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of the PRV the package builds for ``atom`` (pure-DP PRVs for exponential and (ε, δ) atoms)."""

    if isinstance(atom, (ev.PureDPEvent, ev.ExponentialMechanismEvent, ev.ApproxDPEvent)):
        return rdp.pure_dp_rdp(orders, atom.epsilon)
    return rdp.event_rdp(atom, orders)


def safe_domain(atoms: Counter[ev.DPEvent], *, eps_error: float, delta_error: float) -> float:
    """Half-width L of a truncation domain outside which the composed PRVs have negligible mass
    (Gopi et al. 2021, Remark 5.6, with correct RDP curves).

    Args:
        atoms: the atoms with their counts (:func:`~dp_icl_plugin.accounting.events.atoms`).
        eps_error: the allowed error on ε.
        delta_error: the allowed error on δ.
    """

    orders = rdp.DEFAULT_ORDERS
    total = sum(atoms.values())
    curves = {atom: _domain_rdp(atom, orders) for atom in atoms}
    whole = sum((n * curves[a] for a, n in atoms.items()), np.zeros(len(orders)))
    bound = rdp.rdp_to_epsilon(orders, whole, delta_error / 4)[0]
    for curve in curves.values():
        bound = max(bound, rdp.rdp_to_epsilon(orders, curve, delta_error / 8 / total)[0])
    return max(bound, eps_error) + 3.0


def prv_bounds(
    atoms: Counter[ev.DPEvent],
    delta: float,
    *,
    eps_error: float = DEFAULT_EPS_ERROR,
    delta_error: float = DEFAULT_DELTA_ERROR,
) -> tuple[float, float]:
    """Certified (lower, upper) bounds on ε at ``delta`` for the composition of ``atoms``.

    ``(0, inf)`` when the numerics cannot certify anything (too large, or floating-point limits).
    The true ε of the composition lies between them; the cost grows as eps_error shrinks.

    Args:
        atoms: the atoms with their counts (:func:`~dp_icl_plugin.accounting.events.atoms`).
        delta: the δ.
        eps_error: the allowed error on ε.
        delta_error: the allowed error on δ.

    Raises:
        UnsupportedEventError: an atom has no PRV here.
    """
    from prv_accountant import PRVAccountant

    items = sorted(atoms.items(), key=lambda kv: ev.event_key(kv[0]))
    counts = [n for _, n in items]
    if len(items) > MAX_DISTINCT_ATOMS or sum(counts) > MAX_TOTAL_COMPOSITIONS:
        return 0.0, math.inf
    delta_error = min(delta_error, delta / 1000.0)
    total = sum(counts)
    domain = safe_domain(atoms, eps_error=eps_error, delta_error=delta_error)
    mesh = eps_error / math.sqrt(total / 2 * math.log(12 / delta_error))
    if not math.isfinite(domain) or domain > MAX_DOMAIN or 2 * domain / mesh > MAX_DOMAIN_POINTS:
        return 0.0, math.inf
    try:
        # Extreme values overflow inside the package; every result is checked below.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Assuming that true epsilon < eps_max": we computed it
            accountant = PRVAccountant(
                prvs=[_prv_of(atom) for atom, _ in items],
                max_self_compositions=counts,
                eps_error=eps_error,
                delta_error=delta_error,
                eps_max=domain,
            )
            lower, _, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=counts)
    except (ValueError, RuntimeError, FloatingPointError, MemoryError, OverflowError) as exc:
        # The numerics cannot certify this composition; other accountants still can.
        _log.debug("PRV accounting failed (%s); falling back", type(exc).__name__)
        return 0.0, math.inf
    # A negative bound just means ε = 0 is certified; a bound near the domain's edge is not trustworthy.
    if not (math.isfinite(upper) and math.isfinite(lower) and upper <= domain - 3.0 and lower <= upper):
        _log.debug("PRV result outside its valid domain; falling back")
        return 0.0, math.inf
    return max(float(lower), 0.0), max(float(upper), 0.0)


def prv_epsilon(
    atoms: Counter[ev.DPEvent],
    delta: float,
    *,
    eps_error: float = DEFAULT_EPS_ERROR,
    delta_error: float = DEFAULT_DELTA_ERROR,
) -> float:
    """Certified upper bound on ε at ``delta`` for the composition of ``atoms`` (``inf`` if not computable).

    Args:
        atoms: the atoms with their counts (:func:`~dp_icl_plugin.accounting.events.atoms`).
        delta: the δ.
        eps_error: the allowed error on ε.
        delta_error: the allowed error on δ.

    Raises:
        UnsupportedEventError: an atom has no PRV here.
    """
    return prv_bounds(atoms, delta, eps_error=eps_error, delta_error=delta_error)[1]
