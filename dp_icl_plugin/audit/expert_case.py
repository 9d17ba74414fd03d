"""Audit case: expert decoding (:class:`~dp_icl_plugin.methods.knn.experts.KNNExpertDecoder`), D vs D minus
the one expert that favours a rare token.

**Relation, sensitivity, accounting.** Add/remove one record of a :class:`~dp_icl_plugin.methods.knn.PrivateIndex`.
The record x is a candidate and one of the query's experts; removing it drops its row (fewer candidates than
k here, so nobody moves up: the case where a divisor read from the data would move every other row's
weight). Each token is an exponential mechanism of ε0 = 2c/(kτ) for a unit with one candidate record
(:meth:`PrivateKNN.expert_scale`); the claim audited is one token's ``ExponentialMechanismEvent(ε0)``, the
per-token part of what the filter charges x (``_event("decode", 1, k, 1)``).

**The pair.** The real retriever and decoder on a :class:`~dp_icl_plugin.backends.FakeBackend` whose
next-token table makes a record labelled ``rare`` favour the token ``b`` and every other prompt favour
``a``: the decoder's own retrieval (the filter charged, the experts read), its prompts, its rows and its
token step (:meth:`KNNExpertDecoder._token`) on D and on D′; the rows are computed once per side and the
token drawn many times. The zero-shot row is tuned (public) so that ``b`` is rare (P ≈ 0.02) on D′.

**The broken variant: the divisor read from the data** (the number of experts present, 4 on D, 3 on D′,
instead of the fixed k = 10): x's row then weighs 1/4 instead of 1/10 and the others' rows change weight too.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.budget import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.backends.base import check_logprobs
from dp_icl_plugin.backends.fake import FakeBackend
from dp_icl_plugin.methods.knn.experts import KNNExpertDecoder, expert_scores, expert_token
from dp_icl_plugin.methods.knn.index import PrivateIndex
from dp_icl_plugin.methods.knn.retriever import KNNConfig, PrivateKNN
from dp_icl_plugin.methods.mozo import AnswerTemplate

__all__ = ["DELTA", "expert_event", "expert_pairs"]

DELTA = 1e-6
_VOCAB = ["q", "t", "plain", "rare", "a", "b", "c"]
_K = 10
_CONFIG = KNNConfig(k=_K, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=1, expert_top_k=0)
_FILTER = IndividualBudget(epsilon=2.0, delta=1e-6)
_TEMPLATE = AnswerTemplate(example="{text} {label} ", query="{input}", stop=None, stop_at_eos=False)


class _OneVector:
    """Every text the same unit vector: every record is a candidate of every query (similarity 1)."""

    name = "one-vector"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 4))


class _PresentDivisor(KNNExpertDecoder):
    """The broken decoder: it divides by the number of experts present, a count read from the data."""

    def _token(self, logprobs: np.ndarray, rng: np.random.Generator) -> int:
        return expert_token(logprobs[1:], logprobs[0], clip=self.clip, divisor=max(1, len(logprobs) - 1),
                            temperature=self.temperature, public_temperature=self.public_temperature,
                            top_k=self.top_k, rng=rng)  # fmt: skip


def _backend(rare_share: float) -> FakeBackend:
    ids = {w: i for i, w in enumerate(_VOCAB)}
    zero = np.full(len(_VOCAB), 1e-3)
    zero[ids["a"]], zero[ids["b"]] = 1.0 - rare_share, rare_share
    favour_b = np.full(len(_VOCAB), 1e-12)
    favour_b[ids["b"]] = 1.0
    table = {(ids["q"],): zero / zero.sum(), (ids["rare"], ids["q"]): favour_b / favour_b.sum()}
    return FakeBackend(_VOCAB, table=table)


def _decoder(with_x: bool, rare_share: float, broken: bool) -> tuple[KNNExpertDecoder, np.ndarray]:
    """A decoder over D (x and three others) or D′ (the three), and the rows of its first token."""
    index = PrivateIndex(budget=_FILTER, embedder=_OneVector())
    labels = ["plain"] * 3 + (["rare"] if with_x else [])
    index.add(["t"] * len(labels), labels=labels)
    knn = PrivateKNN(index, budget=BudgetManager(PrivacyBudget(10.0, 1e-3, neighbouring="add_remove")),
                     backend=_backend(rare_share), config=_CONFIG)  # fmt: skip
    decoder = (_PresentDivisor if broken else KNNExpertDecoder)(knn, template=_TEMPLATE)
    _, retrieval = decoder._charge("q", 1)
    prompts = [decoder._ids("q", None)] + [decoder._ids("q", r) for r in decoder._experts(retrieval)]
    return decoder, check_logprobs(decoder.backend.next_token_logprobs(prompts))


def expert_event() -> ev.DPEvent:
    """The claim: one token of a unit with one candidate record."""
    index = PrivateIndex(budget=_FILTER, embedder=_OneVector())
    knn = PrivateKNN(index, budget=BudgetManager(PrivacyBudget(10.0, 1e-3, neighbouring="add_remove")),
                     backend=_backend(0.5), config=_CONFIG)  # fmt: skip
    return knn._event("decode", 1, _K, 1)


@functools.lru_cache(maxsize=4)
def _tuned_rows(broken: bool) -> list[dict[bool, tuple[KNNExpertDecoder, np.ndarray]]]:
    """Per pair, the decoders and rows on D (False) and D′ (True): the public row's share of ``b`` set so that
    ``b`` has probability ≈ 0.02 on D′ under the shipped mechanism."""
    pairs = []
    for target in (0.02, 0.005):
        share = 0.5
        for share in np.geomspace(0.5, 1e-6, 80):
            decoder, rows = _decoder(False, float(share), False)
            scores = _blend(decoder, rows)
            if math.exp(scores[_VOCAB.index("b")] - np.logaddexp.reduce(scores)) <= target:
                break
        pairs.append({nb: _decoder(not nb, float(share), broken) for nb in (False, True)})
    return pairs


def _blend(decoder: KNNExpertDecoder, rows: np.ndarray) -> np.ndarray:
    return expert_scores(rows[1:], rows[0], clip=decoder.clip, divisor=decoder.k, temperature=decoder.temperature,
                         public_temperature=decoder.public_temperature)  # fmt: skip


def expert_pairs(broken: bool) -> list[Any]:
    """One sampler per tuned pair: ``(neighbour, n, rng) -> token ids`` from the decoder's token step."""
    samplers = []
    for sides in _tuned_rows(broken):

        def sampler(nb: bool, n: int, rng: np.random.Generator, s: dict = sides) -> np.ndarray:
            decoder, rows = s[nb]
            return np.fromiter((decoder._token(rows, rng) for _ in range(n)), dtype=np.int64, count=n)

        samplers.append(sampler)
    return samplers
