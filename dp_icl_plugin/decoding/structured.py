"""Structured answers: every token restricted to those a public JSON schema allows after the answer so far.

An app that parses the answer (a Pydantic model, a router's fields, a tool's arguments) gives a JSON schema;
the decoder then samples, at every step, among the tokens that keep the answer a prefix of a JSON document
valid under the schema, and the answer ends when the document is complete. The grammar and the token masks
come from `llguidance <https://github.com/guidance-ai/llguidance>`_ (the guidance project's maintained grammar
engine), not from hand-written parsing.

**Privacy.** The schema is public (the caller's, never computed from records), so the set of allowed tokens at
a step is a function of public inputs and of the tokens released before it: restricting every row, public and
private, to it is a public support, like the zero-shot top-k of DPS-MOZO (Flemings et al., eq. 2), clip-blend's
vocabulary and :mod:`~dp_icl_plugin.decoding.choices`; the mechanism's analysis holds over any support fixed
before the step, so no sensitivity changes. A token that alone can follow (a key's name, a brace) is a
function of the public tokens before it: it is emitted without running the mechanism.

**What an answer is charged.** Which tokens will be forced depends on the tokens drawn, but the most token
mechanisms *any* answer of at most ``max_tokens`` tokens can run is a function of the schema, the tokenizer and
the limit alone (:meth:`JSONSchemaAnswers.decisions`: a search over every token path the grammar allows, as
:attr:`~dp_icl_plugin.decoding.choices.AnswerChoices.decisions` is for choices). An answer is charged for that
many token mechanisms, fixed before its charge (e.g. 2 for an object of an enum and a boolean, against 48 for
``max_tokens = 48``), and it cannot run more (:meth:`SchemaAnswer.restrict` refuses a run past it). Where the
search cannot bound it within its budget (a free string, a number, an array: steps where hundreds of tokens
may follow), the bound is ``max_tokens``, every token.

An answer that reaches ``max_tokens`` before the document is complete ends there (``finish_reason``
``"length"``), which is not valid JSON: give a limit that fits the schema, or ``maxLength``/``maxItems`` in it.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.decoding.choices import draw_among
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["InstructedText", "JSONSchemaAnswers", "SchemaAnswer", "json_schema_of", "with_instruction"]

_log = logging.getLogger(__name__)
DECISION_SEARCH_NODES = 5_000
"""The most grammar states :meth:`JSONSchemaAnswers.decisions` visits before it bounds an answer by its limit."""
WIDE_STEP = 256
"""A step where more tokens than this may follow is free text to the search: the bound is then the limit."""
_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_VALUES = ("const", "enum", "default", "examples")
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def json_schema_of(schema: object) -> dict[str, Any]:
    """A JSON schema as a dict, from a dict, its JSON text, or a Pydantic model class, with every object that
    does not say otherwise closed (``additionalProperties: false``): an answer's tokens are few and paid for,
    and keys the schema does not name would only use them up (Pydantic's schemas leave objects open).

    Args:
        schema: a dict, its JSON text, or a Pydantic model class.

    Raises:
        ConfigurationError: anything else, or JSON text that is not an object.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            raise ConfigurationError("a JSON schema given as text must be JSON") from None
    if not isinstance(schema, Mapping):
        raise ConfigurationError("a JSON schema is a dict, its JSON text, or a Pydantic model class")
    return _closed(schema)


def _closed(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` on every object schema that names its properties and says
    nothing of others."""
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _NAMED_SCHEMAS and isinstance(value, Mapping):  # names → schemas (a property may be "properties")
            out[key] = {name: _closed(schema) for name, schema in value.items()}
        elif key in _VALUES:  # JSON values, not schemas
            out[key] = value
        else:
            out[key] = _closed(value)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _grammar_tokenizer(backend: NextTokenBackend) -> Any:
    """llguidance's view of the backend's tokenizer (built once per tokenizer and kept)."""
    try:
        import llguidance.hf
    except ImportError as exc:
        raise ConfigurationError("structured answers need llguidance: pip install 'dp-icl-plugin[structured]'") from exc
    tokenizer = getattr(backend, "tokenizer", None)  # HFTokenizerBackend, wrappers included (see context_limit)
    if tokenizer is None or not hasattr(tokenizer, "backend_tokenizer"):
        raise ConfigurationError(
            "structured answers need a backend with a Hugging Face fast tokenizer (HFBackend, ServerBackend)"
        )
    with _TOKENIZERS_LOCK:
        built = _TOKENIZERS.get(tokenizer)
        if built is None:
            try:
                built = llguidance.hf.from_tokenizer(
                    tokenizer, n_vocab=max(backend.vocab_size, len(tokenizer)), eos_token=backend.eos_token_id
                )
            except ValueError as exc:
                raise ConfigurationError(f"llguidance cannot read this tokenizer: {exc}") from None
            _TOKENIZERS[tokenizer] = built
    return built


class JSONSchemaAnswers:
    """A public JSON schema compiled for one backend's tokenizer; :meth:`start` gives one answer's state.

    Args:
        backend: the model whose tokens the answers are made of.
        schema: a JSON schema (dict or JSON text) or a Pydantic model class (public).

    Raises:
        ConfigurationError: not a schema, one llguidance cannot compile, a backend without a Hugging Face
            fast tokenizer or without an end-of-sequence token, or llguidance not installed.
    """

    def __init__(self, backend: NextTokenBackend, schema: object) -> None:
        try:
            from llguidance import LLMatcher
        except ImportError as exc:
            raise ConfigurationError(
                "structured answers need llguidance: pip install 'dp-icl-plugin[structured]'"
            ) from exc

        self.schema = json_schema_of(schema)
        if backend.eos_token_id is None:
            raise ConfigurationError("structured answers need a model with an end-of-sequence token")
        self._tokenizer = _grammar_tokenizer(backend)
        self.vocab_size = backend.vocab_size
        self.eos_token_id = int(backend.eos_token_id)
        try:
            self._grammar = LLMatcher.grammar_from_json_schema(self.schema, defaults={"whitespace_flexible": False})
        except ValueError as exc:
            raise ConfigurationError(f"not a JSON schema llguidance reads: {exc}") from None
        failed, messages = LLMatcher.validate_grammar_with_warnings(self._grammar, self._tokenizer)
        if failed:
            raise ConfigurationError(f"the JSON schema cannot be compiled: {messages[0]}")
        self._matcher_type = LLMatcher
        self._decisions: dict[int, int] = {}
        self._decisions_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JSONSchemaAnswers({json.dumps(self.schema)[:80]!r})"

    @property
    def instruction(self) -> str:
        """What the prompt tells the model (public): the grammar keeps the answer valid, the instruction tells
        the model what the fields mean."""
        return f"Reply with one JSON object only, following this JSON schema: {json.dumps(self.schema)}"

    def start(self, allowance: int | None = None) -> SchemaAnswer:
        """A fresh answer: nothing generated yet.

        Args:
            allowance: the token mechanisms the answer was charged for (:meth:`decisions`); a run past it is refused.
        """
        return SchemaAnswer(self._matcher(), self.vocab_size, self.eos_token_id, allowance=allowance)

    def _matcher(self) -> Any:
        return self._matcher_type(self._tokenizer, self._grammar, log_level=0)

    def decisions(self, limit: int) -> int:
        """The most token mechanisms an answer of at most ``limit`` tokens can run: over every token path the
        grammar allows (the end-of-sequence token ends a path), the most steps where two or more tokens may
        follow. Public (the schema, the tokenizer and ``limit`` only), so it is what an answer is charged for.
        ``limit`` itself where the search meets a step wider than :data:`WIDE_STEP` tokens or visits more than
        :data:`DECISION_SEARCH_NODES` states. Computed once per limit.

        Args:
            limit: the answer's most tokens.

        Returns:
            A number of token mechanisms in ``[0, limit]``.
        """
        limit = int(limit)
        with self._decisions_lock:
            if limit not in self._decisions:
                found = _most_decisions(self._matcher(), self._tokenizer, self.vocab_size, self.eos_token_id, limit)
                if found == limit:
                    _log.info(
                        "answers under this JSON schema are charged for all %d tokens of their limit (a free string, "
                        "number or array, or more states than the search visits): give such fields an enum or a "
                        "pattern to pay for fewer",
                        limit,
                    )
                self._decisions[limit] = found
            return self._decisions[limit]


class InstructedText(str):
    """A completion text with a public instruction in front; :attr:`query` is the caller's own text (what a
    retriever searches with, not the schema)."""

    query: str


def with_instruction(query: str | tuple[dict[str, str], ...], instruction: str) -> str | tuple[dict[str, str], ...]:
    """``query`` (a completion text or a checked chat) with ``instruction`` added: a chat's system message gets
    it (one is added first where there is none), a completion text begins with it (an :class:`InstructedText`
    that keeps the query). Public text only.

    Args:
        query: a completion text or a checked chat.
        instruction: the public instruction.
    """
    if isinstance(query, str):
        text = InstructedText(f"{instruction}\n\n{query}")
        text.query = getattr(query, "query", query)
        return text
    messages = list(query)
    if messages and messages[0]["role"] == "system":
        messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{instruction}"}
    else:
        messages.insert(0, {"role": "system", "content": instruction})
    return tuple(messages)


class SchemaAnswer:
    """One answer's place in the schema's grammar. Fed the answer's tokens as they are released (``generated``,
    which only grows); every method reads the state after them. Not shared between answers or threads.

    Args:
        matcher: llguidance's matcher for this answer.
        vocab_size: the backend's vocabulary size.
        eos_token_id: the backend's end-of-sequence token.
        allowance: the token mechanisms the answer was charged for (None: not counted).
    """

    def __init__(self, matcher: Any, vocab_size: int, eos_token_id: int, *, allowance: int | None = None) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos = eos_token_id
        self._consumed = 0
        self._allowance = allowance
        self.runs = 0  # token mechanisms run so far

    def _sync(self, generated: Sequence[int]) -> None:
        for token in generated[self._consumed :]:
            if not self._matcher.consume_token(int(token)):
                raise ConfigurationError(f"a token the grammar did not allow was released: {self._matcher.get_error()}")
            self._consumed += 1

    def allowed(self, generated: Sequence[int]) -> np.ndarray:
        """The token ids that keep the answer a prefix of a valid document (the end-of-sequence token where the
        document is complete), ascending.

        Args:
            generated: the answer's tokens so far.

        Raises:
            ConfigurationError: a released token the grammar did not allow, or no token allowed.
        """
        self._sync(generated)
        mask = np.frombuffer(self._matcher.compute_logit_bias(), dtype=np.uint8)[: self._vocab_size]
        allowed = np.flatnonzero(mask).astype(np.int64)
        if allowed.size == 0:
            raise ConfigurationError("the grammar allows no token here")
        return allowed

    def complete(self, generated: Sequence[int]) -> bool:
        """Whether the document is complete and nothing else may follow.

        Args:
            generated: the answer's tokens so far.

        Raises:
            ConfigurationError: a released token the grammar did not allow.
        """
        self._sync(generated)
        return bool(self._matcher.is_stopped())

    def forced(self, generated: Sequence[int]) -> int | None:
        """The one token that can follow (public, free), or None where the mechanism decides.

        Args:
            generated: the answer's tokens so far.

        Raises:
            ConfigurationError: as :meth:`allowed`.
        """
        allowed = self.allowed(generated)
        return int(allowed[0]) if allowed.size == 1 else None

    def restrict(self, draw: Callable[[np.ndarray], int], logprobs: np.ndarray, generated: Sequence[int]) -> int:
        """Run a token mechanism on the allowed columns only (:func:`~dp_icl_plugin.decoding.choices.draw_among`).

        Args:
            draw: the mechanism: rows restricted to the allowed columns → a column.
            logprobs: the step's rows over the vocabulary.
            generated: the answer's tokens so far.

        Returns:
            The token id drawn.

        Raises:
            ConfigurationError: a mechanism run past the answer's allowance (the charge covers no more; the search
                of :meth:`JSONSchemaAnswers.decisions` makes this unreachable).
        """
        allowed = self.allowed(generated)
        if allowed.size > 1:
            if self._allowance is not None and self.runs >= self._allowance:
                raise ConfigurationError("a token mechanism past what the answer was charged for")
            self.runs += 1
        return draw_among(draw, logprobs, allowed)


def _step_mask(matcher: Any, vocab_size: int) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[:vocab_size])


def _most_decisions(matcher: Any, tokenizer: Any, vocab_size: int, eos_token_id: int, limit: int) -> int:
    """Depth-first over every token path of at most ``limit`` tokens from ``matcher``'s state (consumed, then
    rolled back): the most steps on one path where two or more tokens may follow. The grammar reads bytes, so
    paths that spell the same bytes reach the same state: a state is searched once per number of tokens left
    (keyed by its bytes). ``limit`` when a step is wider than :data:`WIDE_STEP`, the search passes
    :data:`DECISION_SEARCH_NODES` states, or the matcher errs or allows a special token (no bound trusted)."""
    visited = 0
    spelled: list[bytes] = []
    known: dict[tuple[bytes, int], int] = {}

    class _Unbounded(Exception):
        pass

    def most(left: int) -> int:
        nonlocal visited
        if matcher.is_error():
            raise _Unbounded
        if left == 0 or matcher.is_stopped():
            return 0
        key = (b"".join(spelled), left)
        if key in known:
            return known[key]
        visited += 1
        allowed = _step_mask(matcher, vocab_size)
        if visited > DECISION_SEARCH_NODES or allowed.size > WIDE_STEP or matcher.is_error():
            raise _Unbounded
        best = 0
        for token in (int(t) for t in allowed):
            if token == eos_token_id:  # the answer ends there
                continue
            if tokenizer.is_special_token(token) or not matcher.consume_token(token):
                raise _Unbounded  # a special token, or one the grammar refused although its own mask allowed it
            spelled.append(tokenizer.decode_bytes([token]))
            best = max(best, most(left - 1))
            spelled.pop()
            if not matcher.rollback(1):
                raise _Unbounded
            if best == left - 1:  # every later step a decision: no path can do more
                break
        known[key] = best + (1 if allowed.size > 1 else 0)
        return known[key]

    try:
        return most(limit)
    except _Unbounded:
        return limit
