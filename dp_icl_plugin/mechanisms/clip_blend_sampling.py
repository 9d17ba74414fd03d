"""Clip-blend token selection (Bhusal et al., "Privacy-Aware In-Context Learning for Large Language Models",
Algorithm 1 lines 6–9, eq. 2, Lemma 1–2).

One token: clip every private prompt's logits and the public prompt's logits with eq. 2, average the private
ones with a **fixed** divisor s, blend with the public row, and sample from the softmax at temperature τ::

    clip_c(z) = max(−c, z − max_j z_j + c)          entries in [−c, c], the row maximum maps to c
    z̄ = (1/s) Σ_i clip_c(z_i)                        s fixed in advance, never the number of rows present
    ẑ = (z̄ + clip_c(u)) / 2
    x ~ softmax(ẑ / τ)                               an exponential mechanism with utility ẑ

Privacy claim: add/remove one private row (one prompt, i.e. one record) moves every entry of ẑ by at most
Δ = c/(2s) (Lemma 2); the sampler is then the exponential mechanism with Pr[x] ∝ exp(ẑ_x/τ), which is
ε0-DP with ε0 = 2Δ/τ = c/(sτ) (Lemma 1), and ε0-bounded-range, hence ε0²/8-zCDP (Cesar & Rogers 2021).
Replace-one (a row swapped for another) moves an entry of ẑ by up to c/s (−c to c, halved): ε0 = 2c/(sτ).
Accounted by :func:`~dp_icl_plugin.accounting.method_events.clip_blend_event` (one exponential mechanism per
token, composed over the tokens a record takes part in). Both bounds need the divisor s to be fixed: dividing
by the number of rows present would let one row shift every other row's weight.

Inputs may be logits or log-probabilities: eq. 2 subtracts the row maximum, so a per-row shift changes
nothing. These functions work on an ``(n_rows, V)`` private array and a ``(V,)`` public row, for synthesis
and for online decoding alike; restricting to a candidate vocabulary is the caller's (public) business.
"""

from __future__ import annotations

import math

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["blended_scores", "clip_blend_token", "clip_logits", "exponential_mechanism"]

_BLOCK_ROWS = 32


def _finite_rows(x: np.ndarray, name: str) -> None:
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ConfigurationError(f"{name} must not contain NaN or +inf")
    if x.size and not np.isfinite(x).any(axis=-1).all():
        raise ConfigurationError(f"every row of {name} needs a finite entry (its maximum)")


def clip_logits(logits: np.ndarray, clip: float) -> np.ndarray:
    """Eq. 2 on every row: clip_c(z) = max(−c, z − max_j z_j + c).

    Each row is shifted so that its maximum is c, then floored at −c: entries lie in [−c, c]. The map is
    monotone (token ranking kept, up to ties among floored entries). The softmax is unchanged for every row
    whose entries all lie within 2c of its maximum (a pure shift); entries further below are raised to the
    floor, which lifts their probability (the paper's "probability floor", App. B).

    Sensitivity: the clipped row has ℓ∞ norm at most c whatever the input, which is what bounds one
    prompt's influence in :func:`blended_scores`.

    Args:
        logits: shape (..., V); −inf entries (probability 0) are allowed and become −c.
        clip: c > 0.

    Returns:
        float64 array of the same shape.

    Raises:
        ConfigurationError: ``clip`` not positive, an empty last axis, a NaN or +inf, or a row with no finite
            entry.
    """
    c = check.positive_finite("clip", clip)
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ConfigurationError(f"logits must have a non-empty last axis, got shape {z.shape}")
    _finite_rows(z, "logits")
    return np.maximum(-c, z - z.max(axis=-1, keepdims=True) + c)


