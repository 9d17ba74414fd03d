"""One SQLite file owned by one kind of dp-icl object (the ledger, a privacy filter): shared plumbing.

A connection per process (never reused across ``fork()``), WAL journal with ``synchronous=FULL`` (a
committed write survives a crash), ``BEGIN IMMEDIATE`` transactions (SQLite's single write lock serialises
check-and-commit sections across processes), files recognised by ``PRAGMA application_id``, and sqlite3
failures mapped to the package's typed errors.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.errors import LedgerCorruptError, LedgerError, LedgerFormatError

__all__ = ["SQLiteFile"]

_SQLITE_HEADER = b"SQLite format 3\x00"
T = TypeVar("T")


class SQLiteFile:
    """The file behind one store.

    Args:
        path: the file, or None for a database in memory (one connection for its life, this process's only).
        kind: what it holds, for messages ("ledger", "filter").
        application_id: the ``PRAGMA application_id`` that marks files of this kind.
        busy_timeout: seconds to wait for another process's write lock.
        pragmas: statements run on every new connection (per-connection settings such as ``secure_delete``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        kind: str,
        application_id: int,
        busy_timeout: float,
        pragmas: tuple[str, ...] = (),
    ) -> None:
        self.path = None if path is None else Path(path)
        self.kind = kind
        self.application_id = application_id
        self.busy_timeout = float(busy_timeout)
        self.pragmas = pragmas
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._process: tuple[int, int] | None = None  # (pid, forks): the process that opened _conn

    def connection(self) -> sqlite3.Connection:
        if self.path is None and self._conn is not None:  # memory: the database is the connection
            return self._conn
        if self._conn is None or self._process != process_mark():  # never across fork(), even on a reused pid
            try:
                self._conn = sqlite3.connect(
                    ":memory:" if self.path is None else self.path,
                    timeout=self.busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                for pragma in self.pragmas:
                    self._conn.execute(pragma)
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open {self.kind} {self.path}: {exc}") from None
            self._process = process_mark()
        return self._conn

    def close(self) -> None:
        with self.lock:
            if self._conn is not None and (self.path is None or self._process == process_mark()):
                self._conn.close()
            self._conn = None

    def fail(self, exc: sqlite3.Error) -> LedgerError:
        """The typed error for a failed sqlite3 call."""
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return LedgerError(f"{self.kind} {self.path} stayed locked for {self.busy_timeout:g}s: {text}")
        if "not a database" in text:
            return LedgerFormatError(f"{self.path} is not a dp-icl {self.kind} (not an SQLite database)")
        if self.path is not None and ("readonly" in text or "unable to open" in text) and not self._writable():
            return LedgerError(
                f"cannot write {self.kind} {self.path}: the file or its directory is read-only to this process, and "
                "every charge writes it (SQLite's write-ahead log also creates -wal and -shm files beside it); "
                f"give the process write access to {self.path.parent} ({text})"
            )
        return LedgerCorruptError(f"{self.kind} {self.path} is damaged or unreadable: {text}")

    def _writable(self) -> bool:
        """Whether this process may write the file and create files beside it."""
        assert self.path is not None
        parent = self.path.parent
        return os.access(parent, os.W_OK | os.X_OK) and (not self.path.exists() or os.access(self.path, os.W_OK))

    def check_header(self) -> None:
        """Refuse a file that is not SQLite (or a truncated one) before sqlite3 touches it."""
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as fh:
                head = fh.read(len(_SQLITE_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise LedgerError(f"cannot read {self.kind} {self.path}: {exc}") from None
        if head and head != _SQLITE_HEADER:
            if len(head) < len(_SQLITE_HEADER) and _SQLITE_HEADER.startswith(head):
                raise LedgerCorruptError(f"{self.kind} {self.path} is truncated")
            raise LedgerFormatError(f"{self.path} is not a dp-icl {self.kind} (not an SQLite database)")

    def open(self, read_or_create: Callable[[sqlite3.Connection, bool], T]) -> T:
        """Check the file, switch on WAL, and run ``read_or_create(conn, fresh)`` in one write transaction.

        ``fresh`` is True when the file carries no application id yet (the callback creates the schema
        and must set the id); a file of another application, or an SQLite database with tables but no id,
        is refused.
        """
        existed = self.path is not None and self.path.exists() and self.path.stat().st_size > 0
        self.check_header()
        with self.lock:
            conn = self.connection()
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                if existed and app_id not in (0, self.application_id):
                    raise LedgerFormatError(f"{self.path} is an SQLite file of another application")
                if app_id == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise LedgerFormatError(f"{self.path} is an SQLite database but not a dp-icl {self.kind}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    fresh = conn.execute("PRAGMA application_id").fetchone()[0] == 0
                    result = read_or_create(conn, fresh)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self.fail(exc) from None
        return result

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (or a read transaction) … ``COMMIT``; rolled back on any exception."""
        with self.lock:
            conn = self.connection()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise self.fail(exc) from None
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK")
                raise self.fail(exc) from None
