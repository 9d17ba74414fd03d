"""DP decoding (pay per answer): private records steer each generated token of an answer to a public query.

- :class:`MozoDecoder` (DPS-MOZO+On, Flemings et al., Algorithm 2 with Algorithm 1): per token, ``n_shots``
  records drawn without replacement give one-shot prompts; their next-token distributions are mixed with the
  zero-shot one (top-k support of the zero-shot output, λ_i by bisection on the symmetric Rényi divergence) and the
  token is drawn from the product, released through the projected mechanism (see
  :mod:`dp_icl_plugin.synthesis.mozo_offline`).
  Replace-one neighbours only (|D| public by the relation; an add/remove ledger refuses it); each token
  (α, 4βα)-RDP amplified by sampling without replacement (q = n_shots/|D|).
- :class:`ClipBlendDecoder` (Bhusal et al., Algorithm 1, online): a fixed private subset (one record per
  prompt, chosen once: each record joins with probability s/N, N the population size, public), clipped
  logits averaged with the fixed divisor s, blended with the clipped public logits, sampled at temperature
  τ. Under the ledger's relation: replace-one, N = |D| (public by the relation), the replaced record keeps
  the other's draw and one prompt changes, ε0 = 2c/(sτ) per token; add/remove (the paper's), N must be
  declared (``population_size``), a record's membership then depends on its own draw only and one prompt
  appears or goes, ε0 = c/(sτ). Either way pure and bounded-range, over every token of every answer (the
  subset serves them all). The prompts stay fixed while decoding, so decoding runs on the backend's KV cache.

**Per unit** (a unit-level ledger, :mod:`~dp_icl_plugin.data.units`): both decoders draw units where they drew
records, and a drawn unit's prompt shows at most ``records_per_unit`` of its records (MOZO: drawn afresh per
token; clip-blend: chosen once with the subset). MOZO: q = n_shots/|U| (the number of units, fixed by unit
replace-one), one unit one row. Clip-blend: each unit joins the subset with probability s/N, N the number of units
(declared under add/remove), one unit one prompt, ε0 as above. Each answer's event is tagged
``privacy_unit="unit"``.

**Budget.** The caller assigns each decoder a share of the ledger: ``epsilon`` (and δ) for ``n_queries``
answers of at most ``max_tokens`` tokens each; β (MOZO) or τ (clip-blend) is calibrated so that all of them
together meet it. Every answer is charged *before its first token is computed*, for its worst case (every
token up to its limit; with public ``choices`` or a JSON schema the most token mechanisms they let an answer
run, a token they force being free), so a stream never yields a token that is not paid for, and a refusal
(:class:`~dp_icl_plugin.errors.BudgetExhaustedError`) happens before anything is released. Stopping early
(EOS, a stop sequence) is post-processing and refunds nothing. With ``pay_per_token=True`` the share is instead
an allowance on the ledger, charged once, and each token mechanism is drawn on it right before it runs, so an
answer pays for the tokens it ran (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`).

**Concurrency.** A decoder computes one token step at a time, whoever asks; a stream holds nothing between
its pieces, so open streams (threads, async tasks, a reader that paused) interleave token by token; an answer
with its own rng is what it would have been alone (streams sharing one rng draw from it in turn, so with a
seed their answers depend on the interleaving; never their privacy). With ``fixed_latency`` answers run one
at a time, each whole inside its own window (interleaved, each window would hold the others' computation;
see :mod:`dp_icl_plugin.timing`). :meth:`AnswerStream.cancel` lets a caller that gives up before its answer
began (waiting for its window, say) leave uncharged. Paid per token, answers of one allowance run one at a
time, each whole, in one piece (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`).

A query is public: a completion text, or a chat (a list of ``{"role", "content"}`` messages ending with the
user's). A record enters a chat prompt as one earlier exchange (its text from the user, its label from the
assistant) after any system message, formatted with the tokenizer's chat template when it has one; without
one (a base model such as the GINC model) the chat is laid out as plain lines, ``role: content`` each, then
``assistant:``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, closing, nullcontext
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.budget import BudgetManager, LedgerEntry
from dp_icl_plugin.accounting.calibration import calibrate_clip_blend_temperature, calibrate_mozo
from dp_icl_plugin.accounting.individual_filter import FILTER_ORDERS
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, PER_RECORD
from dp_icl_plugin.backends.base import NextTokenBackend, check_top_k, context_limit
from dp_icl_plugin.backends.public_rows import public_scope
from dp_icl_plugin.backends.shared_rows import public_suffix, start_rows
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import all_elements, records_of, require_units
from dp_icl_plugin.decoding.choices import AnswerChoices
from dp_icl_plugin.decoding.contract import (
    AnswerState,
    AnswerStream,
    DecodedAnswer,
    Query,
    check_query,
)
from dp_icl_plugin.decoding.pay_as_you_go import (
    PerToken,
    TokenAllowance,
    allowance_delta,
    calibrate_per_token,
    mozo_filter_order,
    per_token_settings,
)
from dp_icl_plugin.decoding.shares import BudgetShare, ClipBlendSettings, MozoSettings
from dp_icl_plugin.decoding.structured import JSONSchemaAnswers, json_schema_of, with_instruction
from dp_icl_plugin.errors import (
    AllowanceSpentError,
    BudgetExhaustedError,
    ConfigurationError,
    ConfigurationTypeError,
    ShareExhaustedError,
    iterate_after_charge,
)
from dp_icl_plugin.mechanisms.mozo_mixing import LAMBDA_MAX
from dp_icl_plugin.mechanisms.token_shift import log_odds_shift, mozo_shift, warn_if_weak
from dp_icl_plugin.steps.clip_blend_step import ClipBlendStep, assign_groups
from dp_icl_plugin.steps.mozo_step import MozoStep
from dp_icl_plugin.templates.answer import AnswerTemplate
from dp_icl_plugin.templates.prompting import check_records_encode
from dp_icl_plugin.timing import FixedLatency, ReleaseCancelled, as_fixed_latency

__all__ = [  # DecodedAnswer, Query, check_query: re-exported
    "ClipBlendDecoder",
    "DecodedAnswer",
    "MozoDecoder",
    "Query",
    "chat_ids",
    "check_query",
]


logger = logging.getLogger(__name__)

LEDGER_REFUSED_DRAW = (
    "the ledger refused a draw its allowance could pay (a ledger opened with another accountant?): the answer "
    "ends there as if its allowance were spent"
)
"""Logged (one fixed text) when a later draw of an answer paid per token is refused by the ledger itself."""

SCHEMA_CACHE_SIZE = 64  # compiled schemas a decoder keeps (least recently used dropped)


def share_delta(delta: float | None, budget: BudgetManager) -> float:
    """A decoder share's δ: ``delta``, or the ledger's (at which the ledger certifies the charges, so that the
    share costs the ε asked for). A larger one is allowed with a warning: the share then costs the ledger more
    than its ε.

    Args:
        delta: the share's δ, or None.
        budget: the ledger.

    Raises:
        ConfigurationError: ``delta`` is not in (0, 1).
    """
    if delta is None:
        return float(budget.budget.delta)
    value = check.probability_open("delta", delta)
    if value > budget.budget.delta:
        warnings.warn(
            f"delta = {value:g} is above the ledger's {budget.budget.delta:g}: the ledger certifies the share at "
            "its own delta, where it costs more than the epsilon asked for",
            stacklevel=3,
        )
    return value


def chat_ids(backend: NextTokenBackend, messages: Sequence[dict[str, str]]) -> list[int]:
    """A chat's prompt ids, ready for the assistant's answer: the tokenizer's chat template, or, for a model
    without one, ``role: content`` lines then ``assistant:`` (the layout every decoder and the zero-shot baseline
    share).

    Args:
        backend: the model.
        messages: the chat, ``{"role", "content"}`` dicts.
    """
    if backend.has_chat_template:
        return list(backend.apply_chat_template(list(messages), add_generation_prompt=True))
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return list(backend.encode(text, add_special_tokens=True))


def query_text(query: str | tuple[dict[str, str], ...]) -> str:
    """A checked query's own text: a completion prompt (without a schema's instruction), or a chat's last (user)
    message.

    Args:
        query: a query checked by :func:`~dp_icl_plugin.decoding.contract.check_query`.
    """
    return str(getattr(query, "query", query)) if isinstance(query, str) else query[-1]["content"]


class _Decoder:
    """Shared plumbing: prompt building, the per-answer charge, stop sequences, streaming. Subclasses say what
    an answer is charged (:meth:`_charge`) and how its tokens are drawn (:meth:`_tokens`)."""

    kind = ""

    def __init__(
        self,
        *,
        backend: NextTokenBackend,
        budget: BudgetManager,
        max_tokens: int | None,
        template: AnswerTemplate | None,
        fixed_latency: float | FixedLatency | None,
        choices: Sequence[str] | AnswerChoices | None = None,
    ) -> None:
        """``max_tokens`` None: the longest choice's tokens (``choices`` required)."""
        if not isinstance(budget, BudgetManager):
            raise ConfigurationTypeError("budget must be a BudgetManager (the app's shared ledger)")
        if not isinstance(backend, NextTokenBackend):
            raise ConfigurationTypeError("backend must be a NextTokenBackend")
        self.backend = backend
        self.budget = budget
        self.choices = None if choices is None else AnswerChoices.of(backend, choices)
        if max_tokens is None and self.choices is None:
            raise ConfigurationError("max_tokens is required without choices")
        self.max_tokens = check.positive_int("max_tokens", max_tokens) if max_tokens is not None else 0
        if self.choices is not None:  # public: an answer is at most the longest choice, and that is what is paid
            if max_tokens is not None and self.choices.max_tokens > self.max_tokens:
                raise ConfigurationError(
                    f"max_tokens = {self.max_tokens} is below the {self.choices.max_tokens} tokens the longest "
                    "choice needs: raise it (an answer cut inside a choice would be no choice)"
                )
            self.max_tokens = self.choices.max_tokens
        self.template = template if template is not None else AnswerTemplate(stop=None)
        if not isinstance(self.template, AnswerTemplate):
            raise ConfigurationTypeError("template must be an AnswerTemplate")
        self.fixed_latency = as_fixed_latency(fixed_latency)
        self._lock = threading.Lock()  # one token step at a time (backend, rng, tokenizer); never held across a yield
        self._schemas: dict[str, JSONSchemaAnswers] = {}  # compiled per schema (public)
        self._schemas_lock = threading.Lock()
        self.n_queries: int | None = None  # answers the share covers (set by decoders that calibrate per answer)
        self.allowance: TokenAllowance | None = None  # pay per token (pay_as_you_go): the share on the ledger
        self.when_spent = "stop"
        self._answered = 0
        self._answers_lock = threading.Lock()  # the count and the charge together

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_tokens={self.max_tokens})"  # no record count: private under add/remove

    def __reduce__(self):  # a decoder holds private records: never pickled along with a model or chain
        raise TypeError(f"{type(self).__name__} holds private records and cannot be pickled")

    # -- what an answer costs -------------------------------------------------------------------------
    def answer_event(self, max_tokens: int | None = None, *, schema: object | None = None) -> ev.DPEvent:
        """The event one answer of at most ``max_tokens`` tokens is charged: its most token mechanisms (every
        token; with choices their decisions; with ``schema`` the most its grammar lets an answer run,
        :meth:`~dp_icl_plugin.decoding.structured.JSONSchemaAnswers.decisions`).

        Args:
            max_tokens: the answer's limit (default: the decoder's).
            schema: a public JSON schema the answer follows, or None.

        Raises:
            ConfigurationError: ``max_tokens`` is not a positive integer, or a schema that does not compile.
        """
        tokens = self.max_tokens if max_tokens is None else check.positive_int("max_tokens", max_tokens)
        return self._steps_event(self._steps(tokens, self._rules(schema)))

    def _steps_event(self, steps: int) -> ev.DPEvent:
        """The event of ``steps`` token mechanisms (one answer's charge)."""
        raise NotImplementedError

    def _share_noise(
        self,
        epsilon: float | None,
        delta: float | None,
        given: float | None,
        *,
        name: str,
        calibrate: Callable[[float, float, int], float],
    ) -> float:
        """The mechanism's noise parameter for this decoder's share: ``given`` as is, or calibrated so that
        :attr:`n_queries` answers of :attr:`max_tokens` tokens (their charged steps) meet ``epsilon`` at the
        share's δ (:func:`share_delta`, kept as :attr:`delta`).

        Args:
            epsilon: the share's ε, or None when ``given``.
            delta: the share's δ (None: the ledger's).
            given: the noise parameter itself (β, τ), or None when ``epsilon``.
            name: the parameter's name, for errors.
            calibrate: ``(ε, δ, steps) -> value``, the method's calibration.

        Raises:
            ConfigurationError: both or neither of ``epsilon`` and ``given``, or a bad value.
        """
        if (epsilon is None) == (given is None):
            raise ConfigurationError(f"give exactly one of epsilon ({name} is calibrated) and {name}")
        if self.n_queries is None:
            raise ConfigurationError(f"{type(self).__name__} calibrates for n_queries answers: set it first")
        self.delta = share_delta(delta, self.budget)
        if given is not None:
            return check.positive_finite(name, given)
        steps = self.n_queries * self._steps(self.max_tokens)
        return float(calibrate(check.positive_finite("epsilon", epsilon), self.delta, steps))

    def _per_token_share(
        self,
        per_token: PerToken,
        *,
        epsilon: float | None,
        delta: float | None,
        given: float | None,
        name: str,
        token_event: Callable[[float], ev.DPEvent],
        lo: float,
        hi: float,
        find: str,
        orders: tuple[float, ...] = FILTER_ORDERS,
    ) -> float:
        """Open this decoder's allowance (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`) for the share ``epsilon``
        at δ (:func:`~dp_icl_plugin.decoding.pay_as_you_go.allowance_delta`) and return the noise parameter whose
        :attr:`n_queries` answers of
        ``per_token.expected_tokens`` tokens fit it (the search's value: β, or 1/τ).

        Raises:
            ConfigurationError: no ``epsilon``, or ``given`` too (the allowance is the share), or a bad setting.
            CalibrationError: nothing in ``[lo, hi]`` fits.
        """
        if epsilon is None or given is not None:
            raise ConfigurationError(
                f"pay_per_token needs epsilon (the allowance) and calibrates {name}: give epsilon, not {name}"
            )
        assert self.n_queries is not None
        expected = self.max_tokens if per_token.expected_tokens is None else per_token.expected_tokens
        if expected > self.max_tokens:
            raise ConfigurationError(f"expected_tokens = {expected} exceeds max_tokens = {self.max_tokens}")
        self.delta = allowance_delta(delta, self.budget)
        self.when_spent = per_token.when_spent
        self.allowance = TokenAllowance(
            self.budget,
            component=self.kind,
            epsilon=check.positive_finite("epsilon", epsilon),
            delta=self.delta,
            name=per_token.allowance_name,
            orders=orders,
        )
        return calibrate_per_token(
            token_event,
            steps=self.n_queries * self._steps(expected),
            filter_budget=self.allowance.filter,
            neighbouring=self.budget.neighbouring,
            lo=lo,
            hi=hi,
            find=find,
        )

    # -- the Decoder contract (dp_icl_plugin.decoding.contract) -------------------------------------------
    @property
    def context_window(self) -> int | None:
        """The model's positions (None when the backend has no limit)."""
        return context_limit(self.backend)

    @property
    def has_chat_template(self) -> bool:
        """Whether chats are laid out by the model's chat template (else as ``role: content`` lines)."""
        return bool(getattr(self.backend, "has_chat_template", False))

    def check(
        self,
        query: Query,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> None:
        """Raise :class:`~dp_icl_plugin.errors.ConfigurationError` for what :meth:`stream` would refuse
        (a bad query, limit, stop list or schema); nothing is charged.

        Args:
            query: the public query (a completion text or a chat).
            max_tokens: the answer's limit (default: the decoder's).
            stop: stop sequences.
            schema: a public JSON schema the answer must follow.
        """
        self._prepare(query, max_tokens, stop, schema)

    def prompt_tokens(self, query: Query, schema: object | None = None) -> int:
        """Tokens of the public prompt (the query in the template, with ``schema``'s instruction when given; no
        record): never a private record's length.

        Args:
            query: the public query (a completion text or a chat).
            schema: a public JSON schema, or None.

        Raises:
            ConfigurationError: a bad query or schema.
        """
        prompt = check_query(query)
        rules = None if schema is None else self._rules(schema)
        if isinstance(rules, JSONSchemaAnswers):
            prompt = with_instruction(prompt, rules.instruction)
        return len(self._ids(prompt, None))

    def token_ids(self, text: str) -> list[int]:
        """``text`` (public: the caller's) in the model's own tokens, without special tokens: what a framework
        counts to trim a conversation to the model (its default tokenizer is another model's).

        Args:
            text: public text.

        Raises:
            ConfigurationError: ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise ConfigurationError("text must be a string")
        return list(self.backend.encode(text, add_special_tokens=False))

    def stream(
        self,
        query: Query,
        *,
        rng: np.random.Generator,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> AnswerStream:
        """Yield the answer's text piece by piece; the whole answer is charged before the first piece.

        Args:
            query: the public query (a completion text or a chat).
            rng: the noise source.
            max_tokens: this answer's limit (at most the decoder's; charged in full, or
                its decisions under choices or a schema).
            stop: stop sequences (post-processing: they refund nothing).
            schema: a public JSON schema (dict, JSON text or Pydantic model class): the answer is then a JSON
                document valid under it (:mod:`~dp_icl_plugin.decoding.structured`; not with ``choices``).

        Raises:
            ConfigurationError: at once, for a bad query, stop sequences, limits, schema or rng (nothing charged).
            BudgetExhaustedError: on the first ``next``, before anything is computed from private data.
            ReleaseFailedError: while reading, when the computation failed after the charge.
        """
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationTypeError("rng must be a numpy.random.Generator")
        limit, stops, prompt, rules = self._prepare(query, max_tokens, stop, schema)
        steps = self._steps(limit, rules)  # public: what the answer is charged for, and all it may run
        state = AnswerState(
            rule=rules.start(allowance=steps) if isinstance(rules, JSONSchemaAnswers) else rules, steps=steps
        )
        return AnswerStream(self._run(prompt, limit, stops, rng, state), state, len(self._ids(prompt, None)))

    def generate(
        self,
        query: Query,
        *,
        rng: np.random.Generator,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> DecodedAnswer:
        """The whole answer (charged first); arguments as :meth:`stream`.

        Raises:
            ConfigurationError: what :meth:`stream` refuses at once (nothing charged).
            BudgetExhaustedError: the charge was refused (``ShareExhaustedError`` past ``n_queries``); nothing was
                computed.
            ReleaseFailedError: the computation failed after the charge.
        """
        pieces = self.stream(query, rng=rng, max_tokens=max_tokens, stop=stop, schema=schema)
        for _ in pieces:
            pass
        charge = pieces.charge
        assert charge is not None  # the first next() charges or raises
        _, stops, _, _ = self._prepare(query, max_tokens, stop, schema)  # public: the same stops the stream cut at
        text = self._cut(self.backend.decode(list(pieces.token_ids)), stops)
        return DecodedAnswer(text, pieces.token_ids, pieces.finish_reason, charge.id, charge, pieces.released)

    # -- internals ------------------------------------------------------------------------------------
    @staticmethod
    def _stops(stop: Sequence[str] | None) -> tuple[str, ...]:
        if stop is None:
            return ()
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ConfigurationError("stop must be a list of non-empty strings")
        return tuple(stop)

    def _rules(self, schema: object | None) -> AnswerChoices | JSONSchemaAnswers | None:
        """What restricts an answer's tokens: the decoder's choices, a call's schema (compiled once per schema),
        or nothing."""
        if schema is None:
            return self.choices
        if self.choices is not None:
            raise ConfigurationError("a decoder with choices answers with one of them: it takes no schema")
        key = json.dumps(json_schema_of(schema))  # key order is the fields' order in the answer: kept
        with self._schemas_lock:
            compiled = self._schemas.pop(key, None)
            if compiled is None:
                compiled = JSONSchemaAnswers(self.backend, schema)
            self._schemas[key] = compiled  # most recent last
            while len(self._schemas) > SCHEMA_CACHE_SIZE:
                self._schemas.pop(next(iter(self._schemas)))
        return compiled

    def _prepare(
        self, query, max_tokens, stop, schema=None
    ) -> tuple[int, tuple[str, ...], str | tuple[dict[str, str], ...], AnswerChoices | JSONSchemaAnswers | None]:
        rules = self._rules(schema)
        limit = self.max_tokens if max_tokens is None else check.positive_int("max_tokens", max_tokens)
        if limit > self.max_tokens:
            raise ConfigurationError(f"max_tokens = {limit} exceeds the {self.max_tokens} this decoder's budget covers")
        if self.choices is not None and limit < self.choices.max_tokens:
            raise ConfigurationError(
                f"max_tokens = {limit} is below the {self.choices.max_tokens} tokens the longest choice needs"
            )
        stops = self._stops(stop) + ((self.template.stop,) if self.template.stop is not None else ())
        if self.choices is not None and any(s in c for s in stops for c in self.choices.texts + self.choices.decoded):
            raise ConfigurationError("a stop sequence occurs inside a choice: the answer would be cut to no choice")
        prompt = check_query(query)
        if isinstance(rules, JSONSchemaAnswers):  # public: the schema's fields in words, for the model
            prompt = with_instruction(prompt, rules.instruction)
        if not self._ids(prompt, None, reserve=self._reserve(limit)):
            raise ConfigurationError("the prompt encodes to no tokens")
        return limit, stops, prompt, rules

    def _reserve(self, limit: int) -> int:
        """Positions a prompt must leave free for an answer of ``limit`` tokens beyond the next one: none when
        every step's prompts are cut afresh (MOZO), ``limit − 1`` for prompts that stay fixed (clip-blend)."""
        return 0

    def _ids(
        self,
        query: str | tuple[dict[str, str], ...],
        record: PrivateRecord | Sequence[PrivateRecord] | None,
        *,
        reserve: int = 0,
    ) -> list[int]:
        """The prompt ids of ``query`` with no example (public), or with ``record`` (one record, or one unit's
        records) as its examples, cut to the model's length less ``reserve``."""
        b, t = self.backend, self.template
        examples = [] if record is None else [record] if isinstance(record, PrivateRecord) else list(record)
        if isinstance(query, str):
            text = t.zero_shot_prompt(query) if record is None else t.one_shot_prompt(examples, query)
            ids = b.encode(text, add_special_tokens=True)
        else:
            messages = list(query)
            if record is not None:
                at = 1 if messages[0]["role"] == "system" else 0
                messages[at:at] = [
                    {"role": role, "content": content}
                    for r in examples
                    for role, content in (("user", r.text), ("assistant", r.label))
                ]
            ids = chat_ids(b, messages)
        capacity = context_limit(b)
        room = None if capacity is None else capacity - 1 - reserve  # one position left for the next token
        if room is not None and room < 1:  # public: the query's limit against the model's length
            raise ConfigurationError(f"an answer of {reserve + 1} tokens does not fit the model's {capacity} positions")
        return ids if room is None or len(ids) <= room else ids[-room:]

    def _public_suffix(self, query: str | tuple[dict[str, str], ...], *, reserve: int = 0) -> list[int]:
        """The tokens every step's prompts may share at their end (the query part), found from public inputs
        only: the zero-shot prompt against a one-shot prompt whose record is the query's own (public) text."""
        probe_text = query_text(query)
        try:
            probe = self._ids(query, PrivateRecord(probe_text, probe_text), reserve=reserve)
        except Exception:  # the public probe does not encode (public: the query's own text): rows go whole
            return []
        return public_suffix(self._ids(query, None, reserve=reserve), probe)

    @staticmethod
    def _cut(text: str, stops: tuple[str, ...]) -> str:
        ends = [text.index(s) for s in stops if s in text]
        return text[: min(ends)] if ends else text

    def _answer_turn(self, state: AnswerState) -> AbstractContextManager[None] | None:
        """What an answer paid per token holds from its first charge to its last (its allowance's turn), or None
        for an answer charged up front."""
        return self.allowance.turn(cancelled=state.cancelled) if self.allowance is not None else None

    def _run(self, prompt, limit, stops, rng, state: AnswerState) -> Generator[str, None, None]:
        turn = self._answer_turn(state)
        if self.fixed_latency is None and turn is None:
            yield from self._release(prompt, limit, stops, rng, state)
            return
        # The whole answer inside its own window (one release at a time per FixedLatency), then one piece at
        # the fixed time. Paid per token, the whole answer in its turn (where it is cut, and who pays its later
        # tokens, must not depend on how fast another answer computes), then one piece. A caller that gives up
        # while waiting for its turn leaves uncharged.
        try:
            with (  # the turn first: a latency window must not wait inside for another's answer
                turn if turn is not None else nullcontext(),
                self.fixed_latency.hold(cancelled=state.cancelled) if self.fixed_latency is not None else nullcontext(),
            ):
                text = "".join(self._release(prompt, limit, stops, rng, state))
        except ReleaseCancelled:
            return
        if text:
            yield text

    def _release(self, prompt, limit, stops, rng, state: AnswerState) -> Iterator[str]:
        # The charge comes first: nothing below runs, and nothing is yielded, unless it is committed.
        if state.cancelled.is_set():  # the caller gave up before its answer began: nothing to pay for
            return
        with self._answers_lock:
            if self.allowance is None and self.n_queries is not None and self._answered >= self.n_queries:
                raise self._share_spent(limit)
            assert state.steps is not None  # set by stream(), before the charge
            charge, paid = self._charge(prompt, state.steps)
            self._answered += 1
        state.charged(charge)
        # Anything that fails from here on read private records: one fixed error, no cause, no context
        # (whether and how it failed must not depend on them; records were checked when this was built).
        yield from iterate_after_charge(self._pieces(prompt, limit, stops, rng, state, paid))

    @property
    def answers_left(self) -> int | None:
        """Answers this decoder's share still covers (None: no count; its records' own filters, or its allowance
        paid per token, bound them)."""
        if self.n_queries is None or self.allowance is not None:
            return None
        return max(self.n_queries - self._answered, 0)

    def check_answers_left(self, answers: int) -> None:
        """Refuse, before any is charged, ``answers`` answers (a batch) when this decoder's share covers fewer:
        the first ones would be charged and then lost with the batch's error.

        Args:
            answers: the answers the batch asks for.

        Raises:
            ShareExhaustedError: more answers than :attr:`answers_left`; nothing charged.
            AllowanceSpentError: paid per token, more answers than the allowance can pay a first token for.
        """
        left = self.answers_left
        if left is not None and answers > left:
            raise self._share_spent(self.max_tokens, asked=answers if left else None)
        if self.allowance is not None and answers > 1:  # paid per token: each answer needs at least its first draw
            with self.allowance.turn():  # read between answers: never how far one has got
                draws = self.allowance.draws_left(self._steps_event(1))
            if answers > draws:
                raise AllowanceSpentError(
                    f"{answers} answers asked for, and the allowance {self.allowance.label!r} can pay the first "
                    f"token of {draws}; nothing was committed",
                    requested_epsilon=self.allowance.epsilon_of(self._steps_event(1), answers, capped=False),
                    remaining_epsilon=math.nan,
                    total_epsilon=math.nan,
                )

    def _share_spent(self, limit: int, asked: int | None = None) -> ShareExhaustedError:
        """The refusal of an answer beyond ``n_queries`` (its calibration covers no more), or of a batch of
        ``asked`` answers beyond those left; nothing charged."""
        assert self.n_queries is not None
        requested = tightest().epsilon(self.answer_event(limit), delta=self.budget.budget.delta)
        if asked is None:
            why = (
                f"this decoder's share covers {self.n_queries} answers and all were given: its noise was "
                "calibrated for no more (the ledger itself may have room: build a new decoder for a new share)"
            )
        else:
            why = f"{asked} answers asked for, {self.answers_left} left of this decoder's share of {self.n_queries}"
        return ShareExhaustedError(
            f"{why}; nothing was committed", requested_epsilon=requested, n_queries=self.n_queries
        )

    def _charge(self, prompt, steps: int) -> tuple[LedgerEntry, Any]:
        """Charge one answer of at most ``steps`` token mechanisms (nothing private computed yet); returns the
        committed ledger entry and what the answer's tokens are drawn from (here nothing beyond the decoder's
        records)."""
        if self.allowance is None:
            return self.budget.spend(self._steps_event(steps), label=f"{self.kind}-answer"), None
        # per token: the answer's first token mechanism is drawn now (a refusal: nothing computed), each next one
        # right before it runs (_TokenMeter.pay)
        meter = _TokenMeter(self.allowance, self._steps_event(1))
        return meter.first, meter

    @staticmethod
    def _pay(paid: Any) -> bool:
        """Before a token mechanism runs: whether it is paid (per answer: it is; per token: a draw now)."""
        return not isinstance(paid, _TokenMeter) or paid.pay()

    def _after_allowance(self, prompt, generated: list[int], limit: int, rule: Any) -> Generator[int, None, None]:
        """The rest of an answer whose allowance could not pay its next token: nothing (``when_spent="stop"``), or
        the public model's greedy tokens (``"public"``): the zero-shot prompt and the released tokens only."""
        if self.when_spent != "public" or len(generated) >= limit:
            return
        yield from self._public_greedy(
            [*self._ids(prompt, None, reserve=limit - 1), *generated], generated, limit, rule
        )

    def _public_greedy(self, ids: list[int], generated: list[int], limit: int, rule: Any) -> Generator[int, None, None]:
        """The public model's greedy tokens after ``ids`` (a public prompt and the ``generated`` tokens it ends
        with) until the answer has ``limit`` tokens, each within ``rule``; ``generated`` grows with them."""
        with public_scope(self.backend):
            session = start_rows(self.backend, [ids], public=1)
        with closing(session):
            row = np.asarray(session.logprobs)
            while len(generated) < limit:
                forced = self._forced(generated, rule)
                token = forced if forced is not None else self._draw(_greedy, row, generated, rule)
                generated.append(token)
                yield token
                if len(generated) < limit:
                    row = np.asarray(session.append([token]))

    def _pieces(self, prompt, limit, stops, rng, state: AnswerState, paid: Any) -> Iterator[str]:
        rule = state.rule
        tokens = self._tokens(prompt, limit, rng, paid, rule)
        hold = max((len(s) - 1 for s in stops), default=0)  # a tail that may still grow into a stop sequence
        try:
            while True:
                # The lock guards one step (the backend, the rng, the tokenizer), never a pause between pieces:
                # a reader that stops reading holds nothing, and other answers interleave with this one.
                with self._lock:
                    token = next(tokens, None)
                    # with choices or a schema an end-of-sequence token only ever ends the answer: never its text
                    ended = token is None or (
                        token == self.backend.eos_token_id and (self.template.stop_at_eos or rule is not None)
                    )
                    if token is not None and not ended:
                        state.tokens.append(token)
                        ended = rule is not None and rule.complete(state.tokens)
                    text = self.backend.decode(state.tokens)
                cut = self._cut(text, stops)
                if ended or len(cut) < len(text):
                    if token is not None:
                        state.finish_reason = "stop"
                    if len(cut) > state.emitted:
                        yield cut[state.emitted :]
                        state.emitted = len(cut)
                    return
                safe = max(len(cut) - hold, state.emitted)
                # ... and an unfinished multi-byte character (decoded as U+FFFD until its last byte arrives)
                safe = min(safe, max(len(cut.rstrip("\ufffd")), state.emitted))
                if safe > state.emitted:
                    yield cut[state.emitted : safe]
                    state.emitted = safe
        finally:
            tokens.close()  # its session drops its caches; no lock (a collected stream may close in any thread)

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any, rule: Any) -> Generator[int, None, None]:
        """The answer's tokens (``rule``: the public restriction of each, or None; see :meth:`_draw`)."""
        raise NotImplementedError

    def _steps(self, tokens: int, rules: Any = None) -> int:
        """Token mechanisms an answer of at most ``tokens`` tokens runs, what it is charged and calibrated for:
        ``tokens``, or with :attr:`choices` their :attr:`~AnswerChoices.decisions`, or with a schema's ``rules``
        the most its grammar lets such an answer run (at least 1; a token that alone can follow is public and
        free)."""
        if isinstance(rules, JSONSchemaAnswers):
            return max(1, min(tokens, rules.decisions(tokens)))
        return tokens if self.choices is None else self.choices.decisions

    @staticmethod
    def _forced(generated: Sequence[int], rule: Any) -> int | None:
        """The next token where ``rule`` (choices, a schema) leaves only one (public: no mechanism runs), else
        None."""
        return None if rule is None else rule.forced(generated)

    @staticmethod
    def _draw(mechanism: Callable[[np.ndarray], int], logprobs: np.ndarray, generated: Sequence[int], rule: Any) -> int:
        """One token: ``mechanism`` (rows → a column) on every column, or, with a ``rule``, on the columns it
        allows after ``generated`` (a public support: :mod:`~dp_icl_plugin.decoding.choices`,
        :mod:`~dp_icl_plugin.decoding.structured`)."""
        if rule is None:
            return int(mechanism(logprobs))
        return int(rule.restrict(mechanism, logprobs, generated))


