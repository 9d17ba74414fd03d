"""One release at a time on a private index: its charges in an order that never depends on how fast an answer
computes.

Every charge of an index's filter (:meth:`PrivateIndex.charge_release <dp_icl_plugin.retrieval.index.PrivateIndex.
charge_release>`) takes the index's turn, and an answer of expert decoding paid per token holds it from its first
charge to its last (:class:`~dp_icl_plugin.decoding.knn_experts.KNNExpertDecoder`, ``pay_per_token=True``). Its
charges are rounds of the records' individual filters (Feldman & Zrnic 2021), and the filter's guarantee needs the
order of the rounds fixed by what is public: were another release free to charge between two of the answer's
tokens, which of them reached a shared record's last budget first would depend on how long the answer's tokens
took to compute, which depends on the records. Holding the turn, every other release on the index comes before
the answer or after it, whichever obtains the turn first. A release takes the turn before its search (and before
its ``FixedLatency`` window, so that a window never waits inside for another release and no two holders take the
two in opposite orders); removing records and saving an index take it too.

- Within a process: a re-entrant lock per index (the answer's own charges take it again).
- Across processes on one host: an exclusive ``flock`` on ``release.lock`` in the index's directory, opened and
  taken with the lock, given back and closed with it.
- Across hosts (an index in PostgreSQL): not held here; answers paid per token are refused on such an index
  (:attr:`PrivateIndex.across_hosts <dp_icl_plugin.retrieval.index.PrivateIndex.across_hosts>`).

Pure plumbing: no randomness and no privacy decision; waiting for the turn shows in a release's time like any
lock (``FixedLatency`` hides it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from dp_icl_plugin.errors import LedgerError

__all__ = ["RELEASE_LOCK", "ReleaseTurn", "release_turn"]

RELEASE_LOCK = "release.lock"
"""The file in an index's directory whose ``flock`` is the index's turn across processes."""


class ReleaseTurn:
    """An index's turn (see the module): re-entrant in a thread, exclusive across threads and, with a lock file,
    across processes.

    Args:
        lock_path: the index's ``release.lock``, or None for an index no other process charges (in memory, or
            in PostgreSQL, where hosts are not held).
    """

    def __init__(self, lock_path: Path | None) -> None:
        self.lock_path = lock_path
        self._lock = threading.RLock()
        self._depth = 0
        self._handle: IO[str] | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the turn for the ``with`` body (waiting for it).

        Raises:
            LedgerError: the lock file cannot be created.
        """
        with self._lock:
            if self._depth == 0 and self.lock_path is not None:
                handle = self._open()
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                except BaseException as exc:  # nothing is held: close the file and say why
                    handle.close()
                    if isinstance(exc, OSError):
                        raise LedgerError(f"cannot lock the index's release lock {self.lock_path}: {exc}") from None
                    raise
                self._handle = handle
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._handle is not None:
                    handle, self._handle = self._handle, None
                    with handle:  # closing it gives the lock back
                        fcntl.flock(handle, fcntl.LOCK_UN)

    def _open(self) -> IO[str]:
        assert self.lock_path is not None
        try:
            return self.lock_path.open("a")
        except OSError as exc:
            why = exc.strerror or exc
            raise LedgerError(f"cannot open the index's release lock {self.lock_path}: {why}") from None


_TURNS: dict[tuple[int, str], ReleaseTurn] = {}
_TURNS_LOCK = threading.Lock()


def release_turn(key: str, lock_path: Path | None) -> ReleaseTurn:
    """The turn of the index ``key`` in this process (one per index and process, however many objects open it:
    two ``flock`` handles of one process would exclude each other).

    Args:
        key: what identifies the index (its directory, or its id).
        lock_path: its lock file, or None (see :class:`ReleaseTurn`).
    """
    with _TURNS_LOCK:
        turn = _TURNS.get((os.getpid(), key))
        if turn is None:
            turn = _TURNS[(os.getpid(), key)] = ReleaseTurn(lock_path)
        return turn


def _after_fork_in_child() -> None:
    """A forked child starts with no turn: the parent's handles closed (a child must not keep a lock its parent
    took), the registry and its lock afresh (another thread may have held it at the fork)."""
    global _TURNS_LOCK
    _TURNS_LOCK = threading.Lock()
    for turn in _TURNS.values():
        if turn._handle is not None:
            with contextlib.suppress(OSError):
                turn._handle.close()
            turn._handle = None
    _TURNS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
