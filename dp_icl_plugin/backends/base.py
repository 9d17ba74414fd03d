"""The narrow interface every DP-ICL method uses to read a language model.

A backend turns prompts into next-token **log-probabilities over the full vocabulary** (rows of an
``(n_prompts, vocab_size)`` float32 array; log-probabilities rather than logits because every method here is
invariant to a per-row shift: clipping subtracts the row maximum, mixing and softmax renormalise). Methods
whose prompts stay fixed while tokens are appended (clip-blend, MOZO's zero-shot prompt) use an
:class:`IncrementalSession`, which keeps each prompt's KV cache so one step costs the same whatever the
prompt length.

A prompt is either text (tokenised with the tokenizer's own special tokens, e.g. a BOS) or a sequence of
token ids (used as is). Backends never log or echo prompt text: it may be private.

What a backend can do beyond :class:`NextTokenBackend` is declared by the capability protocols below, checked
with ``isinstance`` (they are runtime-checkable) and read through :func:`context_limit` and
:func:`returned_top_k`: a bounded context (:class:`BoundedContext`), a public top-k it returns exactly
(:class:`PublicTopK`), public rows sized apart (:class:`PublicRowsBackend`), a prefix KV cache for rows that
share a public suffix or prefix (:class:`SharedSuffixBackend`, :class:`SharedPrefixBackend`) and a Hugging Face
tokenizer (:class:`HFTokenizerBackend`, for grammars). Every capability is a public property of the backend,
never of the data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from numbers import Integral
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

from dp_icl_plugin.errors import BackendError, ConfigurationError

__all__ = [
    "BoundedContext",
    "ChatMessage",
    "HFTokenizerBackend",
    "IncrementalSession",
    "NextTokenBackend",
    "Prompt",
    "PublicRowsBackend",
    "PublicTopK",
    "SharedPrefixBackend",
    "SharedSuffixBackend",
    "appended_ids",
    "check_logprobs",
    "check_top_k",
    "context_limit",
    "prompt_ids",
    "returned_top_k",
]

Prompt: TypeAlias = str | Sequence[int] | np.ndarray
ChatMessage: TypeAlias = Mapping[str, str]


@runtime_checkable
class IncrementalSession(Protocol):
    """A fixed batch of prompts that grows by one token per prompt per step, reusing cached state."""

    @property
    def n_prompts(self) -> int:
        """The number of prompts in the session."""
        ...

    @property
    def lengths(self) -> np.ndarray:
        """Current length of each prompt in tokens."""
        ...

    @property
    def logprobs(self) -> np.ndarray:
        """Next-token log-probabilities after the current content, shape (n_prompts, vocab_size)."""
        ...

    def append(self, token_ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """Append one token to every prompt (a single id for all, or one id per prompt); returns the new
        :attr:`logprobs` (each row as computed, as :meth:`NextTokenBackend.next_token_logprobs` returns it).

        Args:
            token_ids: one id for every prompt, or one id per prompt.

        Returns:
            The new :attr:`logprobs`, shape (n_prompts, vocab_size).
        """
        ...

    def close(self) -> None:
        """Release the cached state (also on ``with`` exit)."""
        ...

    def __enter__(self) -> IncrementalSession: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class NextTokenBackend(Protocol):
    """Batched next-token distributions, tokenisation and chat formatting of one causal language model."""

    @property
    def model_id(self) -> str:
        """A name of the model, for provenance and messages."""
        ...

    @property
    def vocab_size(self) -> int:
        """Width of every log-probability row: the token ids the tokenizer can produce."""
        ...

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token, or None when the tokenizer has none."""
        ...

    @property
    def has_chat_template(self) -> bool:
        """Whether :meth:`apply_chat_template` works."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``: without special tokens (the default; for appending to a prompt), or as a
        prompt is tokenised (``add_special_tokens=True``: e.g. with the BOS a model expects first).

        Args:
            text: the text to tokenise.
            add_special_tokens: add the special tokens a prompt starts with.
        """
        ...

    def decode(self, token_ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``token_ids``.

        Args:
            token_ids: the ids to decode.
        """
        ...

    def apply_chat_template(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat, formatted by the tokenizer's template; ConfigurationError if it has none.

        Args:
            messages: the chat, as ``{"role": ..., "content": ...}`` mappings.
            add_generation_prompt: end with the template's opening of the assistant's turn.

        Raises:
            ConfigurationError: the tokenizer has no chat template.
        """
        ...

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        """Log-probabilities of the next token after each prompt, shape (len(prompts), vocab_size), float32.

        Each row as the model computed it: a row the model got wrong (NaN, +inf, nothing finite, e.g. an fp16
        overflow on one input) is returned, never raised on, since whether a call raised would then depend on
        the prompt, a private record's maybe. Callers judge: a public row with :func:`check_logprobs`, a
        record's row with :func:`~dp_icl_plugin.steps.token_step.public_checked`.

        Args:
            prompts: the prompts, each text or token ids.
        """
        ...

    def start(self, prompts: Sequence[Prompt] | np.ndarray) -> IncrementalSession:
        """Encode ``prompts`` once and return a session that appends tokens with cached state.

        Args:
            prompts: the prompts, each text or token ids.
        """
        ...


# -- capabilities ---------------------------------------------------------------------------------------------


@runtime_checkable
class BoundedContext(Protocol):
    """A backend whose model reads at most :attr:`max_length` positions (None: no limit it knows of)."""

    @property
    def max_length(self) -> int | None:
        """The most positions the model reads, or None."""
        ...


@runtime_checkable
class PublicTopK(Protocol):
    """A backend that returns only the :attr:`top_k` likeliest tokens of a row exactly (the rest filled, as a
    server's top-k log-probabilities are); None: every entry exact."""

    @property
    def top_k(self) -> int | None:
        """How many of a row's likeliest tokens are exact, or None: all."""
        ...


@runtime_checkable
class PublicRowsBackend(Protocol):
    """A backend that can size a call's forwards to the call when every row in it is public
    (:meth:`~dp_icl_plugin.backends.hf.HFBackend.public_rows`: a lone public row is one row, not a micro-batch
    of filler rows). Entered only around the public part of a step."""

    def public_rows(self) -> AbstractContextManager[None]:
        """A scope inside which this thread's calls hold public rows only."""
        ...


@runtime_checkable
class SharedSuffixBackend(Protocol):
    """A backend that computes rows ending with a public suffix from cached prefixes."""

    def next_token_logprobs_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        """Log-probabilities of the next token after each row, shape (len(rows), vocab_size).

        The rows that end with ``suffix`` take their part before it from the prefix cache; the others are computed
        whole. Same distributions as ``next_token_logprobs(rows)``.

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        ...

    def start_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> IncrementalSession:
        """An incremental session over ``rows``, started as :meth:`next_token_logprobs_shared_suffix` computes them.

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        ...


@runtime_checkable
class SharedPrefixBackend(Protocol):
    """A backend that computes rows starting with a public prefix from its cached keys and values."""

    def next_token_logprobs_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Log-probabilities of the next token after each row, shape (len(rows), vocab_size).

        The rows that start with ``prefix`` take its cached keys and values; the others are computed whole. Same
        distributions as ``next_token_logprobs(rows)``.

        Args:
            prefix: public tokens, fixed by the caller, that rows may start with.
            rows: the prompts, as token ids.
        """
        ...

    def start_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> IncrementalSession:
        """An incremental session over ``rows``, started as :meth:`next_token_logprobs_shared_prefix` computes them.

        Args:
            prefix: public tokens, fixed by the caller, that rows may start with.
            rows: the prompts, as token ids.
        """
        ...


@runtime_checkable
class HFTokenizerBackend(Protocol):
    """A backend with a Hugging Face tokenizer (a fast one has ``backend_tokenizer``), for token grammars."""

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer."""
        ...


def context_limit(backend: object) -> int | None:
    """The positions ``backend``'s model reads (:class:`BoundedContext`), or None when it declares no limit.

    Read as an attribute, not with ``isinstance``: from Python 3.12 a runtime-checkable protocol ignores
    ``__getattr__``, so a wrapper that forwards to a backend would lose its limit (and a private prompt would go
    uncut).

    Args:
        backend: any backend, or a wrapper forwarding to one.
    """
    value = getattr(backend, "max_length", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def returned_top_k(backend: object) -> int | None:
    """How many of a row's likeliest tokens ``backend`` returns exactly (:class:`PublicTopK`), or None: all (read
    as an attribute, as :func:`context_limit`).

    Args:
        backend: any backend, or a wrapper forwarding to one.
    """
    value = getattr(backend, "top_k", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_top_k(top_k: int | None, backend: NextTokenBackend) -> None:
    """A public top-k support cannot be wider than the vocabulary, nor than the top-k a backend returns exactly
    (:class:`~dp_icl_plugin.backends.server.ServerBackend` with ``top_k``: its other entries are filled).

    Args:
        top_k: the top-k the method reads (None: no top-k; nothing to check).
        backend: the backend the method reads.

    Raises:
        ConfigurationError: ``top_k`` exceeds the vocabulary or the top-k the backend returns exactly.
    """
    if top_k is None:
        return
    if top_k > backend.vocab_size:
        raise ConfigurationError(f"top_k = {top_k} exceeds the vocabulary ({backend.vocab_size})")
    returned = returned_top_k(backend)
    if returned is not None and returned < top_k:
        raise ConfigurationError(
            f"the method reads the top {top_k} tokens of every row, but the backend returns "
            f"only its top {returned}: build it with top_k >= {top_k} or None"
        )


# -- helpers ------------------------------------------------------------------------------------------------


def prompt_ids(
    prompts: Sequence[Prompt] | np.ndarray,
    *,
    encode_prompt: Callable[[str], list[int]],
    vocab_size: int,
    max_length: int | None,
) -> list[list[int]]:
    """Validate a batch of prompts and return each as a list of token ids.

    Raises ConfigurationError for an empty batch, an empty prompt, an id outside ``[0, vocab_size)`` or a
    prompt longer than ``max_length``; messages give the prompt's position, never its content.

    Args:
        prompts: the batch, each prompt text or token ids.
        encode_prompt: tokenises a text prompt (with the special tokens a prompt starts with).
        vocab_size: the vocabulary's size.
        max_length: the most tokens a prompt may have (None: no limit).

    Raises:
        ConfigurationError: the batch or a prompt is invalid (above).
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise ConfigurationError("prompts must be a sequence of prompts (pass [prompt] for one prompt)")
    if len(prompts) == 0:
        raise ConfigurationError("prompts must not be empty")
    result: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = encode_prompt(prompt)
        elif isinstance(prompt, (Sequence, np.ndarray)) and not isinstance(prompt, bytes):
            ids = list(prompt)  # type: ignore[arg-type]  # str was handled above
            if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in ids):
                raise ConfigurationError(f"prompt {i}: token ids must be integers")
            ids = [int(t) for t in ids]
        else:
            kind = type(prompt).__name__
            raise ConfigurationError(f"prompt {i}: expected text or a sequence of token ids, got {kind}")
        if not ids:
            raise ConfigurationError(f"prompt {i} has no tokens: a next-token distribution needs a context")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ConfigurationError(f"prompt {i}: token ids must lie in [0, {vocab_size})")
        if max_length is not None and len(ids) > max_length:
            raise ConfigurationError(f"prompt {i} has {len(ids)} tokens; the model takes at most {max_length}")
        result.append(ids)
    return result


def check_logprobs(logprobs: np.ndarray) -> np.ndarray:
    """Refuse what no language model should return: NaN, +inf, or a row with no finite entry.

    Args:
        logprobs: log-probability rows.

    Returns:
        ``logprobs`` itself.

    Raises:
        BackendError: an entry is NaN or +inf, or a row has no finite entry.
    """
    if np.isnan(logprobs).any() or np.isposinf(logprobs).any():
        raise BackendError("the model returned NaN or +inf log-probabilities")
    if not np.isfinite(logprobs).any(axis=-1).all():
        raise BackendError("the model returned a next-token distribution with no finite entry")
    return logprobs


def appended_ids(token_ids: int | Sequence[int] | np.ndarray, *, n_prompts: int, vocab_size: int) -> np.ndarray:
    """One token id per prompt, shape (n_prompts,), from a single id or one id per prompt.

    Args:
        token_ids: one id for all prompts, or one per prompt.
        n_prompts: the prompts in the session.
        vocab_size: the vocabulary's size.

    Raises:
        ConfigurationError: wrong shape, non-integer ids, or an id outside ``[0, vocab_size)``.
    """
    if isinstance(token_ids, Integral) and not isinstance(token_ids, bool):
        ids = np.full(n_prompts, int(token_ids), dtype=np.int64)
    else:
        arr = np.asarray(token_ids)
        if arr.shape != (n_prompts,) or not np.issubdtype(arr.dtype, np.integer):
            raise ConfigurationError(f"append takes one integer token id, or one per prompt (shape ({n_prompts},))")
        ids = arr.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ConfigurationError(f"token ids must lie in [0, {vocab_size})")
    return ids