class _DatasetDecoder(_Decoder):
    """A decoder over a :class:`PrivateDataset` held in memory, charged to the ledger per answer."""

    def __init__(
        self,
        dataset: PrivateDataset,
        *,
        backend: NextTokenBackend,
        budget: BudgetManager,
        max_tokens: int,
        template: AnswerTemplate | None,
        fixed_latency: float | FixedLatency | None,
        choices: Sequence[str] | AnswerChoices | None,
    ) -> None:
        if not isinstance(dataset, PrivateDataset):
            raise ConfigurationTypeError("dataset must be a PrivateDataset")
        super().__init__(
            backend=backend,
            budget=budget,
            max_tokens=max_tokens,
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )
        self.dataset = dataset
        self.privacy_unit = require_units(dataset, budget.privacy_unit)
        self._records = [r for y in dataset.labels for r in dataset.records(y)]
        # what the draws sample: each record alone, or per unit each unit's records (data.units)
        self._elements = all_elements(dataset, self.privacy_unit)
        check_records_encode(backend, self._records, with_labels=True)

    def _per_unit(self, event: ev.DPEvent) -> ev.DPEvent:
        """``event`` stated for the ledger's privacy unit (the analysis is the same per unit: data.units)."""
        return ev.with_privacy_unit(event, self.privacy_unit)


