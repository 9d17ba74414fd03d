"""In-context learning prompts and the PTA train/test split, drawn from a :class:`GincLanguage`.

A prompt (Xie et al. 2022, §4) has a concept θ* (a pretraining HMM) and a start property. Each of its
``n_shots`` examples starts from a uniformly random entity at the start property, runs ``k`` hidden states
under θ* and is followed by the delimiter "/"; the query is the first k−1 tokens of one more such example.
Its label is the Bayes-optimal next token under θ* given the query (exact forward filtering), not the token
that happened to be sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.language import GincLanguage

__all__ = ["GincExample", "IclPrompts", "bayes_optimal_labels", "pta_split", "sample_icl_prompts"]


@dataclass(frozen=True)
class IclPrompts:
    """A batch of ICL prompts of one shape (same ``n_shots`` and ``k``), as arrays.

    Attributes:
        concepts: each prompt's concept, shape (n,).
        start_properties: each prompt's start property, shape (n,).
        labels: each prompt's label, shape (n,).
        examples: shape (n, n_shots, k).
        queries: shape (n, k − 1).
    """

    concepts: np.ndarray
    start_properties: np.ndarray
    examples: np.ndarray
    queries: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def token_ids(self) -> np.ndarray:
        """Each prompt as one token sequence: ``ex_1 / ex_2 / ... ex_n / query``, shape (n, length)."""
        n, shots, k = self.examples.shape
        delimited = np.concatenate([self.examples, np.zeros((n, shots, 1), dtype=np.int64)], axis=2)
        return np.concatenate([delimited.reshape(n, shots * (k + 1)), self.queries], axis=1)


@dataclass(frozen=True)
class GincExample:
    """One labelled example of the PTA split: the query tokens and their Bayes-optimal next token."""

    concept: int
    start_property: int
    tokens: tuple[int, ...]
    label: int


def _check_k(k: int) -> int:
    if check.positive_int("k", k) < 2:
        raise ConfigurationError("k must be at least 2 (a query is the first k − 1 tokens of an example)")
    return k


def _sample_examples(
    language: GincLanguage, concepts: np.ndarray, start_properties: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
    c = language.config
    entities = rng.integers(0, c.n_entities, size=len(concepts))
    paths = language.sample_states(concepts, entities * c.n_properties + start_properties, k, rng)
    return language.emission[paths]


def bayes_optimal_labels(
    language: GincLanguage, concepts: np.ndarray, start_properties: np.ndarray, queries: np.ndarray
) -> np.ndarray:
    """argmax_v p(v | query, θ*, start property), ties to the smallest token id."""
    labels = np.empty(len(queries), dtype=np.int64)
    for concept in np.unique(concepts):
        rows = np.flatnonzero(concepts == concept)
        beliefs = np.stack([language.start_belief(int(s)) for s in start_properties[rows]])
        labels[rows] = language.next_token_distribution(int(concept), queries[rows], beliefs).argmax(axis=1)
    return labels


def _draw_start_properties(language: GincLanguage, n: int, rng: np.random.Generator) -> np.ndarray:
    # Property 0 is the delimiter's; an example never starts on it.
    return rng.integers(1, language.config.n_properties, size=n)


def sample_icl_prompts(
    language: GincLanguage, *, n_prompts: int, n_shots: int, k: int, rng: np.random.Generator
) -> IclPrompts:
    """``n_prompts`` prompts, each with a uniformly drawn pretraining concept and start property."""
    n = check.positive_int("n_prompts", n_prompts)
    if isinstance(n_shots, bool) or not isinstance(n_shots, int) or n_shots < 0:
        raise ConfigurationError(f"n_shots must be a non-negative integer, got {n_shots!r}")
    k = _check_k(k)
    concepts = rng.integers(0, language.config.n_pretrain_hmms, size=n)
    starts = _draw_start_properties(language, n, rng)
    examples = (
        np.stack([_sample_examples(language, concepts, starts, k, rng) for _ in range(n_shots)], axis=1)
        if n_shots
        else np.zeros((n, 0, k), dtype=np.int64)
    )
    queries = _sample_examples(language, concepts, starts, k, rng)[:, : k - 1]
    labels = bayes_optimal_labels(language, concepts, starts, queries)
    return IclPrompts(concepts, starts, examples, queries, labels)


def pta_split(
    language: GincLanguage,
    *,
    k: int = 10,
    n_train: int = 1600,
    n_test: int = 400,
    rng: np.random.Generator,
    max_draws: int = 200_000,
) -> dict[int, tuple[list[GincExample], list[GincExample]]]:
    """PTA's GINC split (Yamasaki et al. 2025, App. F.2): per pretraining concept, ``n_train`` train and
    ``n_test`` test examples with distinct query texts (no text in both, no text twice).

    De-duplication matters for privacy: two copies of one record are two records to the accountant but
    one to an attacker. Raises ConfigurationError if a concept cannot produce enough distinct queries
    within ``max_draws`` samples.
    """
    k = _check_k(k)
    n_train = check.positive_int("n_train", n_train)
    n_test = check.positive_int("n_test", n_test)
    need = n_train + n_test
    split: dict[int, tuple[list[GincExample], list[GincExample]]] = {}
    for concept in language.pretrain_concepts:
        seen: dict[tuple[int, ...], GincExample] = {}
        drawn = 0
        while len(seen) < need and drawn < max_draws:
            batch = min(4 * need, max_draws - drawn)
            drawn += batch
            concepts = np.full(batch, concept)
            starts = _draw_start_properties(language, batch, rng)
            queries = _sample_examples(language, concepts, starts, k, rng)[:, : k - 1]
            labels = bayes_optimal_labels(language, concepts, starts, queries)
            for start, query, label in zip(starts, queries, labels, strict=True):
                key = tuple(int(t) for t in query)
                if key not in seen:
                    seen[key] = GincExample(concept, int(start), key, int(label))
                    if len(seen) == need:
                        break
        if len(seen) < need:
            raise ConfigurationError(
                f"concept {concept} gave only {len(seen)} distinct queries of length {k - 1} in {drawn} draws; "
                f"need {need}: lower n_train/n_test or raise k"
            )
        examples = list(seen.values())
        order = rng.permutation(need)
        split[concept] = ([examples[i] for i in order[:n_train]], [examples[i] for i in order[n_train:]])
    return split
