"""The durable individual Rényi filter: per-unit spend in one SQLite file, in PostgreSQL (shared by hosts) or
in memory, charged atomically.

See :mod:`dp_icl_plugin.accounting.individual_filter` for the privacy argument. A *unit* is whatever the
budget protects: one record, or one person (all records sharing a user id). Units are non-negative
integers chosen by the caller (the private index uses its record or person ids).

Each :meth:`RenyiFilter.charge` is one ``BEGIN IMMEDIATE`` transaction: it reads the units' spend, admits
exactly those that can pay, adds the cost to them and commits; concurrent processes sharing the file are
serialised by SQLite's write lock, so no unit is ever admitted past its budget. The spend is kept as one
float64 row per unit (one column per order), read and written only for the units a release touches. On
PostgreSQL (``path`` a ``postgresql://`` URL) the same transaction locks only the rows of the units it
charges (:mod:`dp_icl_plugin.accounting.stores.filter_postgres`): hosts serialise per unit.

An in-memory filter belongs to the process that made it: after a ``fork()`` (a pre-forking web server,
``multiprocessing``'s ``fork`` start method) every worker would hold its own copy of every unit's spend, so it
refuses use in any other process; a filter cannot be pickled or copied either (a second live filter for the
same units). Several workers share an SQLite file or a PostgreSQL database.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from dp_icl_plugin._storage.postgres_connection import is_postgres_url, mask_dsn
from dp_icl_plugin._storage.sqlite_file import SQLiteFile
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost, admissible
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.accounting.stores.filter_postgres import PostgresFilterStore
from dp_icl_plugin.errors import (
    ConfigurationError,
    FilterMismatchError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
)

__all__ = ["RenyiFilter"]

APPLICATION_ID = 0x44504946  # "DPIF"
SCHEMA_VERSION = 1

SEVERAL_WORKERS_HINT = (
    "for several worker processes keep the index in a directory (SQLite: PrivateIndex(path='index-dir')) or in "
    "PostgreSQL (path='postgresql://...'), whose filter every worker shares"
)


class RenyiFilter:
    """Per-unit RDP spend at fixed orders with a per-unit (ε, δ) budget.

    Args:
        budget: each unit's lifetime budget. May be omitted when opening an existing file.
        path: an SQLite file (created when missing and a budget is given), a ``postgresql://`` URL (the rows
            of this ``owner`` in that database, shared by every host), or ``None`` for memory only.
        owner: an identifier of what the units belong to (e.g. the private index's id); a file made for
            another owner is refused with :class:`FilterMismatchError`.
        busy_timeout: seconds to wait for another process's charge.
    """

    def __init__(
        self,
        budget: IndividualBudget | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        owner: str = "",
        busy_timeout: float = 60.0,
    ) -> None:
        if budget is not None and not isinstance(budget, IndividualBudget):
            raise ConfigurationError("budget must be an IndividualBudget")
        if not isinstance(owner, str):
            raise ConfigurationError("owner must be a string")
        self.owner = owner
        self._retired: str | None = None  # why this (in-memory) object may no longer be used
        self._process = process_mark()  # an in-memory filter is refused in any other process
        self.url: str | None = None  # the database, password masked, for a filter on PostgreSQL
        self._pg: PostgresFilterStore | None = None
        self._file: SQLiteFile | None = None
        if is_postgres_url(path):
            self.path = None
            self.url = mask_dsn(str(path))
            self._pg = PostgresFilterStore(str(path), owner=owner, decode_row=self._row, lock_timeout=busy_timeout)
            self._lock = self._pg.lock
            self.budget = self._pg.open(budget)
            return
        self.path = None if path is None else Path(path)
        if path is not None:
            self._file = SQLiteFile(path, kind="filter", application_id=APPLICATION_ID, busy_timeout=busy_timeout)
        self._lock = threading.RLock() if self._file is None else self._file.lock
        if self.path is None:
            if budget is None:
                raise ConfigurationError("an in-memory filter needs a budget")
            self.budget = budget
            self._memory: dict[int, tuple[np.ndarray, float]] = {}
        else:
            self.budget = self._open(budget)

    def __repr__(self) -> str:
        where = self.url or ("memory" if self.path is None else str(self.path))
        return f"RenyiFilter(epsilon={self.budget.epsilon}, delta={self.budget.delta}, at={where!r})"

    def __reduce__(self):
        raise TypeError(
            "a privacy filter cannot be pickled or copied (a copy would be a second live filter for the "
            "same units); open its file or database again instead"
        )

    # -- charging ---------------------------------------------------------------------------------
    def charge(self, units: np.ndarray, cost: ReleaseCost | list[ReleaseCost]) -> np.ndarray:
        """Admit the units that can pay ``cost`` and charge them, atomically.

        Args:
            units: distinct unit ids, shape (n,).
            cost: one cost for every unit, or one per unit (e.g. a person with several records in the
                release pays for all of them).

        Returns:
            Boolean mask over ``units``: True where the unit was admitted (and charged). Units refused are
            not charged and must not take part in the release.
        """
        ids = self._units(units)
        rdp_cost, delta_cost = self._costs(cost, len(ids))

        def admit(read, write) -> np.ndarray:
            spent, spent_delta = read(ids)
            ok = admissible(self.budget, spent, spent_delta, rdp_cost, delta_cost)
            if ok.any():
                write(ids[ok], (spent + rdp_cost)[ok], (spent_delta + delta_cost)[ok])
            return ok

        if self._pg is not None:
            return self._pg.atomically(len(self.budget.orders), admit)
        with self._transaction() as (read, write):
            return admit(read, write)

    # -- reading ----------------------------------------------------------------------------------
    def spent(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Accumulated RDP (n, n_orders) and approximate δ (n,) of ``units`` (zeros for unseen units)."""
        ids = self._units(units, distinct=False)
        if self._pg is not None:
            return self._pg.atomically(len(self.budget.orders), lambda read, _: read(ids), write=False)
        with self._transaction(write=False) as (read, _):
            return read(ids)

    def all_spent(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(unit ids, RDP spend, approximate δ spend) of every unit charged at least once."""
        if self._pg is not None:
            return self._decode_rows(self._pg.all_rows())
        if self.path is None:
            with self._transaction(write=False):
                ids = np.array(sorted(self._memory), dtype=np.int64)
            spent, spent_delta = self.spent(ids)
            return ids, spent, spent_delta
        with self._lock:
            rows = self._sql("SELECT unit, spent, spent_delta FROM units ORDER BY unit").fetchall()
        return self._decode_rows(rows)

    def epsilon_spent(self, units: np.ndarray) -> np.ndarray:
        """The best (ε, δ) guarantee each unit has lost so far, as ε at the budget's δ (0 when unused)."""
        spent, _ = self.spent(units)
        b = self.budget
        a = np.asarray(b.orders)
        delta_k = b.conversion_delta / len(a)
        eps = spent + np.log1p(-1.0 / a) - (np.log(delta_k) + np.log(a)) / (a - 1)
        return np.where(spent.sum(axis=1) > 0, np.maximum(eps.min(axis=1), 0.0), 0.0)

    def copy_to(self, path: str | os.PathLike[str], *, owner: str) -> RenyiFilter:
        """A new filter file at ``path`` for another ``owner``, starting from this filter's budget and spend.

        Two live filters for one owner would let each unit spend its budget in each (the ledger's cover is
        looked up by owner), so the copy must belong to another owner (which the ledger covers on its own);
        :meth:`move_to` writes an in-memory filter to a file under the same owner.
        """
        if not isinstance(owner, str) or owner == self.owner:
            raise ConfigurationError(
                "a copy of a filter needs another owner: two live filters for one owner would spend every unit's "
                "budget twice (move_to moves an in-memory one)"
            )
        return self._write_copy(path, owner)

    def move_to(
        self,
        path: str | os.PathLike[str],
        *,
        publish: Callable[[], None] | None = None,
        published: Callable[[], bool] | None = None,
    ) -> RenyiFilter:
        """Write this in-memory filter (budget, owner, every unit's spend) to a new file at ``path`` and return
        it; this object then refuses every use, so the units' spend lives in one place only.

        Args:
            path: the new file.
            publish: run once the copy is complete and this object is retired, under the filter's lock (e.g.
                renaming the directory that holds the copy into place).
            published: after ``publish`` raised, whether the copy was published all the same (a rename that
                took effect and still reported an error). Only when it says no (given and False) is this
                object put back in use; otherwise it stays retired (fail closed: never two live filters).
        """
        self._check_usable()
        with self._lock:  # no charge between the copy and the retirement
            self._check_usable()
            if self.path is not None or self._pg is not None:
                raise ConfigurationError(
                    f"this filter already lives in {self.url or self.path}; only an in-memory filter is moved"
                )
            moved = self._write_copy(path, self.owner)
            memory = self._memory
            self._retire(
                f"this in-memory filter was saved to {path}: use the filter there (the index's save() returned it)"
            )
            if publish is not None:
                moved.close()  # complete on disk (its log checkpointed) before it is published
                try:
                    publish()
                except BaseException:
                    if published is not None and not published():
                        self._retired, self._memory = None, memory  # nothing was published: still the only one
                    raise
        return moved

    def _write_copy(self, path: str | os.PathLike[str], owner: str) -> RenyiFilter:
        if Path(path).exists():
            raise ConfigurationError(f"{path} exists; a copy is written to a new filter file")
        units, spent, spent_delta = self.all_spent()
        copy = RenyiFilter(self.budget, path=path, owner=owner)
        with copy._transaction() as (_, write):
            if len(units):
                write(units, spent, spent_delta)
        return copy

    def _retire(self, why: str) -> None:
        with self._lock:
            self._retired = why
            if self.path is None and self._pg is None:
                self._memory = {}

    def _check_usable(self) -> None:
        """Refuse an in-memory filter in another process than its maker's (call before taking ``self._lock``: a
        lock another thread held at ``fork()`` stays held in the child) or once it was moved (call again under
        the lock)."""
        if self._file is None and self._pg is None and self._process != process_mark():
            raise ConfigurationError(
                f"this in-memory privacy filter was made in process {self._process[0]} and cannot be used in "
                f"another ({os.getpid()}): after a fork every worker would hold its own copy of every unit's spend "
                f"and let each record spend its budget once per worker; {SEVERAL_WORKERS_HINT}"
            )
        if self._retired is not None:
            raise ConfigurationError(self._retired)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._pg is not None:
            self._pg.close()

    # -- internals --------------------------------------------------------------------------------
    def _units(self, units: np.ndarray, *, distinct: bool = True) -> np.ndarray:
        ids = np.asarray(units)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ConfigurationError("units must be a 1-d array of integer ids")
        ids = ids.astype(np.int64)
        if ids.size and ids.min() < 0:
            raise ConfigurationError("unit ids must be non-negative")
        if distinct and np.unique(ids).size != ids.size:
            raise ConfigurationError("unit ids in one charge must be distinct")
        return ids

    def _costs(self, cost: ReleaseCost | list[ReleaseCost], n: int) -> tuple[np.ndarray, np.ndarray]:
        m = len(self.budget.orders)
        costs = [cost] * n if isinstance(cost, ReleaseCost) else list(cost)
        if len(costs) != n or not all(isinstance(c, ReleaseCost) for c in costs):
            raise ConfigurationError("cost must be one ReleaseCost or one per unit")
        if any(np.shape(c.rdp) != (m,) for c in costs):
            raise ConfigurationError(f"each cost must be an RDP curve at the filter's {m} orders")
        rdp_cost = np.array([c.rdp for c in costs], dtype=float).reshape(n, m)
        if np.isnan(rdp_cost).any() or (rdp_cost < 0).any():
            raise ConfigurationError("RDP costs must be non-negative numbers")
        return rdp_cost, np.array([c.delta for c in costs], dtype=float)

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[tuple]:
        if self._file is None:
            self._check_usable()
            with self._lock:
                self._check_usable()
                yield self._memory_read, self._memory_write
            return
        with self._file.transaction(write=write):
            yield self._sql_read, self._sql_write

    def _memory_read(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = len(self.budget.orders)
        spent = np.zeros((len(ids), m))
        spent_delta = np.zeros(len(ids))
        for i, unit in enumerate(ids.tolist()):
            row = self._memory.get(unit)
            if row is not None:
                spent[i], spent_delta[i] = row
        return spent, spent_delta

    def _memory_write(self, ids: np.ndarray, spent: np.ndarray, spent_delta: np.ndarray) -> None:
        for unit, row, d in zip(ids.tolist(), spent, spent_delta.tolist(), strict=True):
            self._memory[unit] = (row.copy(), d)

    _CHUNK = 900  # stays under SQLite's limit on bound parameters

    def _sql_read(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = len(self.budget.orders)
        spent = np.zeros((len(ids), m))
        spent_delta = np.zeros(len(ids))
        found: dict[int, tuple[np.ndarray, float]] = {}
        distinct = np.unique(ids)
        for start in range(0, len(distinct), self._CHUNK):
            chunk = distinct[start : start + self._CHUNK].tolist()
            marks = ",".join("?" * len(chunk))
            rows = self._sql(f"SELECT unit, spent, spent_delta FROM units WHERE unit IN ({marks})", chunk).fetchall()
            found.update({unit: (self._row(blob), d) for unit, blob, d in rows})
        for i, unit in enumerate(ids.tolist()):
            if unit in found:
                spent[i], spent_delta[i] = found[unit]
        return spent, spent_delta

    def _sql_write(self, ids: np.ndarray, spent: np.ndarray, spent_delta: np.ndarray) -> None:
        rows = [
            (unit, row.astype("<f8").tobytes(), d)
            for unit, row, d in zip(ids.tolist(), spent, spent_delta.tolist(), strict=True)
        ]
        assert self._file is not None
        try:
            self._file.connection().executemany(
                "INSERT INTO units (unit, spent, spent_delta) VALUES (?, ?, ?) "
                "ON CONFLICT(unit) DO UPDATE SET spent = excluded.spent, spent_delta = excluded.spent_delta",
                rows,
            )
        except sqlite3.Error as exc:
            raise self._file.fail(exc) from None

    def _row(self, blob: bytes) -> np.ndarray:
        row = np.frombuffer(blob, dtype="<f8")
        if row.shape != (len(self.budget.orders),) or not np.isfinite(row).all() or (row < 0).any():
            raise LedgerCorruptError(f"filter {self.url or self.path} holds a damaged spend row")
        return row

    def _decode_rows(self, rows: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = len(self.budget.orders)
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        spent = np.array([self._row(r[1]) for r in rows]).reshape(len(rows), m)
        return ids, spent, np.array([r[2] for r in rows], dtype=float)

    # -- the file ---------------------------------------------------------------------------------
    def _sql(self, query: str, params: tuple | list = ()) -> sqlite3.Cursor:
        assert self._file is not None
        try:
            return self._file.connection().execute(query, params)
        except sqlite3.Error as exc:
            raise self._file.fail(exc) from None

    def _open(self, budget: IndividualBudget | None) -> IndividualBudget:
        assert self._file is not None and self.path is not None
        if not (self.path.exists() and self.path.stat().st_size > 0) and budget is None:
            raise LedgerError(f"no filter at {self.path}; create one with a budget first")
        return self._file.open(lambda conn, fresh: self._read_or_create(conn, budget, fresh))

    def _read_or_create(
        self, conn: sqlite3.Connection, budget: IndividualBudget | None, fresh: bool
    ) -> IndividualBudget:
        if fresh:
            if budget is None:
                raise LedgerError(f"no filter at {self.path}; create one with a budget first")
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(
                "CREATE TABLE units (unit INTEGER PRIMARY KEY, spent BLOB NOT NULL, spent_delta REAL NOT NULL)"
            )
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("budget", json.dumps(budget.to_dict())), ("owner", self.owner)],
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return budget
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            raise LedgerFormatError(f"filter {self.path} has a schema this library does not read")
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        try:
            stored = IndividualBudget.from_dict(json.loads(meta["budget"]))
        except (KeyError, ValueError, TypeError):
            raise LedgerCorruptError(f"filter {self.path} has no valid budget record") from None
        if meta.get("owner", "") != self.owner:
            raise FilterMismatchError(f"filter {self.path} belongs to another index; refusing to use it here")
        if budget is not None and budget != stored:
            raise FilterMismatchError(
                f"filter {self.path} was made with epsilon={stored.epsilon}, delta={stored.delta}; "
                f"refusing to use it with epsilon={budget.epsilon}, delta={budget.delta}"
            )
        return stored
