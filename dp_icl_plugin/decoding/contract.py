"""The public contract of a DP decoder: what an adapter (a LangChain chat model, a LlamaIndex LLM) needs.

An adapter validates a query before anything is charged (:meth:`Decoder.check`), reports the public prompt's
length (:meth:`Decoder.prompt_tokens`, :attr:`AnswerStream.prompt_tokens`: the query in the template, with a
schema's instruction when there is one, never a private record's length), and streams an
answer that is charged before its first token is computed (:meth:`Decoder.stream`, an :class:`AnswerStream`
that tells, once charged, which ledger entry paid for it). :class:`~dp_icl_plugin.decoding.decoders.MozoDecoder`
and :class:`~dp_icl_plugin.decoding.decoders.ClipBlendDecoder` implement it.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.budget import LedgerEntry
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.errors import ConfigurationError

__all__ = [
    "ROLES",
    "TEMPERATURE_REFUSED",
    "AnswerStream",
    "DecodedAnswer",
    "Decoder",
    "Query",
    "answer_limit",
    "check_call_settings",
    "check_query",
    "released_payload",
    "spend_payload",
]

Query = str | Sequence[Mapping[str, str]]
ROLES = ("system", "user", "assistant")


def check_query(query: object) -> str | tuple[dict[str, str], ...]:
    """A non-empty completion text, or a chat whose last message is the user's (errors never echo text).

    Args:
        query: the query to check.

    Returns:
        The text, or the chat as a tuple of ``{"role", "content"}`` dicts.

    Raises:
        ConfigurationError: an empty text, a malformed message, or a chat not ending with a non-empty user message.
    """
    if isinstance(query, str):
        if not check.has_text(query):
            raise ConfigurationError("the prompt is empty")
        return query
    if not isinstance(query, Sequence) or not query:
        raise ConfigurationError("a query is a non-empty text or a non-empty list of chat messages")
    messages = []
    for i, m in enumerate(query):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ConfigurationError(f"message {i} needs a role in {ROLES} and a string content")
        messages.append({"role": str(m["role"]), "content": str(m["content"])})
    if messages[-1]["role"] != "user":
        raise ConfigurationError("the last message of a chat must be the user's")
    if not check.has_text(messages[-1]["content"]):
        raise ConfigurationError("the last user message is empty")
    return tuple(messages)


@dataclass(frozen=True)
class DecodedAnswer:
    """A DP answer: the text (cut before any stop sequence), its tokens, why it ended, and its charge
    (``ledger_entry`` is the charge's id; ``charge`` the whole committed entry).

    Attributes:
        text: the answer's text.
        token_ids: its tokens.
        finish_reason: ``"stop"`` (EOS or a stop sequence) or ``"length"``.
        ledger_entry: the id of the charge.
        charge: the committed ledger entry.
        released: keyword hints: the words the release published (``()`` when none passed); None otherwise.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length"
    ledger_entry: int
    charge: LedgerEntry | None = field(default=None, compare=False, repr=False)
    released: tuple[str, ...] | None = None


@dataclass
class AnswerState:
    """Bookkeeping of one answer while it is generated."""

    tokens: list[int] = field(default_factory=list)
    emitted: int = 0  # characters of the decoded text already yielded
    finish_reason: str = "length"
    charge: LedgerEntry | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    charged_in: tuple[int, int] | None = None  # the process that charged it (process_mark), once charged
    rule: Any = None  # the public restriction of its tokens (AnswerChoices, a SchemaAnswer), or None
    steps: int | None = None  # the token mechanisms it is charged for (public: its limit, choices or schema)
    released: tuple[str, ...] | None = None  # keyword hints: the words its release published (DP; () for none)

    def charged(self, charge: LedgerEntry) -> None:
        """Record the answer's charge and the process that made it."""
        self.charge, self.charged_in = charge, process_mark()


class AnswerStream(Iterator[str]):
    """The text pieces of one DP answer. The answer is charged on the first ``next`` (before anything is
    computed from private data); afterwards :attr:`charge` is the committed ledger entry. ``close()`` stops
    the generation (refunding nothing). A charged stream continues only in the process that charged it: a
    forked copy (a pre-forking server) would draw the rest of the answer again from the same charge, a second
    release paid once, so it raises ``ConfigurationError`` instead.

    Args:
        pieces: the generator of the answer's text pieces.
        state: the answer's bookkeeping, shared with ``pieces``.
        prompt_tokens: the public prompt's length in tokens.
    """

    def __init__(self, pieces: Generator[str, None, None], state: AnswerState, prompt_tokens: int) -> None:
        self._pieces = pieces
        self._state = state
        self._prompt_tokens = prompt_tokens

    def __iter__(self) -> AnswerStream:
        return self

    def __next__(self) -> str:
        """The next piece of text (charging the answer on the first call).

        Raises:
            ConfigurationError: the answer was charged in another process.
            BudgetExhaustedError: the first call's charge was refused; nothing was computed.
            ReleaseFailedError: the computation failed after the charge.
        """
        if self._state.charged_in is not None and self._state.charged_in != process_mark():
            raise ConfigurationError(
                "this answer was charged in another process: a forked copy cannot continue it (one charge pays "
                "for one release); start a new answer here"
            )
        return next(self._pieces)

    def close(self) -> None:
        """Stop the generation (refunding nothing)."""
        self._pieces.close()

    def cancel(self) -> None:
        """Give up on this answer from any thread: if it has not begun (not charged yet; with a fixed latency,
        still waiting for its turn), it never will, and nothing is charged. An answer under way goes on:
        a charge, once made, is reported by whoever reads the stream."""
        self._state.cancelled.set()

    @property
    def charge(self) -> LedgerEntry | None:
        """The ledger entry that paid for this answer; None until the first ``next``."""
        return self._state.charge

    @property
    def prompt_tokens(self) -> int:
        """Tokens of this answer's public prompt (the query in the template, a schema's instruction included):
        never a private record's length."""
        return self._prompt_tokens

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The tokens generated so far."""
        return tuple(self._state.tokens)

    @property
    def finish_reason(self) -> str:
        """``"stop"`` (EOS or a stop sequence) or ``"length"`` (so far: ``"length"`` until a stop is seen)."""
        return self._state.finish_reason

    @property
    def released(self) -> tuple[str, ...] | None:
        """Keyword hints: the words the answer's release published (DP, public; ``()`` when none passed), once
        released; None for other decoders."""
        return self._state.released


@runtime_checkable
class Decoder(Protocol):
    """What an adapter needs of a DP decoder (implemented by ``MozoDecoder`` and ``ClipBlendDecoder``).

    Attributes:
        max_tokens: the most tokens of one answer this decoder's budget share covers.
        context_window: the model's positions (None when the backend has no limit).
        has_chat_template: whether chats are laid out by the model's chat template.
    """

    max_tokens: int

    @property
    def context_window(self) -> int | None:
        """The model's positions (None when the backend has no limit)."""
        ...

    @property
    def has_chat_template(self) -> bool:
        """Whether chats are laid out by the model's chat template."""
        ...

    def check(
        self,
        query: Query,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> None:
        """Raise ``ConfigurationError`` for a query, limit, stop list or schema the decoder would refuse (no
        charge).

        Args:
            query: the public query (a completion text or a chat).
            max_tokens: the answer's limit (default: the decoder's).
            stop: stop sequences.
            schema: a public JSON schema the answer must follow.
        """
        ...

    def prompt_tokens(self, query: Query, schema: object | None = None) -> int:
        """Tokens of the public prompt (with ``schema``'s instruction when given): never a private record's
        length.

        Args:
            query: the public query (a completion text or a chat).
            schema: a public JSON schema, or None.
        """
        ...

    @property
    def answers_left(self) -> int | None:
        """Answers the decoder's share still covers (None: not counted)."""
        ...

    def check_answers_left(self, answers: int) -> None:
        """Raise ``ShareExhaustedError`` (nothing charged) when a batch asks for more answers than are left.

        Args:
            answers: the answers a batch asks for.
        """
        ...

    def token_ids(self, text: str) -> list[int]:
        """``text`` (public: the caller's) in the model's own tokens, without special tokens.

        Args:
            text: public text.
        """
        ...

    def stream(
        self,
        query: Query,
        *,
        rng: np.random.Generator,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> AnswerStream:
        """The answer piece by piece, charged on the first ``next`` (a JSON document valid under ``schema``
        when one is given: :mod:`~dp_icl_plugin.decoding.structured`).

        Args:
            query: the public query (a completion text or a chat).
            rng: the noise source.
            max_tokens: the answer's limit (default: the decoder's; charged in full, or
                its decisions under choices or a schema).
            stop: stop sequences (post-processing: they refund nothing).
            schema: a public JSON schema the answer must follow.

        Raises:
            ConfigurationError: at once, for what :meth:`check` refuses or a bad rng (nothing charged).
            BudgetExhaustedError: on the first ``next``, before anything is computed from private data.
            ReleaseFailedError: while reading, when the computation failed after the charge.
        """
        ...

    def generate(
        self,
        query: Query,
        *,
        rng: np.random.Generator,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        schema: object | None = None,
    ) -> DecodedAnswer:
        """The whole answer, charged first.

        Args:
            query: the public query (a completion text or a chat).
            rng: the noise source.
            max_tokens: the answer's limit (default: the decoder's; charged in full, or
                its decisions under choices or a schema).
            stop: stop sequences (post-processing: they refund nothing).
            schema: a public JSON schema the answer must follow.

        Raises:
            ConfigurationError: what :meth:`stream` refuses at once (nothing charged).
            BudgetExhaustedError: the charge was refused; nothing was computed.
            ReleaseFailedError: the computation failed after the charge.
        """
        ...


def spend_payload(charge: LedgerEntry) -> dict[str, Any]:
    """What an adapter reports of an answer's charge (LangChain's ``dp_icl_spend`` event and response metadata,
    LlamaIndex's ``DPSpendEvent``): the ledger entry, the release's label and the ledger's certified ε after it;
    no private data. One payload for every adapter.

    Args:
        charge: the committed ledger entry (:attr:`AnswerStream.charge`).
    """
    return {"ledger_entry": charge.id, "release": charge.label, "ledger_epsilon": charge.certified_epsilon}


def released_payload(pieces: AnswerStream) -> dict[str, Any]:
    """What an adapter adds to an answer's metadata beside its spend: keyword hints' released words
    (``released_keywords``, DP and public), or nothing for other decoders.

    Args:
        pieces: the answer's stream, read to its end.
    """
    return {} if pieces.released is None else {"released_keywords": list(pieces.released)}


def answer_limit(decoder: Decoder, requested: object | None) -> int:
    """The token limit of one call: ``requested`` (a positive int), or the decoder's own limit when None
    (frameworks pass ``max_tokens`` per call).

    Args:
        decoder: the decoder that will answer.
        requested: the call's ``max_tokens``, or None.

    Raises:
        ConfigurationError: ``requested`` is not a positive int, or is above what the decoder's share covers (a
            limit silently lowered would cut answers the caller sized; the share is fixed when it is built).
    """
    if requested is None:
        return decoder.max_tokens
    limit = check.positive_int("max_tokens", requested)
    if limit > decoder.max_tokens:
        raise ConfigurationError(
            f"max_tokens = {limit} is above the {decoder.max_tokens} tokens this decoder's budget share covers "
            "per answer: ask for at most that, or build the decoder with a larger max_tokens"
        )
    return limit


TEMPERATURE_REFUSED = (
    "temperature cannot be set on a DP answer: the mechanism decides how each token is drawn (DPS-MOZO samples "
    "the privately mixed distribution, clip-blend samples at the temperature calibrated to its epsilon, expert "
    "decoding samples the noisy vote), and its privacy analysis covers that sampling only (greedy decoding, "
    "temperature 0, is not covered). Leave temperature unset"
)


def check_call_settings(settings: Mapping[str, object], *, honoured: Sequence[str]) -> None:
    """Refuse a generation setting a DP answer cannot honour, before anything is charged.

    Args:
        settings: what the caller passed for one answer (a framework's per-call keywords).
        honoured: the names the adapter honours (e.g. ``max_tokens``, ``stop``, a framework's own switches).

    Raises:
        ConfigurationError: ``temperature`` other than None (see :data:`TEMPERATURE_REFUSED`), or a setting
            not in ``honoured`` (``top_p``, ``seed``, ``n``, ...: silently ignored they would mislead).
    """
    if settings.get("temperature") is not None:
        raise ConfigurationError(TEMPERATURE_REFUSED)
    unknown = sorted(str(k) for k in settings if k not in honoured and k != "temperature")
    if unknown:
        raise ConfigurationError(
            f"{', '.join(unknown)}: not a setting a DP answer honours (the mechanism fixes how tokens are drawn); "
            f"per call: {', '.join(honoured)}"
        )
