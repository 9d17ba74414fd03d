"""An incremental session for backends that keep no state between calls: every step sends the prompts whole."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend, Prompt, appended_ids
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["RecomputingSession"]


class RecomputingSession:
    """An :class:`~dp_icl_plugin.backends.base.IncrementalSession` that sends every prompt whole at every step.

    What a backend without a KV cache of its own does (:class:`~dp_icl_plugin.backends.server.ServerBackend`:
    the server's prefix caching makes the repeated part cheap), and a measure of what an in-process KV cache
    saves (quadratic in T instead of linear). Returns what ``backend.start`` returns, up to float rounding.

    Args:
        backend: the backend every step's prompts are sent to.
        prompts: the prompts, each text or token ids.
    """

    def __init__(self, backend: NextTokenBackend, prompts: Sequence[Prompt]) -> None:
        self._backend = backend
        self._ids = [list(x) if not isinstance(x, str) else backend.encode(x, add_special_tokens=True) for x in prompts]
        self._logprobs = np.asarray(backend.next_token_logprobs(self._ids))
        self._open = True

    @property
    def n_prompts(self) -> int:
        return len(self._ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self._ids], dtype=np.int64)

    @property
    def logprobs(self) -> np.ndarray:
        return self._logprobs.copy()

    def append(self, token_ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """Append one token to every prompt and send them all again; returns the new log-probabilities.

        Args:
            token_ids: one id for every prompt, or one id per prompt.

        Raises:
            ConfigurationError: the session is closed, or bad ids.
        """
        if not self._open:
            raise ConfigurationError("this session is closed")
        new = appended_ids(token_ids, n_prompts=self.n_prompts, vocab_size=self._backend.vocab_size)
        for ids, token in zip(self._ids, new, strict=True):
            ids.append(int(token))
        self._logprobs = np.asarray(self._backend.next_token_logprobs(self._ids))
        return self._logprobs.copy()

    def close(self) -> None:
        """End the session; it takes no more tokens."""
        self._open = False

    def __enter__(self) -> RecomputingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
