"""Report-noisy-max with Gaussian noise (RNM-Gaussian; Wu et al. ICLR 2024, §3; kNN DP-ICL App. C.1).

Privacy claim: if adding or removing one unit changes the vote histogram by at most Δ in ℓ2 (e.g. one
shard's vote moving from one label to another: Δ = √2), adding N(0, σ²) to every count is the Gaussian
mechanism with noise multiplier σ/Δ, i.e. (α, αΔ²/(2σ²))-RDP (Mironov 2017, Prop. 7); the argmax is
post-processing. The caller charges that cost before calling.
"""

from __future__ import annotations

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["report_noisy_max"]


def report_noisy_max(counts: np.ndarray, *, noise_std: float, rng: np.random.Generator) -> int:
    """The index of the largest count after independent N(0, noise_std²) noise on each count.

    Args:
        counts: the vote counts, shape (L,).
        noise_std: σ.
        rng: the noise source.

    Raises:
        ConfigurationError: empty or non-finite counts, a bad ``noise_std``, or a bad ``rng``.
    """
    votes = np.asarray(counts, dtype=float)
    if votes.ndim != 1 or votes.size == 0 or not np.isfinite(votes).all():
        raise ConfigurationError("counts must be a non-empty 1-d array of finite numbers")
    sigma = check.positive_finite("noise_std", noise_std)
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator")
    return int(np.argmax(votes + rng.normal(0.0, sigma, size=votes.size)))
