"""One process at a time: the lease a process holds on a named allowance while it answers from it.

Answers paid per token must draw on their allowance one at a time (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`):
otherwise where one answer is cut would depend on how fast another computes. Inside a process the answers take
turns; across processes and hosts a lease keeps a second process from drawing at all. It is taken, without
waiting, when the allowance is opened, and held until the process exits (or :meth:`AllowanceLease.release`):

- an SQLite ledger: an exclusive ``flock`` on a file beside the ledger (``<ledger>.allowance-<digest>.lock``);
- a PostgreSQL ledger: a session advisory lock (``pg_try_advisory_lock``) on a connection of its own, so hosts
  exclude each other too (the lock goes with the connection: a process that loses it loses the lease);
- an in-memory ledger: nothing to share (the ledger is this process's own).

A second process is refused with :class:`~dp_icl_plugin.errors.ConfigurationError` before anything is charged.
A forked child does not inherit its parent's lease: it must take its own, which its parent holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from dp_icl_plugin._storage.postgres_connection import is_postgres_url
from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["AllowanceLease", "ledger_identity"]


def ledger_identity(budget: BudgetManager) -> tuple[str, ...]:
    """What identifies ``budget``'s ledger in this process, however its location was spelled: an in-memory
    store's object, an SQLite file's resolved path, a PostgreSQL URL with the ledger's name.

    Args:
        budget: the ledger.
    """
    if budget.in_memory or budget.location is None:
        return ("memory", str(id(budget._store)))
    where = str(budget.location)
    if is_postgres_url(where):
        return ("postgresql", where, str(budget.ledger_name))
    return ("sqlite", str(Path(where).resolve()))


class AllowanceLease:
    """This process's exclusive hold on one allowance of one ledger (see the module docstring).

    Args:
        budget: the ledger.
        label: the allowance's cover label.

    Raises:
        ConfigurationError: another process holds the allowance.
    """

    def __init__(self, budget: BudgetManager, label: str) -> None:
        self.pid = os.getpid()
        self._file: Any = None
        self._conn: Any = None
        identity = ledger_identity(budget)
        digest = hashlib.sha256("\0".join((*identity, label)).encode()).hexdigest()
        if identity[0] == "sqlite":
            self._lock_file(Path(identity[1] + f".allowance-{digest[:16]}.lock"), label)
        elif identity[0] == "postgresql":
            self._advisory_lock(str(budget.location), int(digest[:15], 16), label)

    def _lock_file(self, path: Path, label: str) -> None:
        import fcntl

        handle = open(path, "a+b")  # noqa: SIM115 - held open for the life of the lease
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise _held(label) from None
        self._file = handle

    def _advisory_lock(self, dsn: str, key: int, label: str) -> None:
        import psycopg

        conn = psycopg.connect(dsn, autocommit=True)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if not (row and row[0]):
            conn.close()
            raise _held(label)
        self._conn = conn

    def __del__(self) -> None:  # the last object of the allowance in this process is gone: so is the lease
        self.release()

    def release(self) -> None:
        """Give the lease up (another process may then open the allowance)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()  # closing the file releases its flock
            self._file = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()  # ending the session releases its advisory lock
            self._conn = None


def _held(label: str) -> ConfigurationError:
    return ConfigurationError(
        f"the allowance {label!r} is held by another process: answers paid per token draw on an allowance from one "
        "process at a time (where one answer is cut must not depend on another's speed); give each worker its "
        "own allowance_name, or answer from one worker; nothing was charged"
    )
