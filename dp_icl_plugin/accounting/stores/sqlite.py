"""The embedded default ledger: one SQLite file, WAL mode, one ``BEGIN IMMEDIATE`` per check-and-commit.

``BEGIN IMMEDIATE`` takes SQLite's single write lock before the manager reads the spend, so several
processes sharing the file serialise their check-and-commit sections and can never overspend together;
a crashed process leaves no partial charge (the transaction rolls back). ``synchronous=FULL`` makes a
committed charge survive a crash, so a release that follows the commit is always on record.

The file identifies itself with ``PRAGMA application_id`` and a schema version in ``user_version``;
anything else is refused rather than silently treated as an empty budget. Schema 2 records the ledger's
neighbouring relation; a schema-1 file (from before every event named its relation) is refused with a
:class:`~dp_icl_plugin.errors.LedgerFormatError`: its charges cannot be re-analysed under one relation.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dp_icl_plugin._storage.sqlite_file import SQLiteFile
from dp_icl_plugin.accounting.privacy import PrivacyBudget
from dp_icl_plugin.accounting.stores.base import (
    OLD_SCHEMA_HINT,
    LedgerRow,
    LedgerStore,
    LedgerTransaction,
    stored_budget,
)
from dp_icl_plugin.errors import LedgerCorruptError, LedgerError, LedgerFormatError

__all__ = ["SQLiteStore"]

APPLICATION_ID = 0x44504943  # "DPIC"
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    count INTEGER NOT NULL CHECK (count >= 0)
);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    label TEXT NOT NULL,
    event_id INTEGER NOT NULL REFERENCES events(id),
    certified_epsilon REAL NOT NULL
);
"""

_ROW_QUERY = "SELECT e.id, e.ts, e.label, v.key, e.certified_epsilon FROM entries e JOIN events v ON v.id = e.event_id"


class _SQLiteTransaction(LedgerTransaction):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def event_counts(self) -> Counter[str]:
        return Counter(dict(self._conn.execute("SELECT key, count FROM events WHERE count > 0")))

    def entry(self, entry_id: int) -> LedgerRow | None:
        row = self._conn.execute(_ROW_QUERY + " WHERE e.id = ?", (entry_id,)).fetchone()
        return None if row is None else LedgerRow(*row)

    def append(self, *, timestamp: float, label: str, event_key: str, certified_epsilon: float) -> int:
        self._conn.execute(
            "INSERT INTO events (key, count) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET count = count + 1",
            (event_key,),
        )
        (event_id,) = self._conn.execute("SELECT id FROM events WHERE key = ?", (event_key,)).fetchone()
        cur = self._conn.execute(
            "INSERT INTO entries (ts, label, event_id, certified_epsilon) VALUES (?, ?, ?, ?)",
            (timestamp, label, event_id, certified_epsilon),
        )
        return int(cur.lastrowid or 0)


class SQLiteStore(LedgerStore):
    """A ledger in one SQLite file, safe to share between threads and processes on one host.

    Args:
        path: the ledger file (created by :meth:`initialize` when a budget is given).
        busy_timeout: seconds to wait for another process's check-and-commit before giving up.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 60.0) -> None:
        self._file = SQLiteFile(path, kind="ledger", application_id=APPLICATION_ID, busy_timeout=busy_timeout)
        self.path = Path(path)
        self.busy_timeout = self._file.busy_timeout
        self._lock = self._file.lock

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    @property
    def location(self) -> Path:
        """The ledger file."""
        return self.path

    def _connection(self) -> sqlite3.Connection:
        return self._file.connection()

    def close(self) -> None:
        """Close this process's connection (idempotent)."""
        self._file.close()

    def _fail(self, exc: sqlite3.Error) -> LedgerError:
        return self._file.fail(exc)

    # -- set-up -----------------------------------------------------------------------------------
    def initialize(self, budget: PrivacyBudget | None) -> PrivacyBudget:
        """Create the ledger with ``budget`` or open the existing one and check that ``budget`` matches.

        Args:
            budget: the budget, or None to open an existing ledger.

        Returns:
            The ledger's budget.

        Raises:
            BudgetMismatchError: the ledger exists with another budget.
            LedgerError: no ledger there and no budget given, a missing directory, or a file that cannot be used.
        """
        with self._lock:
            existed = self.path.exists() and self.path.stat().st_size > 0
            if not existed and budget is None:
                raise LedgerError(f"no ledger at {self.path}; create one with a budget first")
            if not self.path.parent.is_dir():
                raise LedgerError(f"directory {self.path.parent} does not exist")
            stored = self._file.open(lambda conn, fresh: self._read_or_create(conn, budget))
            self._check_integrity(self._connection())
            return stored

    def _read_or_create(self, conn: sqlite3.Connection, budget: PrivacyBudget | None) -> PrivacyBudget:
        if conn.execute("PRAGMA application_id").fetchone()[0] == 0:  # still empty: we create it
            if budget is None:
                raise LedgerError(f"no ledger at {self.path}; create one with a budget first")
            # Statement by statement: executescript() would commit the open transaction.
            for statement in _SCHEMA.strip().split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("epsilon", repr(budget.epsilon)),
                    ("delta", repr(budget.delta)),
                    ("neighbouring", budget.stored_relation),
                    ("created", repr(time.time())),
                ],
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return budget
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise LedgerFormatError(
                f"ledger {self.path} has schema version {version}; this library reads {SCHEMA_VERSION}"
                + (OLD_SCHEMA_HINT if version == 1 else "")
            )
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        return stored_budget(
            meta.get("epsilon"), meta.get("delta"), meta.get("neighbouring"), given=budget, where=f"ledger {self.path}"
        )

    def _check_integrity(self, conn: sqlite3.Connection) -> None:
        try:
            status = conn.execute("PRAGMA quick_check").fetchone()[0]
            if status != "ok":
                raise LedgerCorruptError(f"ledger {self.path} failed its integrity check: {status}")
            # One statement, so one snapshot: two would race a concurrent charge between them.
            n_entries, n_counted = conn.execute(
                "SELECT (SELECT count(*) FROM entries), (SELECT coalesce(sum(count), 0) FROM events)"
            ).fetchone()
        except sqlite3.Error as exc:
            raise self._fail(exc) from None
        if n_entries != n_counted:
            raise LedgerCorruptError(
                f"ledger {self.path} is inconsistent: {n_entries} entries but {n_counted} counted charges"
            )

    # -- use --------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[LedgerTransaction]:
        """An exclusive check-and-commit section (commit on exit, roll back on exception)."""
        with self._file.transaction() as conn:
            yield _SQLiteTransaction(conn)

    def rows(self) -> Iterator[LedgerRow]:
        """All committed charges in commit order."""
        with self._lock:
            try:
                result = self._connection().execute(_ROW_QUERY + " ORDER BY e.id").fetchall()
            except sqlite3.Error as exc:
                raise self._fail(exc) from None
        return iter([LedgerRow(*row) for row in result])

    def event_counts(self) -> Counter[str]:
        """Committed charges per distinct event key (a consistent snapshot)."""
        with self._lock:
            try:
                return _SQLiteTransaction(self._connection()).event_counts()
            except sqlite3.Error as exc:
                raise self._fail(exc) from None
