"""Audit cases: expert decoding (:class:`~dp_icl_plugin.retrieval.KNNExpertDecoder`), D against D minus the
one expert that favours a rare token.

**Relation, sensitivity, accounting.** Add/remove one record of a :class:`~dp_icl_plugin.retrieval.PrivateIndex`.
Each token is an exponential mechanism of ε0 = 2c/(kτ) for a unit with one candidate record
(:meth:`PrivateKNN.expert_scale`); the claim audited is one token's ``ExponentialMechanismEvent(ε0)``, the
per-token part of what the filter charges that record (``_event("decode", 1, k, 1)``).

**The pairs.** The real retriever and decoder on a :class:`~dp_icl_plugin.backends.FakeBackend` whose
next-token table makes a record labelled ``rare`` favour the token ``b``, one labelled ``opp`` favour ``a``, and
every other prompt fall back to the zero-shot row: the decoder's own charge, its experts, their prompts, the
rows from ``start_rows`` (the public row apart) and its token step (:meth:`KNNExpertDecoder._token`) on D and
on D′; the rows are computed once per side and the token drawn many times. Records sit at public angles from
the query, so their ranks are fixed. The zero-shot row is tuned (public) so that ``b`` is rare (P ≈ 0.02,
0.005) on D′.

- *replacement* (:func:`replacement_pairs`): k + 1 candidates, x (``rare``) among the k experts, the (k+1)-th
  (``opp``) moving up when x goes. Two experts' worth of opposite preference: the pair where the bound ε0 is
  tight. Broken: **τ halved** (the noise halved, as in the other cases).
- *removal* (:func:`removal_pairs`): x and three others, fewer than k = 10 candidates: removing x drops its row.
  Broken: **the divisor read from the data** (the number of experts present, 4 on D and 3 on D′, instead of
  k), so x weighs 1/4 instead of 1/10 and the others change weight too.
- *sparse* (:func:`sparse_pairs`): the replacement pair's rows decoded sparsely, one paid token
  (``expert_paid_tokens = 1``) over an answer of :data:`SPARSE_STEPS` token decisions on the same rows: the
  output is the whole answer (which step was paid and every token), the claim the answer's charge, one
  sparse-vector run and one token (:func:`sparse_event`). The threshold T is set between the experts' margins
  on D and D′ (a public constant of the audit, as any T must be). Broken: **the test without noise** (the margin
  compared with T as is), so whether a step is paid tells D from D′. This row checks the decoder's composed path
  (its test state, :func:`~dp_icl_plugin.decoding.knn_experts.sparse_step` on the support it orders) against the
  whole answer's charge; it is far from tight (near a public tie the margin on D′ sits at its floor of 0, and a
  paid step often draws the greedy token: the exact loss of these pairs is about 0.2 against the 0.98 claimed),
  so it cannot see a mis-calibrated test. The sparse-vector row of :mod:`~dp_icl_plugin.audit.cases` can: the
  test alone on queries moving in opposite directions, nearly tight, caught with its noise halved.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.budget import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.backends.fake import FakeBackend
from dp_icl_plugin.backends.shared_rows import start_rows
from dp_icl_plugin.decoding.knn_experts import (
    KNNExpertDecoder,
    expert_margin,
    expert_scores,
    expert_token,
    sparse_step,
    support_scores,
)
from dp_icl_plugin.mechanisms.sparse_vector import AboveThreshold
from dp_icl_plugin.retrieval.index import Candidates, PrivateIndex
from dp_icl_plugin.retrieval.retriever import KNNConfig, PrivateKNN
from dp_icl_plugin.templates.answer import AnswerTemplate

__all__ = [
    "DELTA",
    "SPARSE_STEPS",
    "expert_event",
    "removal_pairs",
    "replacement_pairs",
    "sparse_event",
    "sparse_pairs",
]

DELTA = 1e-6
_VOCAB = ["q", "near", "mid", "far", "plain", "rare", "opp", "a", "b", "c"]
_K = 10
# T0 is public (no privacy cost at any value); the pairs' public shares are tuned at 0.5
_CONFIG = KNNConfig(
    k=_K, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=1, expert_top_k=0, expert_public_temperature=0.5
)
_FILTER = IndividualBudget(epsilon=2.0, delta=1e-6)
_TEMPLATE = AnswerTemplate(example="{text} {label} ", query="{input}", stop=None, stop_at_eos=False)
_ANGLE = {"q": 0.0, "near": 0.1, "mid": 0.2, "far": 0.3}  # ranks: near, then mid, then far


class _Angles:
    """Texts at fixed public angles from the query: the records' similarity ranks are set by their text."""

    name = "angles"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.array([[math.cos(_ANGLE.get(t, 1.2)), math.sin(_ANGLE.get(t, 1.2))] for t in texts])


