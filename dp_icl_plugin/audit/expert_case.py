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
- *paid per token* (:func:`per_token_pairs`, ``pay_per_token=True``, step 6 of
  :mod:`~dp_icl_plugin.decoding.knn_experts`): the replacement pair's records, an answer of
  :data:`PER_TOKEN_STEPS` tokens, and on D earlier answers have left x's filter one token. x is an expert for
  the first token and refused for the rest, where the (k+1)-th candidate (``opp``) moves up; on D′ it is an
  expert from the first. The claim is what x's filter admits, one token (:func:`per_token_event`), against the
  whole answer. The rows each token reads come from the decoder's own run (its charges through the real filter,
  its refusals, :class:`~dp_icl_plugin.decoding.knn_experts._ExpertRows`), computed once per side with the
  released tokens forced (the model makes them the same whatever was released: checked) and each token drawn
  from :func:`expert_token`'s law on them (its sampling is the token rows' above), so that 400,000 answers a side
  stay quick. The output is the answer's first token and how many later tokens are ``b`` (post-processing).
  Broken: **no move-up** (a refused expert's slot left empty), so the later tokens read k − 1 experts on D and
  k on D′: the answer then tells D from D′ beyond x's one token. What it cannot see: a moved-up row that is not
  replayed (this model ignores the history; ``tests/test_knn_experts_per_token.py`` checks the replay bit for
  bit), which candidates are charged (only x's filter is near its end; a unit test checks every candidate pays
  each token), and an ε0 understated by less than about a third (as shipped it proves 0.33 of the 0.49 claimed).
  A test checks that the law sampled is the one the decoder's token step draws from on those rows.
"""

from __future__ import annotations

import functools
import itertools
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
    _ExpertMeter,
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
    "PER_TOKEN_STEPS",
    "SPARSE_STEPS",
    "expert_event",
    "per_token_event",
    "per_token_pairs",
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


def _backend(rare_share: float, released: int = 0) -> FakeBackend:
    """The pairs' model; with ``released`` > 0, every context followed by up to that many released tokens among
    ``a`` and ``b`` reads as the context alone (so the rows a token reads do not depend on the tokens before it)."""
    ids = {w: i for i, w in enumerate(_VOCAB)}
    zero = np.full(len(_VOCAB), 1e-3)
    zero[ids["a"]], zero[ids["b"]] = 1.0 - rare_share, rare_share

    def favour(word: str) -> np.ndarray:
        row = np.full(len(_VOCAB), 1e-12)
        row[ids[word]] = 1.0
        return row / row.sum()

    first = {(ids["q"],): zero / zero.sum(), (ids["rare"], ids["q"]): favour("b"), (ids["opp"], ids["q"]): favour("a")}
    histories = [h for n in range(1, released + 1) for h in itertools.product((ids["a"], ids["b"]), repeat=n)]
    return FakeBackend(_VOCAB, table={**first, **{(*key, *h): row for key, row in first.items() for h in histories}})


# the records of each pair's D (x first); D′ is D without x
_PAIRS = {
    "removal": [("near", "rare"), ("mid", "plain"), ("mid", "plain"), ("mid", "plain")],
    "replacement": [("near", "rare")] + [("mid", "plain")] * (_K - 1) + [("far", "opp")],
}


def _knn(
    records: list[tuple[str, str]], rare_share: float, config: KNNConfig = _CONFIG, released: int = 0
) -> PrivateKNN:
    """The retriever over ``records`` (added in order: the first gets the index's first id)."""
    index = PrivateIndex(budget=_FILTER, embedder=_Angles())
    index.add([t for t, _ in records], labels=[y for _, y in records])
    return PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(10.0, 1e-3, neighbouring="add_remove")),
        backend=_backend(rare_share, released),
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


_FIRST_ID = int(PrivateIndex(budget=_FILTER, embedder=_Angles()).add(["near"])[0])
PER_TOKEN_STEPS = 4
"""Tokens of a per-token audit answer: the removed record x is admitted for the first only."""


def _per_token_config() -> KNNConfig:
    # one answer of PER_TOKEN_STEPS tokens a record (ε0 as large as the filter allows: the defect shows against
    # one token's ε0); the support is the zero-shot row's top 2 (a and b). Public, like every setting here.
    return replace(_CONFIG, uses=1, max_answer_tokens=PER_TOKEN_STEPS, expert_top_k=2)


def per_token_event() -> ev.DPEvent:
    """The claim: what x's filter admits in the audited answer, one token of a unit with one candidate record (its
    filter had one token left)."""
    return _knn(_PAIRS["removal"], 0.5, _per_token_config())._event("decode", 1, _K, 1)


class _FirstExpertsMeter(_ExpertMeter):
    """Broken: an expert refused mid-answer leaves its slot empty; the next candidate never moves up (the experts
    a token reads then depend on who was an expert before it, so on the refused record)."""

    first: np.ndarray | None = None  # the first token's experts

    def pay(self) -> Candidates:
        admitted = super().pay()
        if self.first is None:
            self.first = admitted.ids[: self.k]
        return admitted.take(np.isin(admitted.ids, self.first))


class _NoMoveUp(KNNExpertDecoder):
    """Broken: paid per token, but a refused expert's slot stays empty (:class:`_FirstExpertsMeter`)."""

    def _charge(self, prompt, steps: int):
        entry, meter = super()._charge(prompt, steps)
        assert isinstance(meter, _ExpertMeter)
        return entry, _FirstExpertsMeter(meter.knn, meter.candidates, meter.admitted, meter.k, meter.steps)


def _per_token_rows(
    with_x: bool, rare_share: float, kind: type[KNNExpertDecoder], released: int
) -> tuple[list[np.ndarray], list[Any]]:
    """The rows each token of a per-token answer reads (the decoder's own charges, refusals, experts and rows, on
    a fresh index), the released tokens forced to ``released`` (a token id), and each token's mechanism as the
    decoder called it (rows -> token). On D, earlier answers left x's filter one token."""
    config = _per_token_config()
    records = _PAIRS["replacement"] if with_x else _PAIRS["replacement"][1:]
    knn = _knn(records, rare_share, config, released=PER_TOKEN_STEPS - 1)
    if with_x:
        x = Candidates(np.array([_FIRST_ID]), np.ones(1, dtype=np.float32))
        spent = config.uses * config.max_answer_tokens - 1
        assert len(knn.index.charge(x, lambda c: knn._cost("decode", c, _K, spent), release_tag=knn._release_tag))
    decoder = kind(knn, template=_TEMPLATE, pay_per_token=True)
    read: list[np.ndarray] = []
    mechanisms: list[Any] = []

    def draw(mechanism, logprobs, generated, rule) -> int:  # the released tokens fixed: keep what each reads
        read.append(np.array(logprobs))
        mechanisms.append(mechanism)
        return released

    decoder._draw = draw  # type: ignore[method-assign]
    decoder.generate("q", rng=np.random.default_rng(0), max_tokens=PER_TOKEN_STEPS)
    assert len(read) == PER_TOKEN_STEPS
    return read, mechanisms


@functools.lru_cache(maxsize=4)
def _per_token_laws(broken: bool) -> list[dict[bool, list[tuple[np.ndarray, np.ndarray]]]]:
    """Per public share of ``b``, on D (False) and D′ (True), each token's support and probabilities: the law of
    :func:`expert_token` on the rows the decoder read for it. Those rows are the same whatever was released before
    (checked: forced to ``a``, then to ``b``), so the tokens are independent given the side."""
    kind = _NoMoveUp if broken else KNNExpertDecoder
    a, b = _VOCAB.index("a"), _VOCAB.index("b")
    settings = KNNExpertDecoder(_knn(_PAIRS["removal"], 0.5, _per_token_config()), template=_TEMPLATE)
    sides = []
    for share in _PER_TOKEN_SHARES:
        side = {}
        for nb in (False, True):
            rows, _ = _per_token_rows(not nb, share, kind, a)
            for other, this in zip(_per_token_rows(not nb, share, kind, b)[0], rows, strict=True):
                np.testing.assert_array_equal(other, this)
            laws = []
            for read in rows:
                support, scores = _ordered_scores(settings, read)
                laws.append((support, np.exp(scores - np.logaddexp.reduce(scores))))
            side[nb] = laws
        sides.append(side)
    return sides


_PER_TOKEN_SHARES = (0.45, 0.4)  # b's zero-shot share: where the broken variant's excess shows at 400,000 samples


def per_token_pairs(broken: bool) -> list[Any]:
    """The per-token pairs' samplers ``(neighbour, n, rng) -> outputs`` (broken: no move-up). An output is the
    answer's first token and how many of its later tokens are ``b`` (a function of the answer: post-processing).

    Args:
        broken: sample the broken variant.
    """
    b = _VOCAB.index("b")
    samplers = []
    for sides in _per_token_laws(broken):

        def sampler(nb: bool, n: int, rng: np.random.Generator, s: dict = sides) -> np.ndarray:
            tokens = [support[rng.choice(len(probs), size=n, p=probs)] for support, probs in s[nb]]
            later = np.sum([t == b for t in tokens[1:]], axis=0)
            return tokens[0].astype(np.int64) * PER_TOKEN_STEPS + later

        samplers.append(sampler)
    return samplers
