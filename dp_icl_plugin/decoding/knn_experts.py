"""Expert decoding: the records nearest to a query, each paying through its own filter, steer every token.

The kNN paper's individual accounting (Wu et al., ICLR 2024; Feldman & Zrnic 2021, Thm. 4.5) meets
clip-blend's token mechanism (Bhusal et al., Algorithm 1 lines 6–9, eq. 2, Lemmas 1–2):

1. **Selection.** The public query is embedded; every *candidate* (an active record whose cosine similarity
   reaches the public ``min_similarity``) is charged through its unit's Rényi filter, inside the filter's
   transaction; the ``k`` most similar admitted candidates are the answer's *experts* (exact search: stable,
   :mod:`dp_icl_plugin.retrieval.index`). A unit's charge depends on its own records and the public query
   alone (its number m of candidate records), the condition under which the filter is valid.
2. **Tokens.** Each expert gives a one-shot prompt (its text and answer, or label, as one demonstration
   before the query); the prompts stay fixed for the whole answer. Per token: the zero-shot row ℓ0 (query and
   tokens so far, no record; public) and each expert's row z_i are restricted to ℓ0's ``expert_top_k`` most
   likely tokens (public), the experts' rows clipped to [−C, C] (eq. 2; the clip bound C is
   :data:`~dp_icl_plugin.retrieval.retriever.EXPERT_CLIP`) and averaged with the **fixed** divisor k (never the
   number of experts present), and the token drawn from softmax(ẑ), ẑ = ℓ0/T0 + z̄/(2τ),
   z̄ = (1/k)·Σ_i clip_C(z_i). Unlike the paper's blend, the public row is not clipped: it is public, so its
   log-probabilities at a public temperature T0 (``expert_public_temperature``) cost nothing and keep the
   zero-shot answer's fluency; the experts tilt it by at most C/τ nats of log-odds.
3. **Neighbouring relation and sensitivity.** Add/remove one unit (a record, or all of one person's records
   with ``group_by_user``). Removing a unit with m candidate records swaps at most min(m, k) experts (the next
   candidates move up; with fewer than k left, rows go): each swap moves every entry of Σ_i clip_C(z_i) by at
   most 2C, so every score ẑ by at most C/(kτ), and a token is an exponential mechanism with ε0·min(m, k),
   ε0 = 2C/(kτ): ε0·min(m, k)-DP and -bounded-range, (ε0·min(m, k))²/8-zCDP (Cesar & Rogers 2021).
   The per-swap bound is that of one replaced prompt and does not grow with k, while the experts' agreement
   does: C/τ = ε0·k/2 (:meth:`PrivateKNN.expert_scale`). "Pure" holds up to the float64 rounding of the
   inverse-CDF sampler, as for every sampler in this library.
4. **Accounting.** The answer's T tokens compose adaptively (each token's distribution depends on the
   released tokens before it, which are public): a unit with m candidate records is charged T tokens of
   ``ExponentialMechanismEvent(ε0·min(m, k))`` (``PrivateKNN._event("decode", m)``), i.e. at each filter order α
   the bounded-range RDP T·min(α·ε²/8, pure(ε)) with ε = ε0·min(m, k) (``rdp.bounded_range_rdp``). ε0 is
   calibrated for a unit with one candidate record: ``uses`` answers of ``max_answer_tokens`` tokens at ε0 fill
   its budget (:func:`~dp_icl_plugin.retrieval.retriever.token_epsilon_for_uses`); a unit with more candidates
   pays more per answer and joins fewer. Every answer is charged (unless paid per token: step 6) for its
   worst case (all ``max_tokens`` tokens; with choices or a JSON schema the most token mechanisms they let it run,
   a public count: :meth:`JSONSchemaAnswers.decisions <dp_icl_plugin.decoding.structured.JSONSchemaAnswers.decisions>`)
   before the first token is computed; stopping early refunds nothing.
   The ledger holds the filter's total once (:meth:`PrivateKNN.cover_event`) and records each answer as a
   :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent`.

5. **Sparse** (``KNNConfig.expert_paid_tokens`` = P; Amin et al. 2024, Koga et al. 2024: pay only where the
   private prediction departs from the public one). Per token, g is the public row's greedy token on the support
   (public) and the *margin* M = max_j ẑ_j − ẑ_g ≥ 0 how far the experts (with the public prior) prefer another
   token. One expert swapped moves each ẑ_j by at most c/(kτ) = ε0/2, so M by at most ε0 (per unit: ε0·min(m, k)).
   M goes to a sparse-vector test (:class:`~dp_icl_plugin.mechanisms.sparse_vector.AboveThreshold`, Dwork & Roth
   2014, Thm. 3.23) with ε_s = a·ε0 (``expert_test_ratio``), i.e. noise scale b = ε0/ε_s = 1/a nats, and the
   public threshold T (``expert_test_threshold``). Below it the token is g, computed from the public row alone
   (free); above it the token is drawn as in step 2 (paid) and the threshold noise drawn afresh. After P paid
   tokens every further token is g, with no test. An answer thus holds at most P sparse-vector runs and P
   tokens: a unit with m candidate records is charged P × ``ExponentialMechanismEvent(ε0·min(m, k))`` and
   P × ``PureDPEvent(a·ε0·min(m, k))`` up front (P ≤ the answer's token decisions), and ε0 is calibrated so that
   ``uses`` such answers fill a one-candidate unit's budget
   (:func:`~dp_icl_plugin.retrieval.retriever.token_epsilon_for_uses` with ``test_ratio``). Which tokens were
   free is part of the (DP) output.
6. **Paid per token** (``pay_per_token=True``; Feldman & Zrnic 2021, Thm. 4.5: the individual filter admits each
   round's cost as it comes, rounds chosen adaptively). The answer's candidates are found once, when it is
   charged; before each token mechanism every candidate's unit is charged one token,
   ``ExponentialMechanismEvent(ε0·min(m, k))``, through its filter, and the token's experts are the k nearest
   candidates admitted for it. A unit whose filter refuses takes no part in that token or any later one (its
   refusal depends on its own earlier charges: its m and the released tokens), exactly as if it were absent from
   then on, so the next candidate moves up and its row joins, computed as from the answer's first token
   (:class:`_ExpertRows`): each token's distribution is a function of the units admitted for it and the released
   tokens, and its analysis is step 3's, per token. The rows a token reads are extended by the released tokens
   only once it is charged (a refused record whose row shares a batch with an admitted expert's is extended with
   it, unused). The answer ends at EOS, a stop or its
   limit, all functions of released tokens; a token that choices or a schema force after the first runs no
   mechanism and is charged nothing (the first token mechanism is charged with the answer, before it is known
   whether the public rule forces it). An answer that fails part-way (where may depend on the records read) first
   charges its candidates for every token mechanism it had left, up to its worst case, so the charges never
   depend on where it failed. ε0 is
   calibrated as in step 4 (``uses`` answers of ``max_answer_tokens`` tokens), so an answer that ends early
   leaves its records' budget for more answers. Each token's charge is one release of the filter, recorded on
   the ledger as a :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent` of one token.

Records with neither an answer nor a label, whose prompt the tokenizer cannot build, or whose row has no
finite entry on the support sit idle: they paid, they keep their slot (so the others' do not change), and their
row adds nothing, a value inside [−C, C]; whether one is idle depends on that record alone, and nothing that a
record holds can fail the answer after its charge. Generated tokens and the public row are post-processing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._storage.postgres_connection import is_postgres_url
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.budget import BudgetManager, LedgerEntry
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, PER_RECORD
from dp_icl_plugin.backends.base import NextTokenBackend, check_top_k
from dp_icl_plugin.backends.shared_rows import start_rows
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import require_units, unit_user_id
from dp_icl_plugin.decoding.choices import AnswerChoices
from dp_icl_plugin.decoding.contract import DecodedAnswer, Query
from dp_icl_plugin.decoding.decoders import _Decoder, query_text
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.mechanisms.clip_blend_sampling import clip_logits, exponential_mechanism
from dp_icl_plugin.mechanisms.mozo_mixing import top_k_support
from dp_icl_plugin.mechanisms.sparse_vector import AboveThreshold
from dp_icl_plugin.mechanisms.token_shift import log_odds_shift, warn_if_weak
from dp_icl_plugin.retrieval.durable import DEFAULT_INDEX_NAME, index_beside, kept_index
from dp_icl_plugin.retrieval.index import Candidates
from dp_icl_plugin.retrieval.retriever import KNNConfig, PrivateKNN
from dp_icl_plugin.steps.token_step import public_checked
from dp_icl_plugin.templates.answer import AnswerTemplate
from dp_icl_plugin.timing import FixedLatency, as_fixed_latency

__all__ = [
    "KNNDecoder",
    "KNNExpertDecoder",
    "build_expert_decoder",
    "expert_margin",
    "expert_scores",
    "expert_token",
    "filter_budget_for",
    "sparse_expert_token",
    "sparse_step",
    "support_scores",
]

PUBLIC_TEMPERATURE = KNNConfig.expert_public_temperature  # free text: the zero-shot row keeps the answer fluent
CHOICES_PUBLIC_TEMPERATURE = math.inf  # public choices: the row is only a (biased) prior; chosen on tune queries


class KNNDecoder(_Decoder):
    """What the decoders over a :class:`PrivateKNN` share: a public question as a chat turn, the retriever's own
    requirements checked with the query, and a prompt that stays fixed and grows by the answer. Subclasses set
    :attr:`release`, the retriever's release kind they are charged as."""

    release = ""
    knn: PrivateKNN

    def answer(self, question: str, *, rng: np.random.Generator, max_tokens: int | None = None) -> DecodedAnswer:
        """A DP answer to a public question (a retriever's query): the question as the user's chat turn when
        the model has a chat template, else in the template.

        Args:
            question: the public question.
            rng: the noise source.
            max_tokens: the answer's limit (default: the decoder's; charged in full, or its decisions under
                choices or a schema; paid per token, only the token mechanisms it runs).

        Raises:
            ConfigurationError: a bad question, limit or rng (nothing charged).
            ReleaseFailedError: the computation failed after the charge.
        """
        query: Query = [{"role": "user", "content": question}] if self.has_chat_template else question
        return self.generate(query, rng=rng, max_tokens=max_tokens)

    def check(
        self,
        query: Query,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> None:
        """Raise :class:`~dp_icl_plugin.errors.ConfigurationError` for what :meth:`stream` would refuse, the retriever's
        own requirements included; nothing is charged.

        Args:
            query: the public query (a completion text or a chat).
            max_tokens: the answer's limit (default: the decoder's).
            stop: stop sequences.
            schema: a public JSON schema the answer must follow.
        """
        super().check(query, max_tokens=max_tokens, stop=stop, schema=schema)
        self.knn._require(self.release)

    def _reserve(self, limit: int) -> int:
        return limit - 1  # the prompts stay fixed and grow by the answer: each keeps room for it

    def _answer_turn(self, state: Any) -> Any:
        """With a latency window, the index's release turn around it (the turn first, as every release on the
        index takes them: :mod:`~dp_icl_plugin.retrieval.release_turn`); else none (the charge takes the turn)."""
        return None if self.fixed_latency is None else self.knn.index.release_turn.hold()


class KNNExpertDecoder(KNNDecoder):
    """DP decoding with the query's nearest records as experts, each paying its own budget; see the module.

    Implements the :class:`~dp_icl_plugin.decoding.contract.Decoder` contract, so it serves the LangChain chat
    model / LLM and the LlamaIndex LLM like the other decoders.

    Args:
        knn: the private index, ledger, backend and settings (``config.k`` experts, ``min_similarity``,
            ``uses`` answers per record of ``max_answer_tokens`` tokens, ``expert_public_temperature``,
            ``expert_top_k``).
        template: how a record and a completion query form a prompt (default: ``AnswerTemplate(stop=None)``).
        fixed_latency: hide timing: every answer returns this many seconds after it starts (how many
            experts an answer had shows in its computation time otherwise); paid per token, each token's charge
            also waits for its equal slot of the window, so the ledger's timestamps keep a public schedule;
            default the PrivateKNN's.
        choices: public answers (labels, desks, "yes"/"no"): every token restricted to those that continue one
            (:mod:`dp_icl_plugin.decoding.choices`); an answer is then charged for the choices' token decisions
            (:attr:`~dp_icl_plugin.decoding.choices.AnswerChoices.decisions`, at most ``config.max_answer_tokens``).
        pay_per_token: charge each candidate's filter one token before each token mechanism (module docstring,
            step 6) instead of the answer's worst case up front: an answer that ends early, or a token that choices
            or a schema force, costs the records nothing more. Not with sparse decoding.

    Raises:
        ConfigurationError: the retriever has no backend, ``config.max_answer_tokens`` is below the choices'
            decisions, or ``pay_per_token`` with sparse decoding.
    """

    kind = "knn-experts"
    release = "decode"

    def __init__(
        self,
        knn: PrivateKNN,
        *,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
        pay_per_token: bool = False,
    ) -> None:
        if not isinstance(knn, PrivateKNN):
            raise ConfigurationTypeError("knn must be a PrivateKNN")
        if not isinstance(pay_per_token, bool):
            raise ConfigurationTypeError("pay_per_token must be a bool")
        if pay_per_token and knn.index.across_hosts:
            raise ConfigurationError(
                "expert decoding paid per token holds its index's release turn for a whole answer, and an index in "
                "PostgreSQL is charged from several hosts, whose releases it cannot hold back: use pay_per_token "
                "with an index in a directory (one host), or pay per answer"
            )
        if pay_per_token and knn.config.sparse:
            raise ConfigurationError(
                "sparse expert decoding pays its paid tokens and their sparse-vector tests up front (the test's "
                "budget is for P positives, whenever they come): pay_per_token does not apply; drop one of them"
            )
        if knn.backend is None:
            raise ConfigurationError("expert decoding needs the PrivateKNN's backend (a language model)")
        # with choices an answer has at most the longest choice's tokens and runs at most `decisions` token
        # mechanisms, which must fit what the filters were divided for (checked here, long before any charge)
        super().__init__(
            backend=knn.backend,
            budget=knn.budget,
            template=template,
            max_tokens=knn.config.max_answer_tokens if choices is None else None,
            fixed_latency=knn.fixed_latency if fixed_latency is None else fixed_latency,
            choices=choices,
        )
        if self.choices is not None and self.choices.decisions > knn.config.max_answer_tokens:
            raise ConfigurationError(
                f"the choices need {self.choices.decisions} token decisions per answer, more than the "
                f"{knn.config.max_answer_tokens} (config.max_answer_tokens) a record's budget was divided for"
            )
        self.knn = knn
        self._pay_per_token = pay_per_token
        self.k = knn.config.k
        self.clip, self.temperature = knn.expert_scale(self.k)
        self.public_temperature = knn.config.expert_public_temperature
        self.top_k = knn.config.expert_top_k
        if self.top_k:
            check_top_k(min(self.top_k, self.backend.vocab_size), self.backend)
        if "decode" not in knn.asked_releases:  # a retriever built for decoding warned before its cover
            warn_if_weak(
                f"expert decoding over k = {self.k} records",
                log_odds_shift(self.clip / self.temperature),
                "raise the per-record epsilon or k, or lower config.uses or max_answer_tokens",
                read=self.k,
            )

    @property
    def pay_per_token(self) -> bool:
        """Whether each token mechanism is charged right before it runs (set when the decoder is built)."""
        return self._pay_per_token

    @property
    def token_epsilon(self) -> float:
        """ε0: what one token costs a unit with one candidate record (pure DP, add/remove)."""
        return self.knn.expert_epsilon

    def answer_event(self, max_tokens: int | None = None, *, schema: object | None = None) -> ev.DPEvent:
        """What one answer of at most ``max_tokens`` tokens costs a record that is a candidate (its own filter
        pays it; the ledger records it as a :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent`): its most
        token mechanisms, fewer with choices or a ``schema``.

        Args:
            max_tokens: the answer's limit (default: the decoder's).
            schema: a public JSON schema the answer follows, or None.

        Raises:
            ConfigurationError: ``max_tokens`` is not a positive integer, or a schema that does not compile.
        """
        return super().answer_event(max_tokens, schema=schema)

    def _steps_event(self, steps: int) -> ev.DPEvent:
        return self.knn._event("decode", 1, self.k, steps)

    def _answer_turn(self, state: Any) -> Any:
        """Paid per token: the index's release turn for the whole answer (no other release on the index charges
        between its tokens: :mod:`~dp_icl_plugin.retrieval.release_turn`); else as the base decoder."""
        if self._pay_per_token:
            return self.knn.index.release_turn.hold()
        return super()._answer_turn(state)

    def _charge(self, prompt, steps: int) -> tuple[LedgerEntry, Candidates | _ExpertMeter]:
        if self._pay_per_token:  # the first token mechanism now, each next one right before it runs
            candidates, admitted, entry, _ = self.knn._charged_search(query_text(prompt), "decode", self.k, 1)
            return entry, _ExpertMeter(self.knn, candidates, admitted, self.k, steps)
        admitted, entry, _ = self.knn._charge_release(query_text(prompt), "decode", self.k, steps)
        return entry, admitted  # the records are read in _tokens, after the charge is on the answer's state

    def _experts(self, admitted: Candidates) -> list[PrivateRecord]:
        """The experts' demonstrations (private): the k nearest admitted candidates' answers, else labels;
        records without either sit idle."""
        _, records = self.knn._charged_records(admitted, "decode", self.k)
        return [e for e in map(_demonstration, records) if e is not None]

    def _expert_prompts(self, prompt, experts: list[PrivateRecord], room: int) -> list[list[int]]:
        """Each expert's one-shot prompt; a record whose prompt cannot be built (its own text decides) sits idle."""
        return [ids for ids in (self._expert_prompt(prompt, e, room) for e in experts) if ids is not None]

    def _expert_prompt(self, prompt, expert: PrivateRecord, room: int) -> list[int] | None:
        """One expert's one-shot prompt, or None when the tokenizer or chat template rejects its text (idle)."""
        try:
            return self._ids(prompt, expert, reserve=room)
        except Exception:  # a tokenizer or chat template that rejects this record's text
            return None

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any, rule: Any) -> Generator[int, None, None]:
        if isinstance(paid, _ExpertMeter):
            yield from self._tokens_paid_per_token(prompt, limit, rng, paid, rule)
            return
        room = self._reserve(limit)
        public = self._ids(prompt, None, reserve=room)  # public: checked before the charge
        prompts = [public, *self._expert_prompts(prompt, self._experts(paid), room)]
        suffix = self._public_suffix(prompt, reserve=room)
        with start_rows(self.backend, prompts, suffix=suffix, public=1) as session:  # the public prompt apart
            logprobs = public_checked(session.logprobs, stand_in=False)
            generated: list[int] = []
            test = self._sparse_test(rng)  # one answer's sparse-vector state, or None (every token paid)
            for step in range(limit):
                token = self._draw(lambda rows: self._token(rows, rng, test), logprobs, generated, rule)
                generated.append(token)
                yield token
                if step + 1 < limit:
                    logprobs = public_checked(session.append(token), stand_in=False)

    def _tokens_paid_per_token(
        self, prompt, limit: int, rng: np.random.Generator, meter: _ExpertMeter, rule: Any
    ) -> Generator[int, None, None]:
        """The tokens of an answer paid per token (module docstring, step 6): before each token mechanism every
        candidate is charged one token and the experts are the k nearest admitted; an expert whose filter refused
        leaves, the next candidate takes its place, its row computed from the answer's start (:class:`_ExpertRows`).
        A token that choices or a schema force runs no mechanism and charges nothing."""
        room = self._reserve(limit)
        suffix = self._public_suffix(prompt, reserve=room)
        public = start_rows(self.backend, [self._ids(prompt, None, reserve=room)], suffix=suffix, public=1)
        experts = _ExpertRows(self, prompt, room, suffix)
        if self.fixed_latency is not None:  # each later charge waits for its slot of the answer's window
            meter.pace = self.fixed_latency.pacer(meter.steps)
        with closing(public), closing(experts):
            generated: list[int] = []
            try:
                for step in range(limit):
                    forced = self._forced(generated, rule)
                    if forced is None:  # charged first; the experts' rows then read the released tokens
                        used, records = self.knn._charged_records(meter.pay(), "decode", self.k)
                        rows = np.vstack(
                            [public_checked(public.logprobs, stand_in=False), experts.rows(used.ids, records)]
                        )
                        token = self._draw(lambda r: self._token(r, rng), rows, generated, rule)
                    else:  # public: no mechanism, no charge
                        token = forced
                    generated.append(token)
                    yield token
                    if step + 1 < limit:
                        public.append(token)
                        experts.release(token)
            except Exception:
                # A failure (its point may depend on the records read) must not show in how many tokens were
                # charged: the answer's candidates pay for every token mechanism it could have run, as paid per
                # answer, then the failure goes on (a ReleaseFailedError to the caller).
                meter.pay_rest()
                raise

    def _sparse_test(self, rng: np.random.Generator) -> AboveThreshold | None:
        """A fresh sparse-vector state for one answer (sparse decoding), else None. The margin it tests moves by
        at most ε0 per swapped expert (module docstring, step 5), so its noise scale is b = ε0/ε_s = 1/a."""
        cfg = self.knn.config
        if not cfg.sparse:
            return None
        assert cfg.expert_paid_tokens is not None and cfg.expert_test_threshold is not None
        return AboveThreshold(
            threshold=cfg.expert_test_threshold,
            scale=1.0 / cfg.expert_test_ratio,
            positives=cfg.expert_paid_tokens,
            rng=rng,
        )

    def _token(self, logprobs: np.ndarray, rng: np.random.Generator, test: AboveThreshold | None = None) -> int:
        """One token from the public row (``logprobs[0]``) and the experts' rows (the rest); with a sparse
        ``test``, the public greedy token unless the test finds the experts depart from it."""
        settings: dict[str, Any] = {
            "clip": self.clip,
            "divisor": self.k,
            "temperature": self.temperature,
            "public_temperature": self.public_temperature,
            "top_k": self.top_k,
            "rng": rng,
        }
        if test is not None:
            return sparse_expert_token(logprobs[1:], logprobs[0], test=test, **settings)
        return expert_token(logprobs[1:], logprobs[0], **settings)