class MozoDecoder(_DatasetDecoder):
    """DPS-MOZO online decoding; see the module docstring.

    Args:
        dataset: the private records (their text and label form each one-shot example).
        backend: the language model.
        budget: the shared ledger; every answer is charged to it before it is computed.
        n_queries: how many answers the share covers; the decoder refuses the next one
            (:class:`~dp_icl_plugin.errors.ShareExhaustedError`, nothing charged). Counted per decoder object:
            the shared ledger is what bounds answers across copies and processes.
        max_tokens: the most tokens of one answer (charged in full); with ``choices``, the longest choice's.
        epsilon: this decoder's share of the budget, for ``n_queries`` answers (β is calibrated); or give
            ``beta`` directly.
        beta: the target leakage β per token, instead of ``epsilon``.
        delta: δ of that share (default: the ledger's δ, at which the ledger certifies what it is charged, so
            that the share costs the ``epsilon`` asked for).
        n_shots: the records drawn per token, one per one-shot prompt (the paper: 4); under a unit-level ledger,
            units (each prompt then shows at most ``dataset.records_per_unit`` of the unit's records).
        top_k: the size of the zero-shot output's public top-k support (the paper: 100).
        order: the Rényi order α (default 8).
        lambda_max: the upper limit of each mixing weight λ_i (the paper: 1.5).
        template: how a record and a completion query form a prompt (default: ``AnswerTemplate``).
        fixed_latency: hide timing: every answer returns this many seconds after it starts, streams in one
            piece at the end (seconds or a shared :class:`~dp_icl_plugin.timing.FixedLatency`).
        choices: public answers (:mod:`~dp_icl_plugin.decoding.choices`): every answer is one of them.
        pay_per_token: pay per token mechanism from an allowance of ``epsilon`` on the ledger instead of per
            answer (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`); ``delta`` then defaults to a tenth of the
            ledger's, β is calibrated for ``n_queries`` answers of ``expected_tokens``, and the allowance, not
            ``n_queries``, bounds the answers.
        allowance_name: with ``pay_per_token``: the allowance's name on the ledger, found again at a restart; held
            by one process at a time (a second one opening it is refused,
            :mod:`~dp_icl_plugin.decoding.allowance_lease`).
        when_spent: with ``pay_per_token``: an answer whose next token the allowance cannot pay ends
            (``"stop"``) or goes on with the public model's greedy tokens (``"public"``).
        expected_tokens: with ``pay_per_token``: the tokens an answer is expected to run (public; default
            ``max_tokens``).

    Raises:
        ConfigurationError: a bad argument, a record the tokenizer cannot encode, an add/remove ledger, both or
            neither of ``epsilon`` and ``beta``, or ``n_shots`` above the number of records.
        CalibrationError: no β meets ``epsilon``.
    """

    kind = "mozo"

    def __init__(
        self,
        dataset: PrivateDataset,
        *,
        backend: NextTokenBackend,
        budget: BudgetManager,
        n_queries: int,
        max_tokens: int = 32,
        epsilon: float | None = None,
        beta: float | None = None,
        delta: float | None = None,
        n_shots: int = 4,
        top_k: int = 100,
        order: float = 8.0,
        lambda_max: float = LAMBDA_MAX,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
        pay_per_token: bool = False,
        allowance_name: str | None = None,
        when_spent: str = "stop",
        expected_tokens: int | None = None,
    ) -> None:
        per_token = per_token_settings(pay_per_token, allowance_name, when_spent, expected_tokens)
        super().__init__(
            dataset,
            backend=backend,
            budget=budget,
            max_tokens=max_tokens,
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )
        me.require_replace_one("DPS-MOZO", budget.neighbouring)
        self.n_queries = check.positive_int("n_queries", n_queries)
        self.n_shots = check.positive_int("n_shots", n_shots)
        self.top_k = min(check.positive_int("top_k", top_k), backend.vocab_size)
        check_top_k(self.top_k, backend)
        self.order = check.order("order", order)
        self.lambda_max = check.positive_finite("lambda_max", lambda_max)
        # public: replace-one neighbours have the same number of records (per unit: of units)
        what = "records" if self.privacy_unit == PER_RECORD else "units"
        if self.n_shots > len(self._elements):
            raise ConfigurationError(f"n_shots = {self.n_shots} exceeds the {len(self._elements)} {what}")
        self.sampling_rate = self.n_shots / len(self._elements)
        if per_token is not None:
            self.beta = self._per_token_share(
                per_token,
                epsilon=epsilon,
                delta=delta,
                given=beta,
                name="beta",
                token_event=lambda b: self._per_unit(
                    me.mozo_event(beta=b, order=self.order, sampling_rate=self.sampling_rate, steps=1)
                ),
                lo=1e-9,
                hi=100.0,
                find="largest",
                orders=(mozo_filter_order(self.order),),  # one order ≤ α, no δ split
            )
        else:
            self.beta = self._share_noise(
                epsilon,
                delta,
                beta,
                name="beta",
                calibrate=lambda eps, dlt, steps: (
                    calibrate_mozo(
                        epsilon=eps, delta=dlt, sampling_rate=self.sampling_rate, steps=steps, order=self.order
                    ).value
                ),
            )
        warn_if_weak(
            f"DPS-MOZO at beta = {self.beta:.3g}",
            mozo_shift(self.beta, self.order),
            "raise epsilon, or lower n_queries or max_tokens (beta is spread over every token)",
        )

    @classmethod
    def with_epsilon(
        cls,
        dataset: PrivateDataset,
        share: BudgetShare,
        *,
        backend: NextTokenBackend,
        budget: BudgetManager,
        settings: MozoSettings | None = None,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
    ) -> MozoDecoder:
        """A decoder whose β is calibrated so that ``share``'s answers together meet its ε.

        Args:
            dataset: the private records.
            share: this decoder's share of ``budget``.
            backend: the language model.
            budget: the shared ledger.
            settings: the mechanism's settings (default: the paper's).
            template: as the constructor.
            fixed_latency: as the constructor.
            choices: as the constructor.

        Returns:
            The decoder.

        Raises:
            ConfigurationTypeError: an argument of the wrong type.
            ConfigurationError: what the constructor refuses (nothing is charged).
        """
        return cls(
            dataset,
            backend=backend,
            budget=budget,
            **_share_keywords(share),
            **_keywords(MozoSettings() if settings is None else settings, MozoSettings),
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )

    @classmethod
    def with_beta(
        cls,
        dataset: PrivateDataset,
        beta: float,
        *,
        n_queries: int,
        max_tokens: int = 32,
        backend: NextTokenBackend,
        budget: BudgetManager,
        settings: MozoSettings | None = None,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
    ) -> MozoDecoder:
        """A decoder at the target leakage β itself (accounted as given; each answer is charged its tokens).

        Args:
            dataset: the private records.
            beta: β of every token.
            n_queries: the answers this decoder gives.
            max_tokens: the most tokens of one answer.
            backend: the language model.
            budget: the shared ledger.
            settings: the mechanism's settings (default: the paper's).
            template: as the constructor.
            fixed_latency: as the constructor.
            choices: as the constructor.

        Returns:
            The decoder.

        Raises:
            ConfigurationTypeError: an argument of the wrong type.
            ConfigurationError: what the constructor refuses (nothing is charged).
        """
        return cls(
            dataset,
            backend=backend,
            budget=budget,
            n_queries=n_queries,
            max_tokens=max_tokens,
            beta=beta,
            **_keywords(MozoSettings() if settings is None else settings, MozoSettings),
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )

    def _steps_event(self, steps: int) -> ev.DPEvent:
        return self._per_unit(
            me.mozo_event(beta=self.beta, order=self.order, sampling_rate=self.sampling_rate, steps=steps)
        )

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any, rule: Any) -> Generator[int, None, None]:
        step = MozoStep(
            self.backend,
            self._elements,
            records_per_element=self.dataset.records_per_unit,
            n_shots=self.n_shots,
            zero_shot=self._ids(prompt, None),
            one_shot=lambda records: self._ids(prompt, records),
            suffix=self._public_suffix(prompt),
            beta=self.beta,
            order=self.order,
            top_k=self.top_k,
            lambda_max=self.lambda_max,
        )
        generated: list[int] = []
        with closing(step):  # its zero-shot session dropped however the answer ends
            for _ in range(limit):
                forced = self._forced(generated, rule)
                if forced is None:
                    if not self._pay(paid):
                        break
                    token = self._draw(lambda rows: step.release(rows, rng), step.rows(generated, rng), generated, rule)
                else:  # public: no records drawn, no mechanism, no step charged
                    token = forced
                generated.append(token)
                yield token
            else:
                return
        yield from self._after_allowance(prompt, generated, limit, rule)


