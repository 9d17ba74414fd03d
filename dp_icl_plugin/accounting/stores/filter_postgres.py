"""The individual Rényi filter's per-unit spend in PostgreSQL, shared by every host that serves one index.

A charge is one READ COMMITTED transaction: it makes sure every unit it touches has a row (inserted at zero
spend, ``ON CONFLICT DO NOTHING``), locks those rows (``SELECT ... FOR UPDATE``, in unit order so that two
hosts charging overlapping units never deadlock), reads their spend, and writes the admitted units' new
spend before it commits. Hosts therefore serialise per unit while they read and decide: no unit is ever
admitted past its budget, and charges of disjoint units do that part in parallel (they then queue briefly on the
release count, the transaction's last statement, below). The spend rows are keyed by the filter's owner (the
private index's id); the budget is stored once per owner and checked on every open.

A filter made from another's spend (a copy) is created exclusively: its owner row and every spend row are inserted
in one transaction that fails, leaving nothing, when the owner exists; a charge only ever writes the rows it locked,
each its own spend plus the release's cost, so no stored spend is ever lowered. The releases charged are
counted per release tag (``dp_icl_filter_releases``: one row per owner and tag, raised as the last statement of
each charge's transaction): charges of one index under one cover therefore queue on that row from the count to the
commit. The owner row's ``counting`` says the owner has counted since it was made (false for an owner written
before releases were counted). The column is added to an older table when missing (``ALTER TABLE``, which waits
for the charges in flight): upgrade every host together.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from dp_icl_plugin._storage.postgres_connection import PostgresConnection, mask_dsn
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.accounting.stores.filter_base import Read, Write, encode_spend
from dp_icl_plugin.errors import ConfigurationError, FilterMismatchError, LedgerCorruptError, LedgerError

__all__ = ["FILTER_SCHEMA", "PostgresFilterStore"]

FILTER_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS dp_icl_filters (owner text PRIMARY KEY, budget text NOT NULL,"
    " counting boolean NOT NULL DEFAULT false)",
    "CREATE TABLE IF NOT EXISTS dp_icl_filter_releases (owner text NOT NULL REFERENCES dp_icl_filters(owner),"
    " tag text NOT NULL, releases bigint NOT NULL CHECK (releases >= 0), PRIMARY KEY (owner, tag))",
    "CREATE TABLE IF NOT EXISTS dp_icl_filter_units (owner text NOT NULL REFERENCES dp_icl_filters(owner),"
    " unit bigint NOT NULL CHECK (unit >= 0), spent bytea NOT NULL, spent_delta double precision NOT NULL"
    " CHECK (spent_delta >= 0), PRIMARY KEY (owner, unit))",
)
T = TypeVar("T")
_CREATE_LOCK = 0x44504946  # pg_advisory_xact_lock key ("DPIF"): one creator of the tables at a time
_RETRIES = 5  # a deadlock or serialisation failure (rolled back by the server) is retried this many times
_COUNTING_COLUMN = "ALTER TABLE dp_icl_filters ADD COLUMN counting boolean NOT NULL DEFAULT false"
"""Added to a table made before releases were counted (only when missing: ALTER takes an exclusive lock)."""


class PostgresFilterStore:
    """Per-unit spend rows of one filter (``owner``) in a PostgreSQL database.

    Args:
        dsn: the database (the same one as the index's records and, usually, the ledger).
        owner: the filter's owner (the private index's id).
        decode_row: checks and decodes one stored spend row (the filter's own rule).
        connect_timeout: seconds to wait for the server when connecting.
        lock_timeout: seconds to wait for another host's lock before giving up.
    """

    def __init__(
        self,
        dsn: str,
        *,
        owner: str,
        decode_row: Callable[[bytes], np.ndarray],
        connect_timeout: float = 10.0,
        lock_timeout: float = 60.0,
    ) -> None:
        self.owner = owner
        self._decode = decode_row
        self._db = PostgresConnection(
            dsn,
            what=f"privacy filter of index {owner}",
            kind="dp-icl privacy filter",
            connect_timeout=connect_timeout,
            lock_timeout=lock_timeout,
        )
        self.lock = self._db.lock

    def __repr__(self) -> str:
        return f"PostgresFilterStore({mask_dsn(self._db.dsn)!r}, owner={self.owner!r})"

    def open(self, budget: IndividualBudget | None) -> IndividualBudget:
        """Create the filter with ``budget``, or read the stored one (checked against ``budget`` when given).

        Args:
            budget: the filter's budget, or None to read the stored one.

        Returns:
            The filter's budget.

        Raises:
            LedgerError: no filter and no budget given, or the database cannot be used.
            LedgerCorruptError: the stored budget is invalid.
            FilterMismatchError: the stored budget is not ``budget``.
        """
        with self.lock:
            conn = self._db.get()
            try:
                with conn.transaction():
                    self._create_tables(conn)
                    row = conn.execute("SELECT budget FROM dp_icl_filters WHERE owner = %s", (self.owner,)).fetchone()
                    if row is None:
                        if budget is None:
                            raise LedgerError(f"no {self._db.where()}; create one with a budget first")
                        self._insert_owner(conn, budget)
                        return budget
            except self._db.pg.Error as exc:
                raise self._db.fail(exc) from None
        return self._check_budget(row[0], budget)

    def create(
        self,
        budget: IndividualBudget,
        units: np.ndarray,
        spent: np.ndarray,
        spent_delta: np.ndarray,
        *,
        releases: dict[str, int] | None = None,
    ) -> IndividualBudget:
        """Create the filter with ``budget`` and these units' spend in one transaction, refused when the owner exists.

        Args:
            budget: the filter's budget.
            units: unit ids, shape (n,).
            spent: their RDP spend, shape (n, orders).
            spent_delta: their approximate δ spend, shape (n,).
            releases: the release counts to start from, per tag (a moved filter's; none for a copy).

        Returns:
            The filter's budget.

        Raises:
            ConfigurationError: the owner has a filter in this database already (nothing was written).
            LedgerError: the database failed (nothing was written).
        """
        with self.lock:
            conn = self._db.get()
            try:
                with conn.transaction():
                    self._create_tables(conn)
                    if not self._insert_owner(conn, budget):
                        raise ConfigurationError(
                            f"{self._db.where()} exists; a filter made from another's spend needs an owner with no "
                            "filter yet (it is never merged into a live one)"
                        )
                    if len(units):
                        conn.execute(
                            "INSERT INTO dp_icl_filter_units (owner, unit, spent, spent_delta)"
                            " SELECT %s, v.unit, v.spent, v.spent_delta"
                            " FROM unnest(%s::bigint[], %s::bytea[], %s::float8[]) AS v(unit, spent, spent_delta)",
                            (
                                self.owner,
                                [int(u) for u in units.tolist()],
                                [encode_spend(row) for row in spent],
                                [float(d) for d in spent_delta.tolist()],
                            ),
                        )
                    for tag, count in sorted((releases or {}).items()):
                        conn.execute(
                            "INSERT INTO dp_icl_filter_releases (owner, tag, releases) VALUES (%s, %s, %s)",
                            (self.owner, tag, int(count)),
                        )
            except self._db.pg.Error as exc:
                raise self._db.fail(exc) from None
        return budget

    def release_counts(self) -> tuple[dict[str, int], bool]:
        """The releases charged per release tag, and whether the owner has counted since it was made.

        Raises:
            LedgerError: the database failed, or the owner has no filter.
        """
        with self.lock:
            conn = self._db.get()
            try:
                with conn.transaction():
                    row = conn.execute("SELECT counting FROM dp_icl_filters WHERE owner = %s", (self.owner,)).fetchone()
                    rows = conn.execute(
                        "SELECT tag, releases FROM dp_icl_filter_releases WHERE owner = %s", (self.owner,)
                    ).fetchall()
            except self._db.pg.Error as exc:
                raise self._db.fail(exc) from None
        if row is None:
            raise LedgerCorruptError(f"{self._db.where()} has no owner row")
        return {str(t): int(n) for t, n in rows}, bool(row[0])

    def adopt_releases(self, tag: str, count: int) -> None:
        """Take ``count`` as ``tag``'s count (when larger) and mark the owner as counting.

        Args:
            tag: the release tag.
            count: the releases the ledger recorded under it.

        Raises:
            LedgerError: the database failed.
        """
        with self.lock:
            conn = self._db.get()
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO dp_icl_filter_releases (owner, tag, releases) VALUES (%s, %s, %s)"
                        " ON CONFLICT (owner, tag) DO UPDATE"
                        " SET releases = greatest(dp_icl_filter_releases.releases, excluded.releases)",
                        (self.owner, tag, int(count)),
                    )
                    conn.execute("UPDATE dp_icl_filters SET counting = true WHERE owner = %s", (self.owner,))
            except self._db.pg.Error as exc:
                raise self._db.fail(exc) from None

    def _create_tables(self, conn: Any) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
        for statement in FILTER_SCHEMA:
            conn.execute(statement)
        counted = conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = 'dp_icl_filters' AND column_name = 'counting'"
        ).fetchone()
        if counted is None:
            conn.execute(_COUNTING_COLUMN)

    def _insert_owner(self, conn: Any, budget: IndividualBudget) -> bool:
        """Insert the owner row (counting from now on); False when the owner exists."""
        return (
            conn.execute(
                "INSERT INTO dp_icl_filters (owner, budget, counting) VALUES (%s, %s, true)"
                " ON CONFLICT (owner) DO NOTHING RETURNING owner",
                (self.owner, json.dumps(budget.to_dict())),
            ).fetchone()
            is not None
        )

    def _check_budget(self, stored_text: str, budget: IndividualBudget | None) -> IndividualBudget:
        try:
            stored = IndividualBudget.from_dict(json.loads(stored_text))
        except (KeyError, ValueError, TypeError):
            raise LedgerCorruptError(f"{self._db.where()} has no valid budget record") from None
        if budget is not None and budget != stored:
            raise FilterMismatchError(
                f"{self._db.where()} was made with epsilon={stored.epsilon}, delta={stored.delta}; "
                f"refusing to use it with epsilon={budget.epsilon}, delta={budget.delta}"
            )
        return stored

    def atomically(
        self, orders: int, work: Callable[[Read, Write], T], *, write: bool = True, count_release: str | None = None
    ) -> Any:  # T, or (T, count) with count_release
        """``work(read, write)`` inside one transaction; in a write transaction ``read`` locks the rows it reads
        (creating missing ones at zero), so nothing else changes them before the commit. A deadlock or
        serialisation failure (rolled back whole by the server) is retried.

        Args:
            orders: the number of Rényi orders in a spend row.
            work: the transaction's body, given ``read(ids)`` and ``write(ids, spent, spent_delta)``.
            write: a write transaction (``read`` locks its rows).
            count_release: a release tag: add one to its count, the transaction's last statement, and return
                ``(result, count)``.

        Returns:
            What ``work`` returns.

        Raises:
            LedgerError: the database failed (a deadlock or serialisation failure after the retries included).
        """
        with self.lock:
            conn = self._db.get()
            for attempt in range(_RETRIES):
                try:
                    with conn.transaction():
                        counting = count_release is not None
                        result = work(self._reader(conn, orders, lock=write or counting), self._writer(conn))
                        if not counting:
                            return result
                        (count,) = conn.execute(  # last: the count's row is held only until the commit
                            "INSERT INTO dp_icl_filter_releases (owner, tag, releases) VALUES (%s, %s, 1)"
                            " ON CONFLICT (owner, tag) DO UPDATE"
                            " SET releases = dp_icl_filter_releases.releases + 1 RETURNING releases",
                            (self.owner, count_release),
                        ).fetchone()
                        return result, int(count)
                except (self._db.pg.errors.DeadlockDetected, self._db.pg.errors.SerializationFailure) as exc:
                    if attempt + 1 == _RETRIES:
                        raise self._db.fail(exc) from None
                except self._db.pg.Error as exc:
                    raise self._db.fail(exc) from None
            raise AssertionError("unreachable")

    def all_rows(self) -> list[tuple[int, bytes, float]]:
        """Every unit's stored spend: ``(unit, encoded RDP spend, spent δ)``, by unit.

        Raises:
            LedgerError: the database failed.
        """
        with self.lock:
            try:
                return [
                    (int(u), bytes(b), float(d))
                    for u, b, d in self._db.get()
                    .execute(
                        "SELECT unit, spent, spent_delta FROM dp_icl_filter_units WHERE owner = %s ORDER BY unit",
                        (self.owner,),
                    )
                    .fetchall()
                ]
            except self._db.pg.Error as exc:
                raise self._db.fail(exc) from None

    def close(self) -> None:
        """Close this process's connection."""
        self._db.close()

    def _reader(self, conn: Any, orders: int, *, lock: bool) -> Read:
        def read(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            distinct = sorted({int(u) for u in ids.tolist()})
            if lock and distinct:  # one statement for every unit (rows in unit order)
                zero = np.zeros(orders, dtype="<f8").tobytes()
                conn.execute(
                    "INSERT INTO dp_icl_filter_units (owner, unit, spent, spent_delta)"
                    " SELECT %s, u, %s, 0 FROM unnest(%s::bigint[]) AS u ORDER BY u"
                    " ON CONFLICT (owner, unit) DO NOTHING",
                    (self.owner, zero, distinct),
                )
            rows = conn.execute(
                "SELECT unit, spent, spent_delta FROM dp_icl_filter_units WHERE owner = %s AND unit = ANY(%s)"
                " ORDER BY unit" + (" FOR UPDATE" if lock else ""),
                (self.owner, distinct),
            ).fetchall()
            found = {int(u): (self._decode(bytes(b)), float(d)) for u, b, d in rows}
            spent = np.zeros((len(ids), orders))
            spent_delta = np.zeros(len(ids))
            for i, unit in enumerate(ids.tolist()):
                if unit in found:
                    spent[i], spent_delta[i] = found[unit]
            return spent, spent_delta

        return read

    def _writer(self, conn: Any) -> Write:
        def write(ids: np.ndarray, spent: np.ndarray, spent_delta: np.ndarray) -> None:
            units = [int(u) for u in ids.tolist()]
            rows = [encode_spend(row) for row in spent]
            # one statement for every unit; only rows the transaction's read created and locked (never an upsert,
            # which could overwrite a row another writer holds)
            conn.execute(
                "UPDATE dp_icl_filter_units AS t SET spent = v.spent, spent_delta = v.spent_delta"
                " FROM unnest(%s::bigint[], %s::bytea[], %s::float8[]) AS v(unit, spent, spent_delta)"
                " WHERE t.owner = %s AND t.unit = v.unit",
                (units, rows, [float(d) for d in spent_delta.tolist()], self.owner),
            )

        return write