class _ExpertMeter:
    """One answer of expert decoding paid per token: its candidates (found when the answer was charged), charged
    for its first token mechanism then, and again before each next one. Each charge admits the candidates whose
    unit's filter still affords one token: a refusal depends on that unit's own earlier charges, which follow from
    its candidate count and the released tokens (public), never on the other records.

    Args:
        knn: the retriever (its index, filter and ledger).
        candidates: the answer's candidates.
        admitted: those admitted by the first charge.
        k: the experts an answer reads.
        steps: the most token mechanisms the answer may run (public: its limit and its choices or schema).
    """

    def __init__(self, knn: PrivateKNN, candidates: Candidates, admitted: Candidates, k: int, steps: int) -> None:
        self.knn = knn
        self.candidates = candidates
        self.admitted = admitted
        self.k = k
        self.steps = steps
        self.paid = 1  # the first, when the answer was charged
        self.pace: Callable[[int], None] | None = None  # with fixed_latency: waits for charge n's public slot
        self._prepaid = True

    def pay(self) -> Candidates:
        """Before a token mechanism runs: the candidates admitted for it (the first paid when the answer was)."""
        if self._prepaid:
            self._prepaid = False
            return self.admitted
        if self.pace is not None:
            self.pace(self.paid)
        # counted before the charge: a charge whose ledger write fails after the filters committed is never made
        # again (the failure is the ledger's, not the records')
        self.paid += 1
        self.admitted, _ = self.knn._charge_candidates(self.candidates, "decode", self.k, 1)
        return self.admitted

    def pay_rest(self) -> None:
        """After a failure: charge the token mechanisms the answer had left (up to ``steps``), so that the charges
        do not depend on where it failed; each is tried once, past a failing one (the caller raises its own
        error after)."""
        self._prepaid = False
        while self.paid < self.steps:
            try:
                self.pay()
            except Exception:  # a ledger or filter failure (not the records'): the next charge is still tried
                continue


