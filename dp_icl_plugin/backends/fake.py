"""A deterministic, dependency-free :class:`NextTokenBackend` for fast tests of methods.

The next-token distribution after a context is taken from ``table`` (the longest key that is a suffix of
the context wins; the empty tuple is a default), or else drawn from a seeded function of the last
``context_window`` tokens: logits ``scale · N(0, 1)`` with the generator seeded by (seed, those tokens).
Either way it is a pure function of the context, so batching and incremental decoding agree exactly.
Words are whitespace-separated entries of ``vocab``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.base import ChatMessage, Prompt, appended_ids, prompt_ids
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["FakeBackend", "FakeIncrementalSession"]


class FakeBackend:
    """A table- or seed-defined language model over a small vocabulary.

    Args:
        vocab: the words; token id = position.
        table: ``{context suffix (token ids): probabilities over vocab}``; zeros are allowed (log 0 = −inf).
        seed: the seed of the function used where no table key matches.
        context_window: how many last tokens that function reads.
        scale: the std of its logits.
        eos_token: a word of ``vocab`` used as EOS (default: none).
        chat_template: whether :meth:`apply_chat_template` works (messages' contents joined by EOS).
        model_id: the name it reports.

    Raises:
        ConfigurationError: a bad vocabulary, table entry, EOS word or setting.

    Attributes:
        forward_tokens: token positions "computed" so far (a prompt costs its length, an appended token 1),
            so tests can check that a method reuses incremental state.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        table: Mapping[tuple[int, ...], Sequence[float] | np.ndarray] | None = None,
        seed: int = 0,
        context_window: int = 2,
        scale: float = 3.0,
        eos_token: str | None = None,
        chat_template: bool = False,
        model_id: str = "fake",
    ) -> None:
        words = list(vocab)
        if not words or not all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in words):
            raise ConfigurationError("vocab must be a non-empty list of non-empty words without whitespace")
        if len(set(words)) != len(words):
            raise ConfigurationError("vocab must not repeat a word")
        self.vocab = words
        self._index = {w: i for i, w in enumerate(words)}
        self.seed = int(seed)
        self.context_window = check.positive_int("context_window", context_window)
        self.scale = check.positive_finite("scale", scale)
        if eos_token is not None and eos_token not in self._index:
            raise ConfigurationError("eos_token must be a word of vocab")
        self._eos = self._index[eos_token] if eos_token is not None else None
        self._chat = bool(chat_template)
        self._model_id = model_id
        self._table = {tuple(int(t) for t in key): self._table_row(key, probs) for key, probs in (table or {}).items()}
        self.forward_tokens = 0

    def _table_row(self, key: tuple[int, ...], probs: Sequence[float] | np.ndarray) -> np.ndarray:
        p = np.asarray(probs, dtype=np.float64)
        if p.shape != (len(self.vocab),) or not np.all(np.isfinite(p)) or p.min() < 0 or p.sum() <= 0:
            raise ConfigurationError(f"table entry {key}: need {len(self.vocab)} non-negative probabilities")
        with np.errstate(divide="ignore"):
            return np.log(p / p.sum()).astype(np.float32)

    # ------------------------------------------------------------------ vocabulary

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def has_chat_template(self) -> bool:
        return self._chat

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Word ids of ``text`` (the fake model has no special tokens to add).

        Args:
            text: whitespace-separated words of the vocabulary.
            add_special_tokens: ignored.

        Raises:
            ConfigurationError: ``text`` is not a string, or holds a word outside the vocabulary.
        """
        if not isinstance(text, str):
            raise ConfigurationError(f"text must be a str, got {type(text).__name__}")
        ids = []
        for position, word in enumerate(text.split()):
            if word not in self._index:
                raise ConfigurationError(f"word {position} of the text is not in the vocabulary")
            ids.append(self._index[word])
        return ids

    def decode(self, token_ids: Sequence[int] | np.ndarray) -> str:
        """The words of ``token_ids``, joined by spaces.

        Args:
            token_ids: token ids.
        """
        return " ".join(self.vocab[int(t)] for t in token_ids)

    def apply_chat_template(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """The messages' contents, each followed by EOS (when there is one).

        Args:
            messages: the chat, ``{"role", "content"}`` mappings.
            add_generation_prompt: ignored.

        Raises:
            ConfigurationError: no chat template, malformed messages, or a word outside the vocabulary.
        """
        if not self._chat:
            raise ConfigurationError(f"{self.model_id} has no chat template")
        if not messages or not all(isinstance(m, Mapping) and "content" in m for m in messages):
            raise ConfigurationError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
        separator = [self._eos] if self._eos is not None else []
        ids: list[int] = []
        for message in messages:
            ids += self.encode(message["content"]) + separator
        return ids

    # ------------------------------------------------------------------ distributions

    def logprobs_after(self, context: Sequence[int]) -> np.ndarray:
        """The (deterministic) next-token log-probabilities after ``context``.

        Args:
            context: token ids.
        """
        ctx = tuple(int(t) for t in context)
        for start in range(len(ctx) + 1):
            row = self._table.get(ctx[start:])
            if row is not None:
                return row
        recent = ctx[-self.context_window :]
        rng = np.random.default_rng([self.seed, len(recent), *recent])
        logits = self.scale * rng.standard_normal(len(self.vocab))
        return (logits - np.logaddexp.reduce(logits)).astype(np.float32)

    def _prompt_ids(self, prompts: Sequence[Prompt] | np.ndarray) -> list[list[int]]:
        return prompt_ids(prompts, encode_prompt=self.encode, vocab_size=self.vocab_size, max_length=None)

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        """Log-probabilities of the next token after each prompt, shape (len(prompts), vocab_size).

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt.
        """
        ids = self._prompt_ids(prompts)
        self.forward_tokens += sum(len(x) for x in ids)
        return np.stack([self.logprobs_after(x) for x in ids])

    def start(self, prompts: Sequence[Prompt] | np.ndarray) -> FakeIncrementalSession:
        """A session over ``prompts``.

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt.
        """
        return FakeIncrementalSession(self, self._prompt_ids(prompts))

    def __repr__(self) -> str:
        return f"FakeBackend(model_id={self.model_id!r}, vocab_size={self.vocab_size})"


class FakeIncrementalSession:
    """Incremental decoding over a :class:`FakeBackend`: appended tokens cost one position each.

    Args:
        backend: the fake model.
        ids: each prompt's token ids (the session extends these lists).
    """

    def __init__(self, backend: FakeBackend, ids: list[list[int]]) -> None:
        self._backend = backend
        self._contexts = ids
        backend.forward_tokens += sum(len(x) for x in ids)
        self._logprobs = np.stack([backend.logprobs_after(x) for x in ids])
        self._open = True

    @property
    def n_prompts(self) -> int:
        return len(self._contexts)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self._contexts], dtype=np.int64)

    @property
    def logprobs(self) -> np.ndarray:
        return self._logprobs.copy()

    def append(self, token_ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """Append one token to every prompt; returns the new log-probabilities.

        Args:
            token_ids: one id for every prompt, or one id per prompt.

        Raises:
            ConfigurationError: the session is closed, or bad ids.
        """
        if not self._open:
            raise ConfigurationError("this incremental session is closed")
        new = appended_ids(token_ids, n_prompts=self.n_prompts, vocab_size=self._backend.vocab_size)
        for context, token in zip(self._contexts, new, strict=True):
            context.append(int(token))
        self._backend.forward_tokens += self.n_prompts
        self._logprobs = np.stack([self._backend.logprobs_after(x) for x in self._contexts])
        return self._logprobs.copy()

    def close(self) -> None:
        """End the session; it takes no more tokens."""
        self._open = False

    def __enter__(self) -> FakeIncrementalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
