"""Numerical composition with privacy random variables (Gopi, Lee & Wutschitz 2021) via ``prv-accountant``.

Handles compositions (heterogeneous included) of Gaussian, Poisson-subsampled Gaussian, pure-DP and
(ε, δ)-DP atoms. The reported ε is the package's certified *upper* bound (estimate + ``eps_error``,
evaluated at δ − ``delta_error``), never the point estimate: with eps_error = 0.01 and
delta_error = 1e-10 this reproduces the σ of PTA's Table 4 exactly.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.errors import UnsupportedEventError

__all__ = ["DEFAULT_DELTA_ERROR", "DEFAULT_EPS_ERROR", "prv_bounds", "prv_epsilon"]

DEFAULT_EPS_ERROR = 0.01
DEFAULT_DELTA_ERROR = 1e-10

# Above these sizes the discretised domain grows past what one process should hold; the caller then
# falls back to the other (valid, looser) accountants.
MAX_TOTAL_COMPOSITIONS = 200_000
MAX_DISTINCT_ATOMS = 64

_log = logging.getLogger(__name__)


def _prv_of(atom: ev.DPEvent):  # noqa: ANN202 - prv_accountant has no type stubs
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
    """
    from prv_accountant import PRVAccountant

    items = sorted(atoms.items(), key=lambda kv: ev.event_key(kv[0]))
    counts = [n for _, n in items]
    if len(items) > MAX_DISTINCT_ATOMS or sum(counts) > MAX_TOTAL_COMPOSITIONS:
        return 0.0, math.inf
    delta_error = min(delta_error, delta / 1000.0)
    try:
        accountant = PRVAccountant(
            prvs=[_prv_of(atom) for atom, _ in items],
            max_self_compositions=counts,
            eps_error=eps_error,
            delta_error=delta_error,
        )
        lower, _, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=counts)
    except (ValueError, RuntimeError, FloatingPointError, MemoryError, OverflowError) as exc:
        # The numerics cannot certify this composition; other accountants still can.
        _log.debug("PRV accounting failed (%s); falling back", type(exc).__name__)
        return 0.0, math.inf
    lower = max(float(lower), 0.0) if math.isfinite(lower) else 0.0
    upper = max(float(upper), 0.0) if math.isfinite(upper) else math.inf
    return lower, upper


def prv_epsilon(
    atoms: Counter[ev.DPEvent],
    delta: float,
    *,
    eps_error: float = DEFAULT_EPS_ERROR,
    delta_error: float = DEFAULT_DELTA_ERROR,
) -> float:
    """Certified upper bound on ε at ``delta`` for the composition of ``atoms`` (``inf`` if not computable)."""
    return prv_bounds(atoms, delta, eps_error=eps_error, delta_error=delta_error)[1]