class _ExpertRows:
    """The experts' rows of an answer paid per token, in the experts' order. A record's row is computed the same
    way whenever it becomes an expert: its one-shot prompt started (the backend's row isolation: bit-identical
    whatever shares its batch), then extended by the answer's released tokens one at a time, as if it had been an
    expert from the first token. So the rows a token reads depend on which records are experts for it and on the
    released tokens only, never on who was an expert before (a session none of whose records is still an expert is
    closed; a record admitted again starts afresh). Rows are extended only when a token reads them, after its
    charge (a refused record's row in a batch with an admitted expert's is extended with it, unused).

    Args:
        decoder: the expert decoder (its backend, template and prompt layout).
        prompt: the answer's public query.
        room: the tokens kept free for the answer.
        suffix: the public tokens every prompt ends with (the backend's prefix cache).
    """

    def __init__(self, decoder: KNNExpertDecoder, prompt: Any, room: int, suffix: list[int]) -> None:
        self.decoder = decoder
        self.prompt = prompt
        self.room = room
        self.suffix = suffix
        self.sessions: list[Any] = []  # None once closed
        self.extended: list[int] = []  # per session: how many released tokens it has read
        self.place: dict[int, tuple[int, int] | None] = {}  # record id -> (session, row); None: idle
        self.released: list[int] = []

    def rows(self, ids: np.ndarray, records: Sequence[Any]) -> np.ndarray:
        """The rows of the experts ``ids`` (their ``records``), idle ones left out, in that order.

        Args:
            ids: the experts' record ids, nearest first.
            records: their stored records (:class:`~dp_icl_plugin.retrieval.retriever.RetrievedRecord`).
        """
        self._drop_left({int(i) for i in ids})
        for number, session in enumerate(self.sessions):  # the tokens released since these rows were read
            if session is not None:
                for token in self.released[self.extended[number] :]:
                    session.append(token)
                self.extended[number] = len(self.released)
        prompts: list[list[int]] = []
        for record_id, record in zip((int(i) for i in ids), records, strict=True):
            if record_id in self.place:
                continue
            expert = _demonstration(record)
            ids_ = None if expert is None else self.decoder._expert_prompt(self.prompt, expert, self.room)
            self.place[record_id] = None if ids_ is None else (len(self.sessions), len(prompts))
            if ids_ is not None:
                prompts.append(ids_)
        if prompts:
            session = start_rows(self.decoder.backend, prompts, suffix=self.suffix)
            self.sessions.append(session)
            self.extended.append(len(self.released))
            for token in self.released:  # one at a time, as the answer's first experts were extended
                session.append(token)
        out = [self.sessions[at[0]].logprobs[at[1]] for at in (self.place[int(i)] for i in ids) if at is not None]
        return np.asarray(out) if out else np.zeros((0, self.decoder.backend.vocab_size))

    def _drop_left(self, experts: set[int]) -> None:
        """Close the sessions none of whose rows is an expert any more (their records were refused); a record
        admitted again (a removal lowered its unit's count) starts afresh."""
        reading = {at[0] for record_id, at in self.place.items() if at is not None and record_id in experts}
        for number, session in enumerate(self.sessions):
            if session is not None and number not in reading:
                session.close()
                self.sessions[number] = None
                for record_id in [r for r, at in self.place.items() if at is not None and at[0] == number]:
                    del self.place[record_id]

    def release(self, token: int) -> None:
        """A token released: the rows read it when the next token, once paid, reads them.

        Args:
            token: the token.
        """
        self.released.append(token)

    def close(self) -> None:
        """Drop the sessions' caches."""
        for session in self.sessions:
            if session is not None:
                session.close()


