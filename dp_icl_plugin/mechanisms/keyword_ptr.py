"""Top-k keywords by propose-test-release (Wu et al. ICLR 2024, Thm. 11; kNN DP-ICL App. D, Alg. 2).

Setting: a histogram over a keyword domain (here token ids) where each shard's answer adds 1 to each
keyword it contains. Adding or removing one unit changes at most ``group_size`` shards (1 for a record;
for a person, at most the number of shards), so every count moves by at most ``group_size``.

Distance to instability: with g = c_(k) − c_(k+1) (sorted counts, ties broken by keyword id), one shard
change lowers g by at most 2, so the top-k *set* is the same for every dataset within
d = ⌊⌊(g − 1)/2⌋ / group_size⌋ unit changes, and d has sensitivity 1 in units.

Release: the set (in keyword-id order, so the count ranking is not revealed) when d + N(0, σ²) exceeds
σ·Φ⁻¹(1 − δ₀), else nothing. The test is a Gaussian mechanism with sensitivity 1, and when d = 0 it passes
with probability at most δ₀: the release is δ₀-approximate (α, α/(2σ²))-RDP for every α.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["StableTopK", "stability_distance", "stable_top_k"]


@dataclass(frozen=True)
class StableTopK:
    """The outcome: the released keyword ids (None when the test failed).

    Attributes:
        keywords: the released keyword ids, ascending, or None.
    """

    keywords: tuple[int, ...] | None

    @property
    def passed(self) -> bool:
        """Whether the test passed (keywords were released)."""
        return self.keywords is not None


def _ranked(keywords: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((keywords, -counts))  # most frequent first, ties by keyword id
    return keywords[order], counts[order]


def stability_distance(keywords: np.ndarray, counts: np.ndarray, *, k: int, group_size: int = 1) -> int:
    """Unit changes the top-``k`` set survives (0 when one change may alter it); absent keywords count 0.

    Args:
        keywords: distinct keyword ids.
        counts: their counts.
        k: the size of the top set.
        group_size: shards one unit can change.
    """
    _, ranked = _ranked(np.asarray(keywords), np.asarray(counts, dtype=np.int64))
    kth = int(ranked[k - 1]) if len(ranked) >= k else 0
    next_ = int(ranked[k]) if len(ranked) > k else 0
    gap = kth - next_
    return max((gap - 1) // 2, 0) // group_size


def stable_top_k(
    keywords: np.ndarray,
    counts: np.ndarray,
    *,
    k: int,
    noise_std: float,
    delta: float,
    rng: np.random.Generator,
    group_size: int = 1,
) -> StableTopK:
    """Release the top-``k`` keyword ids if a noisy stability test passes (see the module docstring).

    Args:
        keywords: distinct keyword ids with a non-zero count.
        counts: their counts (non-negative integers).
        k: how many keywords to release.
        noise_std: σ of the test's Gaussian noise.
        delta: δ₀, the probability of passing when the set is unstable.
        rng: the noise source.
        group_size: shards one unit can change (1 for record-level privacy).

    Raises:
        ConfigurationError: repeated ids, mismatched or negative counts, or a parameter out of range.
    """
    ids = np.asarray(keywords, dtype=np.int64)
    cnt = np.asarray(counts)
    if ids.ndim != 1 or ids.shape != cnt.shape or np.unique(ids).size != ids.size:
        raise ConfigurationError("keywords must be distinct ids with one count each")
    if cnt.size and (not np.issubdtype(cnt.dtype, np.integer) or cnt.min() < 0):
        raise ConfigurationError("counts must be non-negative integers")
    k = check.positive_int("k", k)
    sigma = check.positive_finite("noise_std", noise_std)
    delta = check.probability_open("delta", delta)
    group_size = check.positive_int("group_size", group_size)
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator")
    distance = stability_distance(ids, cnt, k=k, group_size=group_size)
    threshold = sigma * float(-ndtri(delta))  # the Gaussian quantile with δ₀ above it (scipy.stats.norm.isf)
    if distance + rng.normal(0.0, sigma) <= threshold:
        return StableTopK(None)
    top, _ = _ranked(ids, cnt.astype(np.int64))
    return StableTopK(tuple(sorted(int(t) for t in top[:k])))