def blended_scores(
    private_logits: np.ndarray, public_logits: np.ndarray, *, clip: float, subset_size: int
) -> np.ndarray:
    """ẑ = (z̄ + clip_c(u))/2 with z̄ = (1/s)·Σ_i clip_c(z_i) (Algorithm 1, lines 6–8).

    Sensitivity (Lemma 2): the divisor s is fixed, so adding or removing one private row changes the sum
    by one clipped row (ℓ∞ ≤ c) and ẑ by at most c/(2s) per entry; replacing a row changes an entry by at
    most 2c in the sum, c/s in ẑ. Any number of rows is accepted, none included (then ẑ = clip_c(u)/2):
    more rows than s raise the private weight but not the sensitivity.

    Args:
        private_logits: one row per private prompt, shape (n_rows, V); n_rows may be 0.
        public_logits: the public prompt's row, shape (V,).
        clip: c > 0.
        subset_size: the fixed divisor s ≥ 1 (set before any private data is read).

    Returns:
        ẑ, float64, shape (V,), entries in [−c·(1 + n_rows/s)/2, c·(1 + n_rows/s)/2].

    Raises:
        ConfigurationError: mismatched shapes, a bad row, or a bad ``clip`` or ``subset_size``.
    """
    s = check.positive_int("subset_size", subset_size)
    private = np.asarray(private_logits)
    public = np.asarray(public_logits, dtype=np.float64)
    if public.ndim != 1 or public.size == 0 or private.ndim != 2 or private.shape[1] != public.size:
        raise ConfigurationError(f"shapes: private {private.shape}, public {public.shape}; need (n, V) and (V,)")
    total = np.zeros(public.size)
    # in blocks of rows: hundreds of prompts × a 256k vocabulary would need gigabytes of float64 at once
    for start in range(0, private.shape[0], _BLOCK_ROWS):
        total += clip_logits(private[start : start + _BLOCK_ROWS], clip).sum(axis=0)
    return (total / s + clip_logits(public, clip)) / 2.0


def exponential_mechanism(scores: np.ndarray, *, temperature: float, rng: np.random.Generator) -> int:
    """Sample an index from softmax(scores/τ) (Lemma 1): Pr[x] ∝ exp(scores_x/τ).

    Privacy: if every score moves by at most Δ between neighbours, this is ε0-DP and ε0-bounded-range with
    ε0 = 2Δ/τ (for clip-blend scores, Δ = c/(2s) and ε0 = c/(sτ) under add/remove; see the module docstring).

    Sampled by inverse CDF from one uniform of ``rng`` on float64 probabilities (the scores of clip-blend are
    bounded, so no probability underflows to a value that matters at the accounted ε0).

    Args:
        scores: finite utilities, shape (V,).
        temperature: τ > 0.
        rng: the only source of randomness.

    Returns:
        The sampled index.

    Raises:
        ConfigurationError: a bad ``temperature`` or ``rng``, or scores that are empty or not finite.
    """
    tau = check.positive_finite("temperature", temperature)
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator")
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ConfigurationError(f"scores must be a non-empty finite vector, got shape {x.shape}")
    weights = np.exp((x - x.max()) / tau)
    cumulative = np.cumsum(weights)
    # side="right": a uniform equal to a boundary goes to the next index, so zero-weight entries are never drawn
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, x.size - 1)


def clip_blend_token(
    private_logits: np.ndarray,
    public_logits: np.ndarray,
    *,
    clip: float,
    subset_size: int,
    temperature: float | None,
    rng: np.random.Generator,
) -> int:
    """One clip-blend token: :func:`blended_scores`, then :func:`exponential_mechanism`.

    Privacy: ε0 = c/(sτ)-DP and ε0-bounded-range under add/remove of one private row (2c/(sτ) under
    replace-one): :func:`~dp_icl_plugin.accounting.method_events.clip_blend_event` with steps = 1 per call.

    Args:
        private_logits: one row per private prompt, shape (n_rows, V); n_rows may be 0.
        public_logits: the public prompt's row, shape (V,).
        clip: c > 0.
        subset_size: the fixed divisor s ≥ 1.
        temperature: τ; ``None`` switches the noise off and returns argmax ẑ (the τ → 0 limit; lowest index
            on ties). That output is NOT differentially private (ε = ∞ baselines only).
        rng: the only source of randomness (unused when ``temperature`` is None).

    Returns:
        The token index (into the V columns).

    Raises:
        ConfigurationError: as :func:`blended_scores` and :func:`exponential_mechanism`, or an infinite
            temperature.
    """
    scores = blended_scores(private_logits, public_logits, clip=clip, subset_size=subset_size)
    if temperature is None:
        return int(np.argmax(scores))
    if not math.isfinite(check.real("temperature", temperature)):
        raise ConfigurationError("temperature must be finite (or None for the noiseless argmax)")
    return exponential_mechanism(scores, temperature=temperature, rng=rng)
