"""Report-noisy-max, the keyword propose-test-release and the keyword threshold: statistics and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dp_icl_plugin import ConfigurationError
from dp_icl_plugin.mechanisms.keyword_ptr import _ranked, stability_distance, stable_top_k
from dp_icl_plugin.mechanisms.keyword_threshold import (
    answer_keywords,
    keyword_threshold,
    threshold_keywords,
    threshold_sensitivity,
)
from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max


def test_noisy_max_picks_the_leader_as_often_as_the_gaussian_says() -> None:
    # P(argmax = 0) for counts (10, 9) and noise σ: P(N(0, 2σ²) > −1) = Φ(1/(σ√2)).
    rng = np.random.default_rng(7)
    sigma, n = 2.0, 20_000
    wins = sum(report_noisy_max(np.array([10.0, 9.0]), noise_std=sigma, rng=rng) == 0 for _ in range(n))
    expected = norm.cdf(1 / (sigma * math.sqrt(2)))
    assert abs(wins / n - expected) < 4 * math.sqrt(expected * (1 - expected) / n)  # 4 standard errors


def test_noisy_max_refuses_bad_input() -> None:
    rng = np.random.default_rng(0)
    for counts in (np.array([]), np.array([[1.0]]), np.array([np.nan, 1.0])):
        with pytest.raises(ConfigurationError):
            report_noisy_max(counts, noise_std=1.0, rng=rng)
    with pytest.raises(ConfigurationError):
        report_noisy_max(np.array([1.0, 2.0]), noise_std=0.0, rng=rng)
    with pytest.raises(ConfigurationError):
        report_noisy_max(np.array([1.0, 2.0]), noise_std=1.0, rng=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("counts", "k", "group", "expected"),
    [
        ([9, 5, 2], 1, 1, 1),  # gap 4: (4 − 1) // 2 = 1
        ([9, 8, 2], 1, 1, 0),  # gap 1
        ([9, 8, 2], 2, 1, 2),  # gap 6 → 2
        ([9, 8, 2], 2, 2, 1),  # a person touching 2 shards: 2 // 2
        ([9], 1, 1, 4),  # the (k+1)-th count is 0
        ([9], 2, 1, 0),  # fewer than k keywords: the k-th count is 0
        ([5, 5, 1], 1, 1, 0),  # a tie at the top
    ],
)
def test_stability_distance(counts, k, group, expected) -> None:
    ids = np.arange(len(counts)) + 100
    assert stability_distance(ids, np.array(counts), k=k, group_size=group) == expected


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=12),
    k=st.integers(1, 4),
    data=st.data(),
)
def test_a_stable_top_k_survives_any_single_shard_change(counts, k, data) -> None:
    ids = np.arange(len(counts), dtype=np.int64)
    cnt = np.array(counts, dtype=np.int64)
    if stability_distance(ids, cnt, k=k) < 1:
        return
    # One shard changes its answer: it may drop any keywords it had (count ≥ 1) and add any others.
    drop = np.array(data.draw(st.lists(st.booleans(), min_size=len(counts), max_size=len(counts))))
    add = np.array(data.draw(st.lists(st.booleans(), min_size=len(counts), max_size=len(counts))))
    changed = cnt - (drop & (cnt > 0)) + (add & ~(drop & (cnt > 0)))
    extra = data.draw(st.booleans())  # or a keyword no shard had before
    ids2 = np.append(ids, 99) if extra else ids
    changed = np.append(changed, 1) if extra else changed
    before = set(_ranked(ids, cnt)[0][:k].tolist())
    after = set(_ranked(ids2, changed)[0][:k].tolist())
    assert before == after


def test_ptr_passes_an_unstable_histogram_with_probability_delta() -> None:
    rng = np.random.default_rng(3)
    delta, n = 0.05, 20_000
    ids, cnt = np.array([1, 2, 3]), np.array([7, 7, 1])  # distance 0 for k = 1
    passes = sum(stable_top_k(ids, cnt, k=1, noise_std=2.0, delta=delta, rng=rng).passed for _ in range(n))
    assert abs(passes / n - delta) < 4 * math.sqrt(delta * (1 - delta) / n)


def test_ptr_releases_a_clear_winner_in_keyword_id_order() -> None:
    rng = np.random.default_rng(0)
    out = stable_top_k(np.array([40, 10, 30, 20]), np.array([50, 49, 0, 1]), k=2, noise_std=1.0, delta=1e-6, rng=rng)
    assert out.keywords == (10, 40)  # the set, in id order: the ranking by count is not revealed


def test_ptr_refuses_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigurationError):
        stable_top_k(np.array([1, 1]), np.array([2, 3]), k=1, noise_std=1.0, delta=1e-6, rng=rng)
    with pytest.raises(ConfigurationError):
        stable_top_k(np.array([1, 2]), np.array([2.5, 3.0]), k=1, noise_std=1.0, delta=1e-6, rng=rng)
    with pytest.raises(ConfigurationError):
        stable_top_k(np.array([1, 2]), np.array([2, 3]), k=1, noise_std=1.0, delta=0.0, rng=rng)


# ------------------------------------------------------------------ keyword threshold (Gaussian, whole vocabulary)


def test_the_threshold_lets_the_stated_number_of_unsaid_tokens_through() -> None:
    # T solves |V|·P[N(0, σ²) > T] = false_keywords (an independent computation with scipy's survival function).
    t = keyword_threshold(2.5, 49_152, false_keywords=0.01)
    assert 49_152 * norm.sf(t / 2.5) == pytest.approx(0.01, rel=1e-9)
    # Seeded: 300 releases over 2,000 unsaid tokens with 3 expected false keywords each: mean 3 ± 4 standard errors.
    rng = np.random.default_rng(11)
    zero = np.zeros(2_000, dtype=np.int64)
    n = [
        len(threshold_keywords(zero, noise_std=1.0, limit=10**6, rng=rng, false_keywords=3.0).keywords or ())
        for _ in range(300)
    ]
    assert abs(np.mean(n) - 3.0) < 4 * math.sqrt(3.0 / 300)


def test_a_said_token_passes_as_often_as_its_gaussian_count_says() -> None:
    rng = np.random.default_rng(5)
    counts = np.zeros(1_000, dtype=np.int64)
    counts[7] = 6
    t = keyword_threshold(2.0, counts.size)
    p = norm.sf((t - 6) / 2.0)  # P[6 + N(0, 4) > T]
    n = 20_000
    hits = sum(7 in (threshold_keywords(counts, noise_std=2.0, limit=5, rng=rng).keywords or ()) for _ in range(n))
    assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_threshold_keywords_come_highest_noisy_count_first_cut_to_the_limit() -> None:
    counts = np.zeros(500, dtype=np.int64)
    counts[[40, 10, 30, 20]] = [90, 70, 80, 60]
    out = threshold_keywords(counts, noise_std=0.5, limit=3, rng=np.random.default_rng(0))
    assert out.keywords == (40, 30, 10) and out.passed
    assert (
        threshold_keywords(np.zeros(500, dtype=np.int64), noise_std=0.5, limit=3, rng=np.random.default_rng(0)).keywords
        is None
    )


def test_answer_keywords_are_the_first_m_distinct_accepted_tokens() -> None:
    assert answer_keywords([5, 1, 5, 2, 9, 3, 4], per_answer=3, is_keyword=lambda t: t != 2) == [5, 1, 9]
    assert answer_keywords([5, 1, 5, 2], per_answer=None, is_keyword=lambda t: True) == [5, 1, 2]


@settings(max_examples=300, deadline=None)
@given(
    answers=st.lists(st.lists(st.integers(0, 30), max_size=20), min_size=1, max_size=8),
    replacement=st.lists(st.integers(0, 30), max_size=20),
    changed=st.integers(0, 7),
    m=st.integers(1, 6),
)
def test_one_shard_changing_its_answer_moves_the_histogram_by_at_most_the_sensitivity(
    answers, replacement, changed, m
) -> None:
    def histogram(shards: list[list[int]]) -> np.ndarray:
        h = np.zeros(31)
        for tokens in shards:
            h[answer_keywords(tokens, per_answer=m, is_keyword=lambda t: t % 5 != 0)] += 1
        return h

    changed %= len(answers)
    for other in (
        [*answers[:changed], replacement, *answers[changed + 1 :]],
        [*answers[:changed], *answers[changed + 1 :]],
    ):
        assert np.linalg.norm(histogram(answers) - histogram(other)) <= threshold_sensitivity(m) + 1e-12


def test_threshold_refuses_bad_input() -> None:
    rng = np.random.default_rng(0)
    for bad in (
        np.array([1.5, 2.0]),
        np.array([-1, 2]),
        np.zeros((2, 2), dtype=np.int64),
        np.array([], dtype=np.int64),
    ):
        with pytest.raises(ConfigurationError):
            threshold_keywords(bad, noise_std=1.0, limit=2, rng=rng)
    with pytest.raises(ConfigurationError):
        threshold_keywords(np.array([1, 2]), noise_std=0.0, limit=2, rng=rng)
    with pytest.raises(ConfigurationError):
        threshold_keywords(np.array([1, 2]), noise_std=1.0, limit=2, rng=rng, false_keywords=2.0)
    with pytest.raises(ConfigurationError):
        threshold_keywords(np.array([1, 2]), noise_std=1.0, limit=2, rng=None)  # type: ignore[arg-type]
