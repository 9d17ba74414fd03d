"""Public vocabulary limits (Tang et al. 2024 §3; PTA Algorithm 2, "VocabSpaceLimit").

The candidate set is computed from the *public* prompt's next-token distribution only, so choosing it costs
no privacy; the private aggregation is then released only on these coordinates (post-processing).
"""

from __future__ import annotations

import numpy as np

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["limit_vocabulary"]


def limit_vocabulary(public_probs: np.ndarray, *, top_k: int, top_p: float | None = None) -> np.ndarray:
    """Token ids of V_pub = top-k(p_pub) ∩ (smallest set whose p_pub mass ≥ top_p), most likely first.

    Ties are broken by the smaller token id, so the result is a deterministic function of ``public_probs``.
    The top-p set always contains the most likely token, so V_pub is never empty.

    Args:
        public_probs: p(·|S_pub), shape (V,), non-negative.
        top_k: the static threshold k (clamped to V).
        top_p: the adaptive threshold p in (0, 1], or None for top-k only.

    Raises:
        ConfigurationError: bad probabilities, ``top_k`` or ``top_p``.
    """
    p = np.asarray(public_probs, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or p.min() < 0:
        raise ConfigurationError("public_probs must be a non-empty vector of finite non-negative probabilities")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ConfigurationError(f"top_k must be a positive integer, got {top_k!r}")
    order = np.lexsort((np.arange(p.size), -p))  # descending probability, then ascending id
    keep = order[: min(int(top_k), p.size)]
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ConfigurationError(f"top_p must lie in (0, 1], got {top_p!r}")
        mass = np.cumsum(p[order]) / p.sum()
        # smallest prefix whose mass reaches top_p (a tiny slack absorbs float rounding of the cumsum)
        n_nucleus = int(np.searchsorted(mass, top_p - 1e-12, side="left")) + 1
        keep = keep[: min(len(keep), n_nucleus)]
    return keep.astype(np.int64)