class ClipBlendDecoder(_DatasetDecoder):
    """Clip-blend online decoding over a fixed private subset; see the module docstring.

    Args:
        dataset: the private records; a subset of expected size ``subset_size`` is drawn once (each record
            with probability s/N, ``rng_subset``; under a unit-level ledger each unit, its prompt showing at most
            ``dataset.records_per_unit`` of its records) and serves every answer.
        backend: as :class:`MozoDecoder`.
        budget: as :class:`MozoDecoder`.
        n_queries: as :class:`MozoDecoder`.
        subset_size: s, the subset's expected size and the fixed divisor of the averaged logits.
        rng_subset: the randomness of the subset's draw.
        max_tokens: as :class:`MozoDecoder`.
        epsilon: this decoder's share (τ is calibrated for the ledger's relation), or give ``temperature``.
        temperature: τ itself (the mechanism's own, accounted as given), instead of ``epsilon``.
        delta: δ of the share (default: the ledger's δ).
        clip: the clipping bound c (the paper: 10).
        population_size: N, the public population size the draw uses: required under an add/remove ledger
            (where |D| is private); under replace-one it defaults to |D|, which the relation keeps fixed. Under a
            unit-level ledger N counts units.
        template: as :class:`MozoDecoder`.
        fixed_latency: as :class:`MozoDecoder` (hides timing).
        choices: as :class:`MozoDecoder`.
        pay_per_token: as :class:`MozoDecoder` (τ is calibrated for the allowance).
        allowance_name: as :class:`MozoDecoder`.
        when_spent: as :class:`MozoDecoder`.
        expected_tokens: as :class:`MozoDecoder`.

    Raises:
        ConfigurationError: a bad argument, a record the tokenizer cannot encode, no ``population_size`` under
            an add/remove ledger, ``subset_size`` above it, or both or neither of ``epsilon`` and ``temperature``.
        CalibrationError: no τ meets ``epsilon``.
    """

    kind = "clip-blend"

    def __init__(
        self,
        dataset: PrivateDataset,
        *,
        backend: NextTokenBackend,
        budget: BudgetManager,
        n_queries: int,
        subset_size: int,
        rng_subset: np.random.Generator,
        max_tokens: int = 32,
        epsilon: float | None = None,
        temperature: float | None = None,
        delta: float | None = None,
        clip: float = 10.0,
        population_size: int | None = None,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
        pay_per_token: bool = False,
        allowance_name: str | None = None,
        when_spent: str = "stop",
        expected_tokens: int | None = None,
    ) -> None:
        per_token = per_token_settings(pay_per_token, allowance_name, when_spent, expected_tokens)
        super().__init__(
            dataset,
            backend=backend,
            budget=budget,
            max_tokens=max_tokens,
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )
        self.neighbouring = budget.neighbouring
        if population_size is None and self.neighbouring == ADD_REMOVE:
            raise ConfigurationError(
                "under an add/remove ledger |D| (per unit: the number of units) is private: declare the public "
                "population_size the subset is drawn from (the paper's relation needs it fixed)"
            )
        self.population_size = (  # replace-one keeps the number of records (per unit: of units) fixed
            len(self._elements) if population_size is None else check.positive_int("population_size", population_size)
        )
        self.n_queries = check.positive_int("n_queries", n_queries)
        self.subset_size = check.positive_int("subset_size", subset_size)
        if self.subset_size > self.population_size:
            raise ConfigurationError(f"subset_size {self.subset_size} exceeds population_size {self.population_size}")
        self.clip = check.positive_finite("clip", clip)
        if not isinstance(rng_subset, np.random.Generator):
            raise ConfigurationTypeError("rng_subset must be a numpy.random.Generator")
        if per_token is not None:
            self.temperature = 1.0 / self._per_token_share(
                per_token,
                epsilon=epsilon,
                delta=delta,
                given=temperature,
                name="temperature",
                token_event=lambda inv_tau: self._per_unit(
                    me.clip_blend_event(
                        clip=self.clip,
                        subset_size=self.subset_size,
                        temperature=1.0 / inv_tau,
                        steps=1,
                        neighbouring=self.neighbouring,
                    )
                ),
                lo=1e-9,
                hi=1e3 * self.subset_size / self.clip,
                find="largest",
            )
        else:
            self.temperature = self._share_noise(
                epsilon,
                delta,
                temperature,
                name="temperature",
                calibrate=lambda eps, dlt, steps: (
                    calibrate_clip_blend_temperature(
                        epsilon=eps,
                        delta=dlt,
                        clip=self.clip,
                        subset_size=self.subset_size,
                        steps=steps,
                        neighbouring=self.neighbouring,
                    ).value
                ),
            )
        warn_if_weak(
            f"clip-blend at temperature {self.temperature:.3g} (clip {self.clip:g})",
            log_odds_shift(self.clip / self.temperature),
            "raise epsilon or subset_size, or lower n_queries or max_tokens",
            read=self.subset_size,
        )
        (members,) = assign_groups(
            len(self._elements),
            population=self.population_size,
            n_groups=1,
            subset_size=self.subset_size,
            rng=rng_subset,
        )
        # one prompt per element of the subset: a record, or a unit's (at most records_per_unit) records
        self._subset = [records_of(self._elements[int(i)], dataset.records_per_unit, rng_subset) for i in members]

    @classmethod
    def with_epsilon(
        cls,
        dataset: PrivateDataset,
        share: BudgetShare,
        *,
        settings: ClipBlendSettings,
        rng_subset: np.random.Generator,
        backend: NextTokenBackend,
        budget: BudgetManager,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
    ) -> ClipBlendDecoder:
        """A decoder whose τ is calibrated so that ``share``'s answers together meet its ε under the ledger's
        relation.

        Args:
            dataset: the private records.
            share: this decoder's share of ``budget``.
            settings: the mechanism's settings (the subset size is required).
            rng_subset: the draw of the fixed subset.
            backend: the language model.
            budget: the shared ledger.
            template: as the constructor.
            fixed_latency: as the constructor.
            choices: as the constructor.

        Returns:
            The decoder.

        Raises:
            ConfigurationTypeError: an argument of the wrong type.
            ConfigurationError: what the constructor refuses (nothing is charged).
        """
        return cls(
            dataset,
            backend=backend,
            budget=budget,
            **_share_keywords(share),
            **_keywords(settings, ClipBlendSettings),
            rng_subset=rng_subset,
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )

    @classmethod
    def with_temperature(
        cls,
        dataset: PrivateDataset,
        temperature: float,
        *,
        n_queries: int,
        max_tokens: int = 32,
        settings: ClipBlendSettings,
        rng_subset: np.random.Generator,
        backend: NextTokenBackend,
        budget: BudgetManager,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
    ) -> ClipBlendDecoder:
        """A decoder at the temperature τ itself (the mechanism's own, accounted as given).

        Args:
            dataset: the private records.
            temperature: τ.
            n_queries: the answers this decoder gives.
            max_tokens: the most tokens of one answer.
            settings: the mechanism's settings (the subset size is required).
            rng_subset: the draw of the fixed subset.
            backend: the language model.
            budget: the shared ledger.
            template: as the constructor.
            fixed_latency: as the constructor.
            choices: as the constructor.

        Returns:
            The decoder.

        Raises:
            ConfigurationTypeError: an argument of the wrong type.
            ConfigurationError: what the constructor refuses (nothing is charged).
        """
        return cls(
            dataset,
            backend=backend,
            budget=budget,
            n_queries=n_queries,
            max_tokens=max_tokens,
            temperature=temperature,
            **_keywords(settings, ClipBlendSettings),
            rng_subset=rng_subset,
            template=template,
            fixed_latency=fixed_latency,
            choices=choices,
        )

    def _steps_event(self, steps: int) -> ev.DPEvent:
        return self._per_unit(
            me.clip_blend_event(
                clip=self.clip,
                subset_size=self.subset_size,
                temperature=self.temperature,
                steps=steps,
                neighbouring=self.neighbouring,
            )
        )

    def _reserve(self, limit: int) -> int:
        return limit - 1  # the prompts stay fixed and grow by the answer: each keeps room for it

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any, rule: Any) -> Generator[int, None, None]:
        room = self._reserve(limit)
        prompts = [self._ids(prompt, None, reserve=room)] + [self._ids(prompt, r, reserve=room) for r in self._subset]
        # the prompts stay fixed: one KV cache each, the records' parts from the backend's prefix cache (they
        # recur in every answer) where it has one
        suffix = self._public_suffix(prompt, reserve=room)
        with start_rows(self.backend, prompts, suffix=suffix, public=1) as session:  # the public prompt apart
            step = ClipBlendStep(session, clip=self.clip, subset_size=self.subset_size, temperature=self.temperature)
            generated: list[int] = []
            for _ in range(limit):
                if self._forced(generated, rule) is None and not self._pay(paid):
                    break
                token = self._draw(lambda rows: step.release(rows, rng), step.rows(generated, rng), generated, rule)
                generated.append(token)
                yield token
            else:
                return
        yield from self._after_allowance(prompt, generated, limit, rule)