def _demonstration(record: Any) -> PrivateRecord | None:
    """An expert's demonstration: its record's text with its answer, else its label; None (idle) without either."""
    field = record.answer if record.answer is not None else record.label
    return None if field is None else PrivateRecord(record.text.reveal(), field.reveal())


def expert_scores(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    clip: float,
    divisor: int,
    temperature: float,
    public_temperature: float,
) -> np.ndarray:
    """ẑ = ℓ0/T0 + z̄/(2τ), z̄ = (1/k)·Σ_i clip_c(z_i) (internal scores of :func:`expert_token`).

    Sensitivity: one expert swapped moves an entry of Σ_i clip_c(z_i) by at most 2c, so ẑ by at most c/(kτ);
    ℓ0 (public) moves nothing. Sampling softmax(ẑ) is then an exponential mechanism of ε0 = 2c/(kτ).

    Args:
        private_logprobs: the experts' rows on the support, shape (n, K).
        public_logprobs: the zero-shot row on the support, shape (K,).
        clip: c, the clipping bound.
        divisor: k, fixed in advance.
        temperature: τ of the experts' part.
        public_temperature: T0 (``inf``: no prior).

    Returns:
        The scores ẑ, shape (K,).
    """
    public = public_logprobs - np.logaddexp.reduce(public_logprobs)
    rows = np.asarray(private_logprobs, dtype=np.float64).reshape(-1, public.size)
    # a row with NaN, +inf or nothing finite on the support sits idle (adds 0, inside [−c, c]): its own content
    # decides, and it cannot fail the release
    usable = np.isfinite(rows).any(axis=1) & ~np.isnan(rows).any(axis=1) & ~np.isposinf(rows).any(axis=1)
    tilt = clip_logits(rows[usable], clip).sum(axis=0) / divisor if usable.any() else np.zeros(public.size)
    prior = public / public_temperature if math.isfinite(public_temperature) else np.zeros(public.size)
    return prior + tilt / (2.0 * temperature)