class _HalfTemperature(KNNExpertDecoder):
    """Broken: the experts' temperature halved while the claim stays (twice the claimed ε0)."""

    def _token(self, logprobs: np.ndarray, rng: np.random.Generator, test: AboveThreshold | None = None) -> int:
        return expert_token(
            logprobs[1:],
            logprobs[0],
            clip=self.clip,
            divisor=self.k,
            temperature=self.temperature / 2,
            public_temperature=self.public_temperature,
            top_k=self.top_k,
            rng=rng,
        )


class _PresentDivisor(KNNExpertDecoder):
    """Broken: it divides by the number of experts present, a count read from the data."""

    def _token(self, logprobs: np.ndarray, rng: np.random.Generator, test: AboveThreshold | None = None) -> int:
        return expert_token(
            logprobs[1:],
            logprobs[0],
            clip=self.clip,
            divisor=max(1, len(logprobs) - 1),
            temperature=self.temperature,
            public_temperature=self.public_temperature,
            top_k=self.top_k,
            rng=rng,
        )


class _NoiselessTest(KNNExpertDecoder):
    """Broken: the sparse-vector test compares the experts' margin with the threshold without noise."""

    def _sparse_test(self, rng: np.random.Generator) -> AboveThreshold | None:
        test = super()._sparse_test(rng)
        assert test is not None
        test.scale = 1e-300  # the noise gone, the claim kept
        test._noisy_threshold = test.threshold
        return test


def _backend(rare_share: float) -> FakeBackend:
    ids = {w: i for i, w in enumerate(_VOCAB)}
    zero = np.full(len(_VOCAB), 1e-3)
    zero[ids["a"]], zero[ids["b"]] = 1.0 - rare_share, rare_share

    def favour(word: str) -> np.ndarray:
        row = np.full(len(_VOCAB), 1e-12)
        row[ids[word]] = 1.0
        return row / row.sum()

    return FakeBackend(
        _VOCAB,
        table={
            (ids["q"],): zero / zero.sum(),
            (ids["rare"], ids["q"]): favour("b"),
            (ids["opp"], ids["q"]): favour("a"),
        },
    )


# the records of each pair's D (x first); D′ is D without x
_PAIRS = {
    "removal": [("near", "rare"), ("mid", "plain"), ("mid", "plain"), ("mid", "plain")],
    "replacement": [("near", "rare")] + [("mid", "plain")] * (_K - 1) + [("far", "opp")],
}


def _knn(records: list[tuple[str, str]], rare_share: float, config: KNNConfig = _CONFIG) -> PrivateKNN:
    index = PrivateIndex(budget=_FILTER, embedder=_Angles())
    index.add([t for t, _ in records], labels=[y for _, y in records])
    return PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(10.0, 1e-3, neighbouring="add_remove")),
        backend=_backend(rare_share),
        config=config,
        releases=("decode",),
    )


def _side(pair: str, with_x: bool, rare_share: float, kind: type[KNNExpertDecoder], config: KNNConfig = _CONFIG):
    """A decoder over D (``with_x``) or D′ and the rows of its first token, as the decoder computes them."""
    records = _PAIRS[pair] if with_x else _PAIRS[pair][1:]
    decoder = kind(_knn(records, rare_share, config), template=_TEMPLATE)
    _, admitted = decoder._charge("q", 1)
    assert isinstance(admitted, Candidates)  # paid per answer
    prompts = [decoder._ids("q", None), *decoder._expert_prompts("q", decoder._experts(admitted), 0)]
    with start_rows(decoder.backend, prompts, public=1) as session:
        return decoder, np.asarray(session.logprobs)


def expert_event() -> ev.DPEvent:
    """The claim: one token of a unit with one candidate record."""
    return _knn(_PAIRS["removal"], 0.5)._event("decode", 1, _K, 1)


@functools.lru_cache(maxsize=8)
def _tuned(pair: str, broken: bool) -> list[dict[bool, tuple[KNNExpertDecoder, np.ndarray]]]:
    """Per target, the decoders and rows on D (False) and D′ (True), the public share of ``b`` set so that ``b``
    has probability ≈ the target on D′ under the shipped mechanism."""
    kind = (_HalfTemperature if pair == "replacement" else _PresentDivisor) if broken else KNNExpertDecoder
    sides = []
    for target in (0.02, 0.005):
        share = 0.5
        for share in np.geomspace(0.5, 1e-6, 80):
            decoder, rows = _side(pair, False, float(share), KNNExpertDecoder)
            scores = expert_scores(
                rows[1:],
                rows[0],
                clip=decoder.clip,
                divisor=decoder.k,
                temperature=decoder.temperature,
                public_temperature=decoder.public_temperature,
            )
            if math.exp(scores[_VOCAB.index("b")] - np.logaddexp.reduce(scores)) <= target:
                break
        sides.append({nb: _side(pair, not nb, float(share), kind) for nb in (False, True)})
    return sides


