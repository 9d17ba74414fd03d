"""Keywords by Gaussian thresholding over the whole vocabulary (DP set union with a Gaussian count).

Setting: each shard's answer contributes its first ``per_answer`` distinct keyword tokens (a set of at most
m ids) to a histogram h over the public vocabulary V, one count per shard. The release is every token
whose noisy count h_t + N(0, σ²) exceeds a public threshold T, noise drawn for **every** token of V (zero
counts included), ranked by noisy count and cut to ``limit``.

Neighbouring relation and sensitivity: adding or removing one unit changes the demonstrations of at most
g shards (g = 1 for a record: the shard's next candidate moves up; at most the number of shards for a
person). A changed shard swaps its set A for another set B, |A|, |B| ≤ m, so h moves by ‖1_A − 1_B‖₂ ≤ √(2m)
per shard, √(2m)·g in all.

Records as voters (keyword hints, ``KNNConfig(keyword_source="records")``): every candidate record adds the
first m distinct keywords of its own text (:func:`record_keywords`), one count each, and nothing else decides
who votes (the candidates are fixed by the public query and threshold, each record's membership by itself).
Adding or removing one record adds or removes its set A, |A| ≤ m: ‖1_A‖₂ ≤ √m; a person with c candidate
records moves h by at most c·√m (triangle inequality; :func:`record_vote_sensitivity`). No record moves up to
take another's place, so there is no swap factor √2.

Accounting: noise on the full vocabulary makes the noisy histogram exactly a Gaussian mechanism of that ℓ2
sensitivity, (α, α·Δ²/(2σ²))-RDP (Mironov 2017, Prop. 7); the threshold, the ranking and the cut are
post-processing. No δ is spent: unlike partition selection over an unbounded domain (Gopi et al., ICML 2020;
Wilson et al., PoPETs 2020) or propose-test-release (Wu et al., ICLR 2024, Thm. 11), nothing is released
without noise. T only sets the utility: it is chosen so that, on average, ``false_keywords`` of the tokens
no shard said pass (T = σ·Φ̄⁻¹(false_keywords / |V|)).
The noise is numpy's double-precision normal sampler, as for every Gaussian mechanism in this library; only
whether each noisy count crosses T (and the order of those that do) leaves the mechanism.

This replaces the top-k PTR of Wu et al. where the shards agree on many tokens: agreement ties the top
counts, the top-k set is then unstable for every k, and the PTR test fails (benchmarks/knn/keyword_ties.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = [
    "ThresholdKeywords",
    "answer_keywords",
    "keyword_threshold",
    "record_keywords",
    "record_vote_sensitivity",
    "threshold_keywords",
    "threshold_sensitivity",
]

WORD = re.compile(r"\w+")

FALSE_KEYWORDS = 0.01  # tokens no shard said that pass, on average per release


@dataclass(frozen=True)
class ThresholdKeywords:
    """The outcome: released token ids, highest noisy count first (None when none passed).

    Attributes:
        keywords: the released token ids, or None.
        threshold: the threshold T the noisy counts were compared with.
    """

    keywords: tuple[int, ...] | None
    threshold: float

    @property
    def passed(self) -> bool:
        """Whether any keyword was released."""
        return self.keywords is not None


def threshold_sensitivity(per_answer: int, shards_changed: int = 1) -> float:
    """ℓ2 sensitivity of the histogram: √(2m) per shard whose answer can change.

    Args:
        per_answer: m, the keywords each answer contributes.
        shards_changed: g, the shards one unit can change.

    Raises:
        ConfigurationError: an argument is not a positive integer.
    """
    m = check.positive_int("per_answer", per_answer)
    return math.sqrt(2.0 * m) * check.positive_int("shards_changed", shards_changed)


def record_vote_sensitivity(per_record: int, records: int = 1) -> float:
    """ℓ2 sensitivity of the histogram when records vote themselves: √m per record added or removed.

    Args:
        per_record: m, the keywords each record contributes.
        records: c, the candidate records of the unit added or removed.

    Raises:
        ConfigurationError: an argument is not a positive integer.
    """
    m = check.positive_int("per_record", per_record)
    return math.sqrt(m) * check.positive_int("records", records)


def record_keywords(
    text: str, *, per_record: int, encode: Callable[[str], list[int]], is_keyword: Callable[[int], bool]
) -> list[int]:
    """One record's vote: the first ``per_record`` distinct words of ``text`` (lower-cased, in order) that the
    tokenizer writes as one keyword token after a space (so a released token is a whole word), as token ids;
    leading pieces that are no keyword (a SentencePiece tokenizer's lone "▁") are dropped first. A function of
    this text alone; a word the tokenizer cannot encode is skipped. A word of several tokens cannot vote: the
    release's public domain is the vocabulary.

    Args:
        text: the record's text (private).
        per_record: m, at most this many keywords.
        encode: text → token ids, without special tokens.
        is_keyword: whether a token id is a keyword (a public property of the token).

    Raises:
        ConfigurationError: ``per_record`` is not a positive integer.
    """
    m = check.positive_int("per_record", per_record)
    out: list[int] = []
    for word in dict.fromkeys(w.lower() for w in WORD.findall(text)):
        try:
            ids = encode(" " + word)
        except Exception:  # tokenizers raise plain Exception for what they cannot encode: this word does not vote
            continue
        while len(ids) > 1 and not is_keyword(int(ids[0])):
            ids = ids[1:]
        if len(ids) != 1 or int(ids[0]) in out or not is_keyword(int(ids[0])):
            continue
        out.append(int(ids[0]))
        if len(out) == m:
            break
    return out


def answer_keywords(tokens: Iterable[int], *, per_answer: int | None, is_keyword: Callable[[int], bool]) -> list[int]:
    """The first ``per_answer`` (None: all) distinct tokens of one answer that ``is_keyword`` accepts, in order.

    Args:
        tokens: the answer's token ids.
        per_answer: how many keywords to keep, or None.
        is_keyword: whether a token id is a keyword.

    Raises:
        ConfigurationError: ``per_answer`` is not a positive integer.
    """
    m = None if per_answer is None else check.positive_int("per_answer", per_answer)
    out: list[int] = []
    seen: set[int] = set()
    for t in tokens:
        t = int(t)
        if t in seen or not is_keyword(t):
            continue
        seen.add(t)
        out.append(t)
        if len(out) == m:
            break
    return out


def keyword_threshold(noise_std: float, vocab_size: int, *, false_keywords: float = FALSE_KEYWORDS) -> float:
    """T with |V|·P[N(0, σ²) > T] = ``false_keywords``.

    Args:
        noise_std: σ.
        vocab_size: |V|.
        false_keywords: the expected number of zero-count tokens that pass.

    Raises:
        ConfigurationError: a parameter is out of range, or ``false_keywords`` ≥ |V|.
    """
    sigma = check.positive_finite("noise_std", noise_std)
    v = check.positive_int("vocab_size", vocab_size)
    rate = check.positive_finite("false_keywords", false_keywords)
    if rate >= v:
        raise ConfigurationError("false_keywords must be smaller than the vocabulary size")
    return sigma * float(-ndtri(rate / v))  # the normal quantile above which rate/v of the mass lies


def threshold_keywords(
    counts: np.ndarray,
    *,
    noise_std: float,
    limit: int,
    rng: np.random.Generator,
    false_keywords: float = FALSE_KEYWORDS,
) -> ThresholdKeywords:
    """Release the tokens whose noisy count passes the threshold (see the module docstring).

    Args:
        counts: the histogram over the whole vocabulary (index = token id), non-negative integers.
        noise_std: σ of the Gaussian noise added to every count.
        limit: at most this many keywords, the highest noisy counts (post-processing).
        rng: the noise source.
        false_keywords: the expected number of zero-count tokens that pass (sets the threshold).

    Raises:
        ConfigurationError: a malformed histogram, a parameter out of range, or a bad ``rng``.
    """
    h = np.asarray(counts)
    if h.ndim != 1 or h.size == 0:
        raise ConfigurationError("counts must be a non-empty 1-d histogram over the vocabulary")
    if not np.issubdtype(h.dtype, np.integer) or h.min() < 0:
        raise ConfigurationError("counts must be non-negative integers")
    sigma = check.positive_finite("noise_std", noise_std)
    limit = check.positive_int("limit", limit)
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator")
    threshold = keyword_threshold(sigma, h.size, false_keywords=false_keywords)
    noisy = h + rng.normal(0.0, sigma, size=h.size)  # every token, said or not: a plain Gaussian mechanism
    passed = np.flatnonzero(noisy > threshold)
    if not passed.size:
        return ThresholdKeywords(None, threshold)
    ranked = passed[np.argsort(-noisy[passed], kind="stable")][:limit]
    return ThresholdKeywords(tuple(int(t) for t in ranked), threshold)