def expert_token(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    clip: float,
    divisor: int,
    temperature: float,
    public_temperature: float,
    top_k: int,
    rng: np.random.Generator,
) -> int:
    """One expert-decoding token (see the module docstring, step 2).

    Args:
        private_logprobs: the experts' rows, shape (n ≤ k, V) (any number, none included).
        public_logprobs: the zero-shot row, shape (V,).
        clip: c, the clipping bound.
        divisor: k, fixed in advance.
        temperature: τ of the experts' part (ε0 = 2c/(kτ)).
        public_temperature: T0, the zero-shot row's temperature (public: no privacy cost).
        top_k: sample among the zero-shot row's this many most likely tokens (0: every token it gives
            probability above 0).
        rng: the noise source.

    Returns:
        The token id.
    """
    support, scores = support_scores(
        private_logprobs,
        public_logprobs,
        clip=clip,
        divisor=divisor,
        temperature=temperature,
        public_temperature=public_temperature,
        top_k=top_k,
    )
    return int(support[exponential_mechanism(scores, temperature=1.0, rng=rng)])


def support_scores(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    clip: float,
    divisor: int,
    temperature: float,
    public_temperature: float,
    top_k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The public support (the zero-shot row's ``top_k`` most likely tokens, most likely first; 0: every token
    it gives probability above 0) and ẑ on it (:func:`expert_scores`).

    Args:
        private_logprobs: the experts' rows, shape (n ≤ k, V).
        public_logprobs: the zero-shot row, shape (V,).
        clip: c, the clipping bound.
        divisor: k, fixed in advance.
        temperature: τ of the experts' part.
        public_temperature: T0.
        top_k: the support's size.

    Returns:
        ``(support token ids, scores)``.
    """
    support = top_k_support(public_logprobs, top_k or public_logprobs.size)  # public; finite ℓ0 only
    scores = expert_scores(
        private_logprobs[:, support],
        public_logprobs[support],
        clip=clip,
        divisor=divisor,
        temperature=temperature,
        public_temperature=public_temperature,
    )
    return support, scores


def expert_margin(scores: np.ndarray, greedy: int) -> float:
    """How far the experts' scores depart from the public greedy token: max_j ẑ_j − ẑ_g ≥ 0.

    Sensitivity: one expert swapped moves each ẑ_j by at most c/(kτ) = ε0/2, so the margin by at most ε0.

    Args:
        scores: ẑ on the support (:func:`expert_scores`).
        greedy: the public greedy token's position in the support.
    """
    return float(np.max(scores) - scores[greedy])


def sparse_expert_token(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    clip: float,
    divisor: int,
    temperature: float,
    public_temperature: float,
    top_k: int,
    test: AboveThreshold,
    rng: np.random.Generator,
) -> int:
    """One sparse expert-decoding token (module docstring, step 5): the public row's greedy token g, unless the
    sparse-vector ``test`` finds the experts' margin over g above its threshold; then the token is drawn as
    :func:`expert_token` draws it (a paid token). Once ``test`` has given its paid tokens, g without a test.

    Args:
        private_logprobs: the experts' rows, shape (n ≤ k, V).
        public_logprobs: the zero-shot row, shape (V,).
        clip: c, the clipping bound.
        divisor: k, fixed in advance.
        temperature: τ of the experts' part (ε0 = 2c/(kτ)).
        public_temperature: T0.
        top_k: the zero-shot row's support size (0: every token it gives probability above 0).
        test: the answer's sparse-vector state (its noise comes from the generator it was built with).
        rng: the noise source of the token's draw.

    Returns:
        The token id.
    """
    if test.spent:  # public: the row of no record decides
        return int(top_k_support(public_logprobs, 1)[0])
    support, scores = support_scores(
        private_logprobs,
        public_logprobs,
        clip=clip,
        divisor=divisor,
        temperature=temperature,
        public_temperature=public_temperature,
        top_k=top_k,
    )
    return int(support[sparse_step(scores, test, rng)])


def sparse_step(scores: np.ndarray, test: AboveThreshold, rng: np.random.Generator) -> int:
    """The sparse token's position on a support ordered most likely first (the public greedy token at 0): 0 when
    the support holds one token (public: nothing to decide, no test asked), when ``test`` is spent or finds the
    margin (:func:`expert_margin`) below its threshold; else a draw from softmax(ẑ).

    Args:
        scores: ẑ on the support.
        test: the answer's sparse-vector state.
        rng: the noise source of the draw.
    """
    if scores.size == 1 or test.spent or not test.above(expert_margin(scores, 0)):
        return 0
    return exponential_mechanism(scores, temperature=1.0, rng=rng)


def filter_budget_for(epsilon: float, delta: float, neighbouring: str) -> IndividualBudget:
    """The per-record filter budget whose cover costs a ledger of this relation (ε, δ): the filter's own
    (ε, δ) under add/remove; under replace-one the cover is (2ε_f, (1 + e^ε_f)δ_f) (group privacy,
    :meth:`PrivateKNN.cover_event`), so ε_f = ε/2 and δ_f = δ/(1 + e^{ε/2}) (rounded down).

    Args:
        epsilon: the ledger share's ε.
        delta: the ledger share's δ, in (0, 1).
        neighbouring: the ledger's relation.

    Raises:
        ConfigurationError: ``epsilon`` or ``delta`` is out of range.
    """
    eps = check.positive_finite("epsilon", epsilon)
    dlt = check.probability_open("delta", delta)
    if neighbouring == ADD_REMOVE:
        return IndividualBudget(epsilon=eps, delta=dlt)
    return IndividualBudget(epsilon=eps / 2.0, delta=math.nextafter(dlt / (1.0 + math.exp(eps / 2.0)), 0.0))


def build_expert_decoder(
    backend: NextTokenBackend,
    dataset: PrivateDataset,
    *,
    budget: BudgetManager,
    epsilon: float,
    n_queries: int,
    delta: float | None = None,
    max_tokens: int = 16,
    k: int = 40,
    min_similarity: float = 0.3,
    uses: int | None = None,
    population_size: int | None = None,
    embedder: object | None = None,
    public_temperature: float | None = None,
    top_k: int = 100,
    template: AnswerTemplate | None = None,
    fixed_latency: float | FixedLatency | None = None,
    choices: Sequence[str] | None = None,
    experts_per_unit: int | None = None,
    index_path: str | os.PathLike[str] | None = None,
    index_name: str = DEFAULT_INDEX_NAME,
    keep_index: bool = True,
    paid_tokens: int | None = None,
    test_ratio: float = 2.0,
    test_threshold: float | None = None,
    pay_per_token: bool = False,
) -> KNNExpertDecoder:
    """Expert decoding over a dataset: its records go into a :class:`PrivateIndex` whose per-record filter is
    covered by ``epsilon`` (and δ) on the ledger once. The index is kept beside a durable ledger
    (:func:`~dp_icl_plugin.retrieval.kept_index`), so an app that starts again with the same records and ledger
    reopens it, with its records' spend, and charges no second cover; only its answers are charged.

    Args:
        backend: the language model.
        dataset: the private records (text, label); a record's label is its demonstration's answer. Under a
            unit-level ledger the index is grouped by user, each record's unit its user id: one filter per unit.
        budget: the shared ledger; the filter's total is charged to it once, here.
        epsilon: this decoder's share of the ledger.
        n_queries: the answers expected; with ``k`` it sets ``uses`` (default ⌈n_queries·k/N⌉ answers per
            record, which holds when queries spread over the records; a record near many queries runs out
            sooner and its next neighbours take over).
        delta: δ of the share (default: half the ledger's δ).
        max_tokens: the answer limit.
        k: experts per answer.
        min_similarity: the public similarity a record needs to take part (and pay).
        uses: answers per record; or give the public ``population_size`` it is computed from. Under a
            replace-one ledger N defaults to |D| (public by the relation); under add/remove |D| is private and
            one of the two is required (it sets the noise of every answer).
        population_size: N, the public population size ``uses`` is computed from.
        embedder: the embedder (default all-MiniLM-L6-v2).
        public_temperature: the zero-shot row's temperature T0. It defaults to 0.1 (see :class:`KNNConfig`),
            or with ``choices`` to ``inf`` (no prior: the row, only a prior over the choices, leans to one of
            them whatever the question; on 30 TREC tune queries at ε = 4, T0 = 2 gave 63.3 % accuracy and
            ``inf`` 73.3 %, ``benchmarks/harness/RESULTS.md``).
        top_k: the zero-shot row's support: its this many most likely tokens (0: the whole vocabulary).
        template: as :class:`KNNExpertDecoder`.
        fixed_latency: as :class:`KNNExpertDecoder`.
        choices: public answers every answer is restricted to (:class:`KNNExpertDecoder`); the budget is then
            calibrated for the choices' token decisions, not ``max_tokens``.
        experts_per_unit: under a unit-level ledger, the most experts (one record each) one person gives an answer:
            its most similar records (``KNNConfig.records_per_unit``; default ``dataset.records_per_unit``). A
            person pays for each.
        index_path: where the index (records, vectors, each record's spend) is kept: a directory or a
            ``postgresql://`` URL. Default: beside the ledger (:func:`~dp_icl_plugin.retrieval.index_beside`):
            ``<ledger file>.indexes/<index_name>``, the ledger's PostgreSQL database, or memory beside an
            in-memory ledger.
        index_name: the kept index's name (one per set of records covered on one ledger; default
            ``"knn-experts"``).
        keep_index: False keeps the index in memory only, the records' texts never written beside the ledger
            (a kept index holds them, as the ledger's neighbours: protect that place as the data itself); every
            start then charges the filter's cover again.
        paid_tokens: sparse expert decoding: at most this many tokens of an answer come from the experts and are
            paid, each where a sparse-vector test finds the experts depart from the public greedy token; the
            other tokens are that greedy token, free (:class:`KNNConfig` ``expert_paid_tokens``). None (default):
            every token is paid.
        test_ratio: sparse: the test's ε over the token's (``KNNConfig.expert_test_ratio``).
        test_threshold: sparse: the test's threshold in nats (``KNNConfig.expert_test_threshold``).
        pay_per_token: each token mechanism charged to the candidates' filters right before it runs, not the
            answer's worst case up front (:class:`KNNExpertDecoder`); not with ``paid_tokens``.

    Raises:
        ConfigurationError: a bad setting, ``max_tokens`` below the longest choice, or a kept index with other
            records or another budget (before anything is charged; the message names the fix).
        BudgetExhaustedError: the ledger cannot afford the filter's charge.
    """
    check_dataset_settings(dataset, budget=budget, keep_index=keep_index)
    answers = None if choices is None else AnswerChoices.of(backend, choices)
    if answers is not None:  # calibrate for the token decisions an answer runs (public); too few tokens refused
        if answers.max_tokens > check.positive_int("max_tokens", max_tokens):
            raise ConfigurationError(
                f"max_tokens = {max_tokens} is below the {answers.max_tokens} tokens the longest choice needs: raise it"
            )
        max_tokens = answers.decisions
    if public_temperature is None:
        public_temperature = PUBLIC_TEMPERATURE if answers is None else CHOICES_PUBLIC_TEMPERATURE
    # the decoder's own settings, checked before the retriever charges the filter's cover (nothing paid for nothing)
    if template is not None and not isinstance(template, AnswerTemplate):
        raise ConfigurationTypeError("template must be an AnswerTemplate")
    fixed_latency = as_fixed_latency(fixed_latency)
    if not isinstance(pay_per_token, bool):
        raise ConfigurationTypeError("pay_per_token must be a bool")
    if pay_per_token and paid_tokens is not None:
        raise ConfigurationError("pay_per_token does not apply to sparse decoding (paid_tokens): drop one of them")
    where = None if not keep_index else index_beside(budget, index_name) if index_path is None else index_path
    if pay_per_token and is_postgres_url(getattr(where, "location", where)):
        raise ConfigurationError(
            "pay_per_token needs an index one host charges (a directory, or memory): an index in PostgreSQL is "
            "charged from several hosts, whose releases an answer cannot hold back between its tokens"
        )
    knn = knn_for_dataset(
        backend,
        dataset,
        budget=budget,
        epsilon=epsilon,
        n_queries=n_queries,
        delta=delta,
        k=k,
        uses=uses,
        population_size=population_size,
        embedder=embedder,
        per_unit_limit=experts_per_unit,
        index_path=index_path,
        index_name=index_name,
        keep_index=keep_index,
        releases=("decode",),
        settings={
            "min_similarity": min_similarity,
            "max_answer_tokens": max_tokens,
            "expert_public_temperature": public_temperature,
            "expert_top_k": top_k,
            "expert_paid_tokens": paid_tokens,
            "expert_test_ratio": test_ratio,
            "expert_test_threshold": test_threshold,
        },
    )
    return KNNExpertDecoder(
        knn,
        template=template,
        fixed_latency=fixed_latency,
        choices=answers,
        pay_per_token=pay_per_token,
    )


def knn_for_dataset(
    backend: NextTokenBackend,
    dataset: PrivateDataset,
    *,
    budget: BudgetManager,
    epsilon: float,
    n_queries: int,
    delta: float | None,
    k: int,
    uses: int | None,
    population_size: int | None,
    embedder: object | None,
    per_unit_limit: int | None,
    index_path: str | os.PathLike[str] | None,
    index_name: str,
    keep_index: bool,
    releases: tuple[str, ...],
    settings: dict[str, Any],
) -> PrivateKNN:
    """A :class:`PrivateKNN` over a dataset's records, its per-record (per-unit) filter covered by ``epsilon`` on
    the ledger once, the index kept beside a durable ledger (see :func:`build_expert_decoder`, whose arguments
    these are; ``per_unit_limit`` is its ``experts_per_unit``, ``settings`` further :class:`KNNConfig` fields).

    Raises:
        ConfigurationError: a bad setting, or a kept index with other records or another budget (before anything
            is charged).
        BudgetExhaustedError: the ledger cannot afford the filter's charge.
    """
    check_dataset_settings(dataset, budget=budget, keep_index=keep_index)
    n_queries = check.positive_int("n_queries", n_queries)
    k = check.positive_int("k", k)
    per_unit = require_units(dataset, budget.privacy_unit) != PER_RECORD
    records = [r for y in dataset.labels for r in dataset.records(y)]
    if uses is None and population_size is None and budget.neighbouring == ADD_REMOVE:
        raise ConfigurationError(
            "under an add/remove ledger |D| (per unit: the number of units) is private: give uses (answers per "
            "record) or the public population_size it is computed from"
        )
    # replace-one keeps the number of records (per unit: of units) fixed: public by the relation
    observed = len({unit_user_id(r.unit) for r in records}) if per_unit else len(records)
    population = observed if population_size is None else check.positive_int("population_size", population_size)
    per_record_uses = max(1, math.ceil(n_queries * k / population)) if uses is None else uses
    config = KNNConfig(
        k=k,
        shards=1,
        uses=per_record_uses,
        # contribution bounding per unit: a person's most similar records only, each paid for
        records_per_unit=(dataset.records_per_unit if per_unit_limit is None else per_unit_limit) if per_unit else None,
        **settings,
    )
    share = budget.budget.delta / 2.0 if delta is None else delta
    # per unit: one filter per unit (the index grouped by user, a record's unit its user id), covered as is
    index = kept_index(
        None if not keep_index else index_beside(budget, index_name) if index_path is None else index_path,
        budget=filter_budget_for(epsilon, share, budget.neighbouring),
        texts=[r.text for r in records],
        labels=[r.label for r in records],
        user_ids=[unit_user_id(r.unit) for r in records] if per_unit else None,
        embedder=embedder,
        group_by_user=per_unit,
        name=index_name,
    )
    # the public number of records (replace-one keeps it; add/remove: the declared size), per record only: a
    # unit's records are more voters than its one count
    return PrivateKNN(
        index,
        budget=budget,
        backend=backend,
        config=config,
        releases=releases,
        population=None if per_unit or (population_size is None and budget.neighbouring == ADD_REMOVE) else population,
    )


def check_dataset_settings(dataset: object, *, budget: object, keep_index: object) -> None:
    """The types a dataset-built kNN decoder needs, checked before anything loads or is charged.

    Raises:
        ConfigurationTypeError: a dataset that is no PrivateDataset, a budget that is no BudgetManager, or a
            ``keep_index`` that is not a bool.
    """
    if not isinstance(dataset, PrivateDataset):
        raise ConfigurationTypeError("dataset must be a PrivateDataset")
    if not isinstance(keep_index, bool):
        raise ConfigurationTypeError("keep_index must be True or False")
    if not isinstance(budget, BudgetManager):
        raise ConfigurationTypeError("budget must be a BudgetManager (the app's shared ledger)")
