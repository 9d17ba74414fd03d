"""The Gaussian-aggregation mechanisms of Tang et al. and PTA, and the public vocabulary limit (pure numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.stats import norm

from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.mechanisms.gaussian_aggregation import noisy_argmax, pta_distributions, restrict
from dp_icl_plugin.mechanisms.vocabulary import limit_vocabulary

logits = arrays(np.float64, st.integers(2, 12), elements=st.floats(-20, 5))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(logits, st.integers(1, 4), st.floats(0, 6), st.integers(0, 2**31))
def test_pta_rows_are_probability_vectors(row: np.ndarray, m: int, alpha: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    private = _log_softmax(rng.normal(0, 3, size=(m, row.size)))
    public, base = _log_softmax(row), _log_softmax(rng.normal(0, 3, size=row.size))
    for b in (base, None):
        out = pta_distributions(private, public, alpha=alpha, base_logprobs=b)
        assert out.shape == (m, row.size) and np.all(out >= 0)
        np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(logits, st.integers(0, 2**31))
def test_pta_with_alpha_zero_is_the_base_distribution(row: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    private = _log_softmax(rng.normal(0, 3, size=(3, row.size)))
    base = _log_softmax(row)
    out = pta_distributions(private, _log_softmax(rng.normal(size=row.size)), alpha=0.0, base_logprobs=base)
    np.testing.assert_allclose(out, np.exp(np.broadcast_to(base, out.shape)), atol=1e-12)


def test_pta_matches_equation_13_by_hand() -> None:
    p_priv = np.array([[0.5, 0.3, 0.2]])
    p_pub = np.array([0.2, 0.3, 0.5])
    p_base = np.array([0.4, 0.4, 0.2])
    expected = p_base * (p_priv[0] / p_pub) ** 2
    expected /= expected.sum()
    out = pta_distributions(np.log(p_priv), np.log(p_pub), alpha=2.0, base_logprobs=np.log(p_base))
    np.testing.assert_allclose(out[0], expected, rtol=1e-12)
    pa3 = pta_distributions(np.log(p_priv), np.log(p_pub), alpha=2.0, base_logprobs=None)[0]
    np.testing.assert_allclose(pa3, (p_priv[0] / p_pub) ** 2 / ((p_priv[0] / p_pub) ** 2).sum(), rtol=1e-12)


def test_pta_survives_zero_probabilities() -> None:
    private = np.array([[-np.inf, 0.0, -np.inf]])
    public = np.array([-np.inf, 0.0, -np.inf])
    out = pta_distributions(private, public, alpha=1.5, base_logprobs=public)
    assert np.all(np.isfinite(out)) and out[0, 1] == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, st.integers(1, 30), elements=st.floats(0, 1)),
    st.integers(1, 40),
    st.one_of(st.none(), st.floats(0.01, 1.0)),
)
def test_vocabulary_limit_is_top_k_intersect_smallest_nucleus(p: np.ndarray, k: int, top_p: float | None) -> None:
    if p.sum() == 0:
        p = np.ones_like(p)
    keep = limit_vocabulary(p, top_k=k, top_p=top_p)
    assert 1 <= keep.size <= min(k, p.size) and len(set(keep.tolist())) == keep.size
    # most likely first, and nothing left out is more likely than something kept
    assert np.all(np.diff(p[keep]) <= 0)
    dropped = np.setdiff1d(np.arange(p.size), keep)
    if dropped.size:
        assert p[dropped].max() <= p[keep].min()
    if top_p is not None and keep.size < min(k, p.size):
        # cut by the nucleus: its mass reaches top_p, and one token fewer would not
        mass = np.sort(p)[::-1].cumsum() / p.sum()
        assert mass[keep.size - 1] >= top_p - 1e-9
        assert keep.size == 1 or mass[keep.size - 2] < top_p


def test_vocabulary_limit_bad_input() -> None:
    for kwargs in ({"top_k": 0}, {"top_k": 2, "top_p": 0.0}, {"top_k": 2, "top_p": 1.5}):
        with pytest.raises(ConfigurationError):
            limit_vocabulary(np.array([0.5, 0.5]), **kwargs)
    with pytest.raises(ConfigurationError):
        limit_vocabulary(np.array([0.5, np.nan]), top_k=1)


def test_restrict_renormalises_or_not() -> None:
    probs = np.array([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
    vocab = np.array([0, 1])
    np.testing.assert_allclose(restrict(probs, vocab, renormalize=False), [[0.5, 0.25], [0.0, 0.0]])
    np.testing.assert_allclose(restrict(probs, vocab, renormalize=True), [[2 / 3, 1 / 3], [0.5, 0.5]])


def test_noiseless_argmax_is_the_argmax_of_the_sum() -> None:
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(7), size=5)
    assert noisy_argmax(rows, noise_multiplier=0.0, rng=rng) == int(np.argmax(rows.sum(axis=0)))


def test_noisy_argmax_flip_rate_matches_the_gaussian() -> None:
    """Two candidates whose sums differ by d: the noisy argmax flips with probability Φ(−d / (2σ)), since the
    difference of the two noises is N(0, 2·(√2σ)²). 20,000 draws; tolerance 4.5 standard errors."""
    sigma, n = 0.5, 20_000
    rows = np.array([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])  # sums 1.8 vs 1.2: d = 0.6
    rng = np.random.default_rng(1234)
    flips = sum(noisy_argmax(rows, noise_multiplier=sigma, rng=rng) == 1 for _ in range(n))
    expected = norm.cdf(-0.6 / (2 * sigma))
    assert abs(flips / n - expected) < 4.5 * math.sqrt(expected * (1 - expected) / n)


def test_clip_negative_falls_back_to_the_first_candidate() -> None:
    rows = np.zeros((2, 4))
    rng = np.random.default_rng(0)
    assert noisy_argmax(rows, noise_multiplier=0.0, rng=rng, clip_negative=True) == 0


def test_noisy_argmax_refuses_what_would_break_its_sensitivity() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigurationError, match="probability"):
        noisy_argmax(np.array([[0.9, 0.9]]), noise_multiplier=1.0, rng=rng)
    with pytest.raises(ConfigurationError):
        noisy_argmax(np.array([[-0.1, 0.5]]), noise_multiplier=1.0, rng=rng)
    with pytest.raises(ConfigurationError):
        noisy_argmax(np.array([[0.5, 0.5]]), noise_multiplier=-1.0, rng=rng)
