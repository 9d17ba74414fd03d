"""Gaussian aggregation of next-token distributions (Tang et al. 2024) and PTA's reshaping (Yamasaki et al. 2025).

Privacy claim (for :func:`noisy_argmax`): one record sits in at most one prompt, so it changes at most one
row of ``distributions``; every row is a (sub-)probability vector (non-negative, sum ≤ 1), so two rows
differ by at most √2 in ℓ2 (Tang et al. 2024, §3; PTA App. D.2). Adding N(0, 2σ²) to each coordinate of the
sum is the Gaussian mechanism with noise multiplier σ and sensitivity √2 for one prompt's presence; the
argmax is post-processing. Composed over tokens after Poisson subsampling by ``method_events.tang_event``
under the ledger's relation (replace-one directly with dp-accounting's PLD, or add/remove).

Reshaping (:func:`pta_distributions`, PTA eq. 13) and restriction to a public vocabulary
(:func:`restrict`) act on each prompt's own distribution and return probability vectors, so they keep the
sensitivity: PTA costs exactly what Tang et al.'s baseline costs.
"""

from __future__ import annotations

import math

import numpy as np

from dp_icl_plugin.accounting.method_events import SIMPLEX_SENSITIVITY
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["noisy_argmax", "pta_distributions", "restrict"]

_LOG_FLOOR = -1e4  # stands for log 0, so that 0/0 ratios stay finite (their token gets probability ~0)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def pta_distributions(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    alpha: float,
    base_logprobs: np.ndarray | None,
) -> np.ndarray:
    """PTA eq. 13: p_i[v] ∝ p_base[v] · (p(v|S_priv^i) / p(v|S_pub))^α, normalised over the vocabulary.

    Args:
        private_logprobs: log p(·|S_priv^i), shape (M, V).
        public_logprobs: log p(·|S_pub), shape (V,).
        alpha: amplification strength α ≥ 0 (α = 0 gives p_base).
        base_logprobs: log p_base, shape (V,), or None to drop the base term (the paper's "PA3").

    Returns:
        Probability vectors, shape (M, V), float64.

    Raises:
        ConfigurationError: ``alpha`` negative or not finite, or mismatched shapes.
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ConfigurationError(f"alpha must be a finite number ≥ 0, got {alpha!r}")
    priv = np.maximum(np.asarray(private_logprobs, dtype=np.float64), _LOG_FLOOR)
    pub = np.maximum(np.asarray(public_logprobs, dtype=np.float64), _LOG_FLOOR)
    if priv.ndim != 2 or pub.shape != priv.shape[1:]:
        raise ConfigurationError(f"shapes: private {priv.shape}, public {pub.shape}; need (M, V) and (V,)")
    scores = alpha * (priv - pub)
    if base_logprobs is not None:
        base = np.maximum(np.asarray(base_logprobs, dtype=np.float64), _LOG_FLOOR)
        if base.shape != pub.shape:
            raise ConfigurationError(f"base shape {base.shape}; need {pub.shape}")
        scores = scores + base
    return np.exp(_log_softmax(scores))


def restrict(probs: np.ndarray, vocabulary: np.ndarray, *, renormalize: bool) -> np.ndarray:
    """The columns ``vocabulary`` of probability rows; renormalised to sum 1 (Tang et al.) or not (PTA).

    A row with no mass on the vocabulary becomes uniform over it when renormalised.

    Args:
        probs: probability rows, shape (M, V).
        vocabulary: the candidate token ids (columns kept, in order).
        renormalize: renormalise each row over the candidates.

    Returns:
        Shape (M, K).
    """
    p = np.asarray(probs, dtype=np.float64)[:, vocabulary]
    if not renormalize:
        return p
    mass = p.sum(axis=1, keepdims=True)
    uniform = np.full_like(p, 1.0 / p.shape[1])
    return np.where(mass > 0, p / np.where(mass > 0, mass, 1.0), uniform)


def noisy_argmax(
    distributions: np.ndarray,
    *,
    noise_multiplier: float,
    rng: np.random.Generator,
    clip_negative: bool = False,
) -> int:
    """argmax_v (Σ_i p_i[v] + N(0, 2σ²)): the Gaussian mechanism on a sum of probability vectors.

    Args:
        distributions: the M (sub-)probability vectors over the candidate tokens, shape (M, K).
        noise_multiplier: σ; the noise std on the sum is σ·√2 (sensitivity √2). 0 gives the exact argmax.
        rng: the noise source.
        clip_negative: take the argmax of max(·, 0) (PTA Algorithm 1, line 10): when every noisy entry is
            negative the first candidate (the most likely public token) wins.

    Returns:
        The index (into the K candidates) released.

    Raises:
        ConfigurationError: a row that is not a (sub-)probability vector, or a bad ``noise_multiplier``.
    """
    p = np.asarray(distributions, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] == 0 or p.shape[0] == 0:
        raise ConfigurationError(f"distributions must have shape (M ≥ 1, K ≥ 1), got {p.shape}")
    if not np.all(np.isfinite(p)) or p.min() < 0 or np.any(p.sum(axis=1) > 1.0 + 1e-6):
        raise ConfigurationError("each row must be a (sub-)probability vector: the √2 sensitivity depends on it")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ConfigurationError(f"noise_multiplier must be finite and ≥ 0, got {noise_multiplier!r}")
    total = p.sum(axis=0)
    if noise_multiplier > 0:
        total = total + rng.normal(0.0, noise_multiplier * SIMPLEX_SENSITIVITY, size=total.shape)
    if clip_negative:
        total = np.maximum(total, 0.0)
    return int(np.argmax(total))
