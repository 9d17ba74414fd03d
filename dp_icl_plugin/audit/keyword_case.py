"""Audit case: keyword hints (:class:`~dp_icl_plugin.decoding.knn_keywords.KNNKeywordDecoder`), D against D minus
one record whose answer holds six keywords.

**Relation, sensitivity, accounting.** Add/remove one record of a :class:`~dp_icl_plugin.retrieval.PrivateIndex`.
Every candidate votes the first m distinct keywords of its answer; removing one record removes its set, ℓ2 ≤ √m;
the claim audited is the release the filter charges that record, ``GaussianEvent(σ/√m, √m)``
(``PrivateKNN._event("answer", 1)``), here with m = 1 and σ = :data:`NOISE_STD`.

**The pairs.** The real retriever and its keyword path on a :class:`~dp_icl_plugin.backends.FakeBackend`: the
retriever's charge (as the decoder makes it), the charged records, each record's vote
(``PrivateKNN._record_vote``) and the threshold release (``PrivateKNN._release_keywords``), many draws per side.
Every record's answer is ``fix reboot wipe reset patch update``; x is one of them, beside ``others`` ∈ {3, 5, 7}
more, so a keyword's count is others + 1 on D and others on D′, around the threshold (T ≈ 6.3 at σ = 2 over 12
tokens). The output is how many of the six words passed: as shipped only ``fix`` is voted and can move; broken,
all six move together, and the count's tails (none or all of them) tell D from D′. With m = 1 and one-record
units, c·√m = 1: the row checks a vote against its cap, not the factors c and √m (unit tests check those).

Broken: **a record votes every word it holds** (the cap m dropped, the claim kept): x then moves six counts,
ℓ2 = √6 instead of 1.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.budget import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.backends.fake import FakeBackend
from dp_icl_plugin.mechanisms.keyword_threshold import record_keywords
from dp_icl_plugin.retrieval.index import PrivateIndex
from dp_icl_plugin.retrieval.prompts import KeywordAnswerPrompt
from dp_icl_plugin.retrieval.retriever import KNNConfig, PrivateKNN, Retrieval, RetrievedRecord

__all__ = ["DELTA", "NOISE_STD", "keyword_hint_event", "keyword_hint_pairs"]

DELTA = 1e-4
NOISE_STD = 2.0
_WORDS = ("fix", "reboot", "wipe", "reset", "patch", "update")
_VOCAB = ["q", "x", "x,", "Question:", "Answer:", "hint", *_WORDS]
_CONFIG = KNNConfig(
    k=8,
    shards=1,
    min_similarity=0.5,
    uses=100_000,
    keywords=6,
    keywords_per_answer=1,
    keyword_source="records",
    keyword_noise_std=NOISE_STD,
    max_answer_tokens=1,
)


class _Same:
    """Every text at the query's angle: every record is a candidate."""

    name = "same"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.tile(np.array([[1.0, 0.0]]), (len(texts), 1))


class _EveryWord(PrivateKNN):
    """Broken: a record votes every keyword it holds (the cap m dropped), the claim kept."""

    def _record_vote(self, record: RetrievedRecord) -> list[int]:
        assert self.backend is not None and record.answer is not None
        return record_keywords(
            record.answer.reveal(), per_record=10**6, encode=self.backend.encode, is_keyword=self._is_keyword
        )


def _knn(records: int, kind: type[PrivateKNN] = PrivateKNN) -> PrivateKNN:
    index = PrivateIndex(budget=IndividualBudget(epsilon=1e4, delta=1e-6), embedder=_Same())
    index.add(["q"] * records, answers=[" ".join(_WORDS)] * records)
    return kind(
        index,
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3, neighbouring="add_remove")),
        backend=FakeBackend(_VOCAB),
        config=_CONFIG,
        keyword_prompt=KeywordAnswerPrompt(instruction="hint {keywords}"),
        releases=("answer",),
    )


def keyword_hint_event() -> ev.DPEvent:
    """The claim: one answer's release for a unit with one candidate record."""
    return _knn(1)._event("answer", 1)


@functools.lru_cache(maxsize=16)
def _side(records: int, broken: bool) -> tuple[PrivateKNN, list[list[int]]]:
    """The retriever over ``records`` records and their votes, as the release computes them after its charge."""
    knn = _knn(records, _EveryWord if broken else PrivateKNN)
    admitted, entry, k = knn._charge_release("q", "answer", None, None)
    used, stored = knn._charged_records(admitted, "answer", k)
    retrieval = Retrieval("answer", "q", used, stored, k, entry.id, charged_by=knn)
    return knn, [knn._record_vote(record) for record in retrieval]


def keyword_hint_pairs(broken: bool) -> list[Any]:
    """Samplers ``(neighbour, n, rng) -> outputs`` for ``others`` ∈ {3, 5, 7}: D (x and ``others``) or D′."""
    words = {_VOCAB.index(w) for w in _WORDS}

    def sampler(nb: bool, n: int, rng: np.random.Generator, others: int) -> np.ndarray:
        knn, votes = _side(others if nb else others + 1, broken)
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            released = knn._release_keywords(votes, _CONFIG.keywords, rng) or ()
            out[i] = len(words & set(released))
        return out

    return [
        lambda nb, n, rng, others=others: sampler(nb, n, rng, others)  # type: ignore[misc]
        for others in (3, 5, 7)
    ]
