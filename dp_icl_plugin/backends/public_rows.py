"""Public rows computed apart from private ones: never in the same backend call, so never in the same forward.

DPS-MOZO's zero-shot row fixes the top-k support and the projection centre of every token; Tang's and
AdaDPSyn's public row fixes the candidate vocabulary; PTA's base prompt and clip-blend's public prompt are
blended into every token. Each analysis treats that row as **public**: it must be the same bits on
neighbouring datasets, or a token can have probability 0 on one and not on the other (an unbounded loss).
Fixed forward shapes (:mod:`~dp_icl_plugin.backends.row_shapes`) keep rows apart only where no layer reads
across rows; quantised layers with per-batch scales, a server batching requests, or a kernel that splits its
reduction by batch size do. So the public rows of a step go to the backend in a call of their own, before
the private rows: on a local backend (:class:`~dp_icl_plugin.backends.hf.HFBackend`, which serialises its
calls), whatever its kernels, a public row's batch-mates are public rows. A server batching requests
continuously may still put a public row beside another answer's or another client's rows: there the public
row is apart from its own step's records only, and isolation rests on the server's batch-invariant kernels
(``VLLM_BATCH_INVARIANT=1``) and ``dp-icl isolation`` against it (``docs/backends.md``).

:func:`public_apart` splits a step's rows into those two calls; :class:`StackedSession` keeps two
incremental sessions (public, private) side by side as one. The number of public rows is the method's
structure (1, or 2 for PTA's base prompt), never read from data. Pure plumbing: no randomness, no privacy
decision; what it costs is measured in ``benchmarks/decoding_floor.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TypeVar

import numpy as np

from dp_icl_plugin.backends.base import IncrementalSession, PublicRowsBackend, appended_ids
from dp_icl_plugin.errors import BackendError, ConfigurationError

__all__ = ["StackedSession", "public_apart", "public_scope", "start_apart"]

Row = TypeVar("Row")


def public_scope(backend: object) -> AbstractContextManager[None]:
    """The backend's ``public_rows()`` scope (calls inside hold public rows only), or a no-op for a backend
    without one.

    Args:
        backend: any backend.
    """
    return backend.public_rows() if isinstance(backend, PublicRowsBackend) else nullcontext()


def _check_public(public: int, n_rows: int) -> int:
    if isinstance(public, bool) or not isinstance(public, int) or not 0 <= public <= n_rows:
        raise ConfigurationError(f"public must be an integer in [0, {n_rows}] (the leading public rows): {public!r}")
    return public


def public_apart(
    backend: object, rows: Sequence[Row], public: int, compute: Callable[[list[Row]], np.ndarray]
) -> np.ndarray:
    """``compute`` on the first ``public`` rows and on the rest in two calls, stacked in the rows' order.

    Args:
        backend: the backend ``compute`` calls; the public call runs in its ``public_rows()`` scope where it
            has one (:class:`PublicRowsBackend`).
        rows: the step's rows, public ones first.
        public: how many leading rows are public (from the method's structure, not from data).
        compute: one backend call: rows -> log-probabilities ``[len(rows), V]``.

    Returns:
        ``[len(rows), V]``, row i from the call that held only rows of its own kind.

    Raises:
        ConfigurationError: ``public`` outside ``[0, len(rows)]``.
        BackendError: a call returned another number of rows than it was given.
    """
    if len(rows) == 0:
        raise ConfigurationError("a step needs at least one row")
    public = _check_public(public, len(rows))
    parts = [list(rows[:public]), list(rows[public:])]
    outputs = []
    scopes: list[AbstractContextManager[None]] = [public_scope(backend), nullcontext()]
    for part, scope in zip(parts, scopes, strict=True):
        if not part:  # e.g. clip-blend's subset drew no record: nothing to compute (the public call still runs)
            continue
        with scope:
            out = np.asarray(compute(part))
        if out.ndim != 2 or out.shape[0] != len(part):
            raise BackendError(f"the backend returned shape {out.shape} for {len(part)} prompts")
        outputs.append(out)
    return outputs[0] if len(outputs) == 1 else np.vstack(outputs)


def start_apart(
    backend: object, rows: Sequence[Row], public: int, start: Callable[[list[Row]], IncrementalSession]
) -> IncrementalSession:
    """An incremental session over ``rows`` whose first ``public`` rows run in a session of their own
    (:class:`StackedSession`, the public one started in ``backend``'s ``public_rows()`` scope where it has
    one); ``start(rows)`` itself when none are public.

    Args:
        backend: the backend ``start`` calls.
        rows: the session's rows, public ones first.
        public: how many leading rows are public.
        start: starts one session over the given rows.

    Raises:
        ConfigurationError: ``public`` outside ``[0, len(rows)]``.
    """
    public = _check_public(public, len(rows))
    if public == 0:
        return start(list(rows))
    with public_scope(backend):
        first = start(list(rows[:public]))
    if public == len(rows):  # no records (clip-blend's subset drew none)
        return first
    try:
        second = start(list(rows[public:]))
    except BaseException:
        first.close()
        raise
    return StackedSession([first, second])


class StackedSession:
    """Incremental sessions side by side as one :class:`~dp_icl_plugin.backends.base.IncrementalSession`: rows in
    the sessions' order, every append given to each session (one token for all, or each session's share of one
    token per row). Each session keeps its own forwards.

    Args:
        sessions: the sessions, in row order.

    Raises:
        ConfigurationError: no sessions.
    """

    def __init__(self, sessions: Sequence[IncrementalSession]) -> None:
        if not sessions:
            raise ConfigurationError("a stacked session needs at least one session")
        self._sessions = list(sessions)
        self._sizes = [s.n_prompts for s in self._sessions]
        self._vocab_size = int(np.asarray(self._sessions[0].logprobs).shape[1])

    @property
    def n_prompts(self) -> int:
        return sum(self._sizes)

    @property
    def lengths(self) -> np.ndarray:
        return np.concatenate([np.asarray(s.lengths) for s in self._sessions])

    @property
    def logprobs(self) -> np.ndarray:
        return np.vstack([np.asarray(s.logprobs) for s in self._sessions])

    def append(self, token_ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """Append one token to every row, each session its share; returns the new log-probabilities.

        Args:
            token_ids: one id for every row, or one id per row.

        Raises:
            ConfigurationError: bad ids.
        """
        ids = appended_ids(token_ids, n_prompts=self.n_prompts, vocab_size=self._vocab_size)
        bounds = np.cumsum([0, *self._sizes])
        return np.vstack(
            [np.asarray(s.append(ids[a:b])) for s, a, b in zip(self._sessions, bounds[:-1], bounds[1:], strict=True)]
        )

    def close(self) -> None:
        """Close every session (each one, whichever raises)."""
        with ExitStack() as stack:  # every session closed, whichever raises
            for s in self._sessions:
                stack.callback(s.close)

    def __enter__(self) -> StackedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
