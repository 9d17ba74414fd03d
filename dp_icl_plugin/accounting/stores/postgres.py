"""A ledger on a PostgreSQL server, shared by processes on many hosts (``pip install 'dp-icl-plugin[postgres]'``).

Each check-and-commit is one READ COMMITTED transaction that first takes the ledger's row lock
(``SELECT ... FOR UPDATE``) and only then reads the spend, so every host serialises on that row and none can
overspend; it commits on exit and rolls back on an exception. Several named ledgers may share a database
(tables ``dp_icl_*`` in the connection's ``search_path``): they are created on first use together with a
``dp_icl_meta`` table that names the application and schema version; anything else under those names is
refused rather than treated as an empty budget. The password in a DSN never appears in a ``repr`` or an
error message.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dp_icl_plugin._storage.postgres_connection import PostgresConnection, mask_dsn
from dp_icl_plugin.accounting.privacy import PrivacyBudget
from dp_icl_plugin.accounting.stores.base import (
    OLD_SCHEMA_HINT,
    LedgerRow,
    LedgerStore,
    LedgerTransaction,
    stored_budget,
)
from dp_icl_plugin.errors import (
    ConfigurationError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
)

__all__ = ["PostgresStore", "mask_dsn"]

APPLICATION = "dp-icl-plugin ledger"
SCHEMA_VERSION = 2  # 2: each ledger records its neighbouring relation
_TABLES = ("dp_icl_meta", "dp_icl_ledgers", "dp_icl_events", "dp_icl_entries")
_CREATE_LOCK = 0x44504943  # pg_advisory_xact_lock key ("DPIC"): one creator of the schema at a time
_SCHEMA = (
    "CREATE TABLE dp_icl_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE dp_icl_ledgers (id bigserial PRIMARY KEY, name text NOT NULL UNIQUE,"
    " epsilon double precision NOT NULL, delta double precision NOT NULL, neighbouring text NOT NULL,"
    " created double precision NOT NULL)",
    "CREATE TABLE dp_icl_events (id bigserial PRIMARY KEY, ledger_id bigint NOT NULL REFERENCES dp_icl_ledgers(id),"
    " key text NOT NULL, count bigint NOT NULL CHECK (count >= 0), UNIQUE (ledger_id, key))",
    "CREATE TABLE dp_icl_entries (id bigserial PRIMARY KEY, ledger_id bigint NOT NULL REFERENCES dp_icl_ledgers(id),"
    " ts double precision NOT NULL, label text NOT NULL, event_id bigint NOT NULL REFERENCES dp_icl_events(id),"
    " certified_epsilon double precision NOT NULL)",
    "CREATE INDEX dp_icl_entries_ledger ON dp_icl_entries (ledger_id, id)",
)
# Every column the store reads: a table of the right name with other columns is not ours.
_PROBES = (
    "SELECT id, name, epsilon, delta, neighbouring, created FROM dp_icl_ledgers LIMIT 0",
    "SELECT id, ledger_id, key, count FROM dp_icl_events LIMIT 0",
    "SELECT id, ledger_id, ts, label, event_id, certified_epsilon FROM dp_icl_entries LIMIT 0",
)
_ROW_QUERY = (
    "SELECT e.id, e.ts, e.label, v.key, e.certified_epsilon FROM dp_icl_entries e"
    " JOIN dp_icl_events v ON v.id = e.event_id WHERE e.ledger_id = %s"
)


def _row(row: Any) -> LedgerRow:
    i, ts, label, key, eps = row
    return LedgerRow(int(i), float(ts), label, key, float(eps))


class _PostgresTransaction(LedgerTransaction):
    def __init__(self, conn: Any, ledger_id: int) -> None:
        self._conn = conn
        self._ledger_id = ledger_id

    def event_counts(self) -> Counter[str]:
        rows = self._conn.execute(
            "SELECT key, count FROM dp_icl_events WHERE ledger_id = %s AND count > 0", (self._ledger_id,)
        )
        return Counter({key: int(n) for key, n in rows})

    def entry(self, entry_id: int) -> LedgerRow | None:
        # Entry ids are shared by every ledger in the database: only this ledger's entry counts.
        row = self._conn.execute(_ROW_QUERY + " AND e.id = %s", (self._ledger_id, entry_id)).fetchone()
        return None if row is None else _row(row)

    def append(self, *, timestamp: float, label: str, event_key: str, certified_epsilon: float) -> int:
        (event_id,) = self._conn.execute(
            "INSERT INTO dp_icl_events (ledger_id, key, count) VALUES (%s, %s, 1) ON CONFLICT (ledger_id, key)"
            " DO UPDATE SET count = dp_icl_events.count + 1 RETURNING id",
            (self._ledger_id, event_key),
        ).fetchone()
        (row_id,) = self._conn.execute(
            "INSERT INTO dp_icl_entries (ledger_id, ts, label, event_id, certified_epsilon)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (self._ledger_id, timestamp, label, event_id, certified_epsilon),
        ).fetchone()
        return int(row_id)


class PostgresStore(LedgerStore):
    """One named ledger in a PostgreSQL database, safe to share between threads, processes and hosts.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user:pw@host/db``).
        ledger: the ledger's name; several ledgers may share one database.
        connect_timeout: seconds to wait for the server when connecting.
        lock_timeout: seconds to wait for another host's check-and-commit before giving up.

    Raises:
        ConfigurationError: ``ledger`` is empty, too long or not printable.
    """

    def __init__(
        self, dsn: str, *, ledger: str = "default", connect_timeout: float = 10.0, lock_timeout: float = 60.0
    ) -> None:
        if not isinstance(ledger, str) or not ledger.strip() or len(ledger) > 200 or not ledger.isprintable():
            raise ConfigurationError("ledger must be a non-empty name of at most 200 printable characters")
        self.ledger = ledger
        self._db = PostgresConnection(
            dsn,
            what=f"ledger {ledger!r}",
            kind="dp-icl ledger",
            connect_timeout=connect_timeout,
            lock_timeout=lock_timeout,
        )
        self._pg = self._db.pg
        self._dsn = dsn
        self.connect_timeout = self._db.connect_timeout
        self.lock_timeout = self._db.lock_timeout
        self._lock = self._db.lock
        self._ledger_id: int | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({mask_dsn(self._dsn)!r}, ledger={self.ledger!r})"

    @property
    def name(self) -> str:
        """The ledger's name in the database."""
        return self.ledger

    @property
    def location(self) -> str:
        """The database's ``postgresql://`` URL (as given: it may hold a password; never print it)."""
        return self._dsn

    def _where(self) -> str:
        return self._db.where()

    def _fail(self, exc: Exception) -> LedgerError:
        return self._db.fail(exc)

    def _connection(self) -> Any:
        return self._db.get()

    def close(self) -> None:
        """Close this process's connection (idempotent)."""
        self._db.close()

    # -- set-up -----------------------------------------------------------------------------------
    def initialize(self, budget: PrivacyBudget | None) -> PrivacyBudget:
        """Create the ledger with ``budget`` or open the existing one and check that ``budget`` matches.

        Args:
            budget: the budget, or None to open an existing ledger.

        Returns:
            The ledger's budget.

        Raises:
            BudgetMismatchError: the ledger exists with another budget.
            LedgerError: no ledger of that name and no budget given, or the database cannot be used.
        """
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
                    present = conn.execute(
                        "SELECT " + ", ".join(f"to_regclass('{t}') IS NOT NULL" for t in _TABLES)
                    ).fetchone()
                    if not any(present):
                        if budget is None:
                            raise LedgerError(f"no {self._where()}; create one with a budget first")
                        self._create_schema(conn)
                    else:
                        self._check_schema(conn, present)
                    stored = self._read_or_create(conn, budget)
                    self._check_integrity(conn)
            except self._pg.Error as exc:
                raise self._fail(exc) from None
            return stored

    def _create_schema(self, conn: Any) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO dp_icl_meta (key, value) VALUES ('application', %s), ('schema_version', %s)",
            (APPLICATION, str(SCHEMA_VERSION)),
        )

    def _check_schema(self, conn: Any, present: tuple[bool, ...]) -> None:
        where = mask_dsn(self._dsn)
        if not present[0]:
            raise LedgerFormatError(f"the dp_icl_* tables at {where} are not a dp-icl ledger (no dp_icl_meta)")
        meta = dict(conn.execute("SELECT key, value FROM dp_icl_meta").fetchall())
        if meta.get("application") != APPLICATION:
            raise LedgerFormatError(f"the dp_icl_meta table at {where} belongs to another application")
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise LedgerFormatError(
                f"the ledger tables at {where} have schema version {meta.get('schema_version')}; "
                f"this library reads {SCHEMA_VERSION}" + (OLD_SCHEMA_HINT if meta.get("schema_version") == "1" else "")
            )
        missing = [t for t, ok in zip(_TABLES, present, strict=True) if not ok]
        if missing:
            raise LedgerCorruptError(f"the ledger tables at {where} are incomplete: {', '.join(missing)} missing")
        for probe in _PROBES:
            conn.execute(probe)

    def _read_or_create(self, conn: Any, budget: PrivacyBudget | None) -> PrivacyBudget:
        row = conn.execute(
            "SELECT id, epsilon, delta, neighbouring FROM dp_icl_ledgers WHERE name = %s", (self.ledger,)
        ).fetchone()
        if row is None:
            if budget is None:
                raise LedgerError(f"no {self._where()}; create one with a budget first")
            (self._ledger_id,) = conn.execute(
                "INSERT INTO dp_icl_ledgers (name, epsilon, delta, neighbouring, created)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (self.ledger, budget.epsilon, budget.delta, budget.stored_relation, time.time()),
            ).fetchone()
            return budget
        self._ledger_id = int(row[0])
        return stored_budget(row[1], row[2], row[3], given=budget, where=self._where())

    def _check_integrity(self, conn: Any) -> None:
        n_entries, n_counted = conn.execute(
            "SELECT (SELECT count(*) FROM dp_icl_entries WHERE ledger_id = %(id)s),"
            " (SELECT coalesce(sum(count), 0) FROM dp_icl_events WHERE ledger_id = %(id)s)",
            {"id": self._ledger_id},
        ).fetchone()
        if int(n_entries) != int(n_counted):
            raise LedgerCorruptError(
                f"{self._where()} is inconsistent: {n_entries} entries but {n_counted} counted charges"
            )

    # -- use --------------------------------------------------------------------------------------
    def _opened(self) -> int:
        if self._ledger_id is None:
            raise LedgerError(f"{self._where()} is not open: call initialize() first")
        return self._ledger_id

    @contextmanager
    def transaction(self) -> Iterator[LedgerTransaction]:
        """An exclusive check-and-commit section (commit on exit, roll back on exception)."""
        ledger_id = self._opened()
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    # The row lock serialises check-and-commit across hosts: taken before the spend is read.
                    conn.execute("SELECT id FROM dp_icl_ledgers WHERE id = %s FOR UPDATE", (ledger_id,))
                    yield _PostgresTransaction(conn, ledger_id)
            except self._pg.Error as exc:
                raise self._fail(exc) from None

    def rows(self) -> Iterator[LedgerRow]:
        """All committed charges in commit order."""
        ledger_id = self._opened()
        with self._lock:
            try:
                result = self._connection().execute(_ROW_QUERY + " ORDER BY e.id", (ledger_id,)).fetchall()
            except self._pg.Error as exc:
                raise self._fail(exc) from None
        return iter([_row(r) for r in result])

    def event_counts(self) -> Counter[str]:
        """Committed charges per distinct event key (a consistent snapshot)."""
        ledger_id = self._opened()
        with self._lock:
            try:
                return _PostgresTransaction(self._connection(), ledger_id).event_counts()
            except self._pg.Error as exc:
                raise self._fail(exc) from None