def _keywords(config: Any, kind: type) -> dict[str, Any]:
    """A config object's fields as the constructor's keywords (refused unless it is a ``kind``)."""
    if not isinstance(config, kind):
        raise ConfigurationTypeError(f"expected a {kind.__name__}, got {type(config).__name__}")
    return dict(vars(config))  # a frozen dataclass: its fields


def _share_keywords(share: BudgetShare) -> dict[str, Any]:
    return _keywords(share, BudgetShare)


def _greedy(rows: np.ndarray) -> int:
    """The public row's most likely token (what an answer goes on with once its allowance is spent)."""
    return int(np.argmax(rows[0]))


class _TokenMeter:
    """One answer's draws on its decoder's allowance: the first made when the answer is charged, then one before
    each token mechanism; once one is refused the answer pays nothing more (the refusal is public: it depends on
    earlier draws only)."""

    def __init__(self, allowance: TokenAllowance, token_event: ev.DPEvent) -> None:
        self.allowance = allowance
        self.token_event = token_event
        self.first = allowance.draw(token_event)  # AllowanceSpentError: the answer is refused, nothing computed
        self._prepaid = True
        self.paid = 1
        self.refused = False

    def pay(self) -> bool:
        if self._prepaid:
            self._prepaid = False
            return True
        if self.refused:
            return False
        try:
            self.allowance.draw(self.token_event)
        except BudgetExhaustedError as exc:  # the allowance (or the ledger) cannot pay it: public, earlier charges
            self.refused = True
            if not isinstance(exc, AllowanceSpentError):
                logger.warning(LEDGER_REFUSED_DRAW)
            return False
        self.paid += 1
        return True