def _samplers(pair: str, broken: bool) -> list[Any]:
    samplers = []
    for sides in _tuned(pair, broken):

        def sampler(nb: bool, n: int, rng: np.random.Generator, s: dict = sides) -> np.ndarray:
            decoder, rows = s[nb]
            return np.fromiter((decoder._token(rows, rng) for _ in range(n)), dtype=np.int64, count=n)

        samplers.append(sampler)
    return samplers


def replacement_pairs(broken: bool) -> list[Any]:
    """The replacement pairs' samplers ``(neighbour, n, rng) -> token ids`` (broken: τ halved).

    Args:
        broken: sample the broken variant.
    """
    return _samplers("replacement", broken)


def removal_pairs(broken: bool) -> list[Any]:
    """The removal pairs' samplers (broken: the divisor read from the data).

    Args:
        broken: sample the broken variant.
    """
    return _samplers("removal", broken)


SPARSE_STEPS = 3
"""Token decisions of a sparse audit answer (one of them may be paid)."""


def _sparse_config(threshold: float) -> KNNConfig:
    return replace(_CONFIG, max_answer_tokens=SPARSE_STEPS, expert_paid_tokens=1, expert_test_threshold=threshold)


def sparse_event() -> ev.DPEvent:
    """The claim: one sparse answer of a unit with one candidate record (one test run, one paid token)."""
    return _knn(_PAIRS["removal"], 0.5, _sparse_config(0.0))._event("decode", 1, _K, SPARSE_STEPS)


def _ordered_scores(decoder: KNNExpertDecoder, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The support (most likely public token first) and ẑ on it, as :func:`sparse_expert_token` computes them."""
    return support_scores(
        rows[1:],
        rows[0],
        clip=decoder.clip,
        divisor=decoder.k,
        temperature=decoder.temperature,
        public_temperature=decoder.public_temperature,
        top_k=decoder.top_k,
    )


@functools.lru_cache(maxsize=4)
def _sparse_sides(broken: bool) -> list[dict[bool, tuple[KNNExpertDecoder, np.ndarray, np.ndarray]]]:
    """Per public share of ``b`` (near a tie with ``a``, where one expert can make ``b`` the experts' choice), the
    sparse decoders, supports and scores on D (False) and D′ (True), T halfway between the experts' margins (T
    does not change ε0: the margins are those of the decoder audited)."""
    kind = _NoiselessTest if broken else KNNExpertDecoder
    sides = []
    for share in (0.499, 0.49):
        margins = [
            expert_margin(
                _ordered_scores(*_side("replacement", with_x, share, KNNExpertDecoder, _sparse_config(0.0)))[1], 0
            )
            for with_x in (True, False)
        ]
        assert margins[0] > margins[1], margins  # the pair must differ where the test looks
        config = _sparse_config(0.5 * (margins[0] + margins[1]))
        sides.append(
            {
                nb: (decoder, *_ordered_scores(decoder, rows))
                for nb in (False, True)
                for decoder, rows in [_side("replacement", not nb, share, kind, config)]
            }
        )
    return sides


def _answer(decoder: KNNExpertDecoder, support: np.ndarray, scores: np.ndarray, rng: np.random.Generator) -> int:
    """One sparse answer of SPARSE_STEPS decisions on fixed rows (the decoder's own test and step), as an
    integer: its tokens in base |V|."""
    test = decoder._sparse_test(rng)
    assert test is not None
    out = 0
    for _ in range(SPARSE_STEPS):
        out = out * len(_VOCAB) + int(support[sparse_step(scores, test, rng)])
    return out


def sparse_pairs(broken: bool) -> list[Any]:
    """The sparse pairs' samplers ``(neighbour, n, rng) -> answers`` (broken: the test without noise).

    Args:
        broken: sample the broken variant.
    """
    samplers = []
    for sides in _sparse_sides(broken):

        def sampler(nb: bool, n: int, rng: np.random.Generator, s: dict = sides) -> np.ndarray:
            decoder, support, scores = s[nb]
            return np.fromiter((_answer(decoder, support, scores, rng) for _ in range(n)), dtype=np.int64, count=n)

        samplers.append(sampler)
    return samplers
