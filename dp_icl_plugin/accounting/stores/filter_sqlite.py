"""An individual Rényi filter's spend in an SQLite file (:class:`SQLiteFilterStore`), shared by the processes of
one host: a charge is one ``BEGIN IMMEDIATE`` transaction (:class:`~dp_icl_plugin._storage.sqlite_file.SQLiteFile`),
so two processes never admit a unit past its budget.

A filter made from another's spend (a copy, a move) is written whole under a hidden name beside its path and then
hard-linked to the path, which fails if anything is there: no check-then-act race with another process creating
the same file, and nothing at the path until every row is in it (a leftover journal of an earlier file at that
path is refused: SQLite would replay it over the new one). The release counts are the ``releases`` table (one row
per release tag), raised in the transaction of every charge; ``meta`` says ``counting`` when the file has counted
from its creation (a file written before releases were counted gets the table when opened, without the mark).
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dp_icl_plugin._storage.sqlite_file import SQLiteFile
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.accounting.stores.filter_base import Read, Write, encode_spend
from dp_icl_plugin.errors import (
    ConfigurationError,
    FilterMismatchError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SQLiteFilterStore"]

T = TypeVar("T")
APPLICATION_ID = 0x44504946  # "DPIF"
SCHEMA_VERSION = 1
_CHUNK = 900  # stays under SQLite's limit on bound parameters
_RELEASES_TABLE = "CREATE TABLE releases (tag TEXT PRIMARY KEY, count INTEGER NOT NULL CHECK (count >= 0))"


class SQLiteFilterStore:
    """Spend rows of one filter (``owner``) in an SQLite file; see the module docstring.

    Args:
        path: the file (created when missing and :meth:`open` is given a budget).
        owner: what the units belong to (the private index's id); a file made for another owner is refused.
        decode_row: checks and decodes one stored spend row (the filter's own rule).
        busy_timeout: seconds to wait for another process's charge.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        owner: str,
        decode_row: Callable[[bytes], np.ndarray],
        busy_timeout: float = 60.0,
    ) -> None:
        self.path = Path(path)
        self.owner = owner
        self._decode = decode_row
        self._file = SQLiteFile(path, kind="filter", application_id=APPLICATION_ID, busy_timeout=busy_timeout)

    @property
    def lock(self) -> AbstractContextManager[object]:
        """The file's re-entrant lock, held around every transaction of this process."""
        return self._file.lock

    def open(self, budget: IndividualBudget | None) -> IndividualBudget:
        if not (self.path.exists() and self.path.stat().st_size > 0) and budget is None:
            raise LedgerError(f"no filter at {self.path}; create one with a budget first")
        return self._file.open(lambda conn, fresh: self._read_or_create(conn, budget, fresh))

    def create(
        self,
        budget: IndividualBudget,
        units: np.ndarray,
        spent: np.ndarray,
        spent_delta: np.ndarray,
        *,
        releases: dict[str, int] | None = None,
    ) -> IndividualBudget:
        journals = [self.path.with_name(self.path.name + e) for e in ("-wal", "-shm", "-journal")]
        if any(j.exists() for j in journals):  # SQLite would replay an earlier file's journal over the new one
            raise ConfigurationError(
                f"{self.path} has a leftover journal ({', '.join(j.name for j in journals if j.exists())}) of an "
                "earlier filter: a filter made from another's spend is written to a new path"
            )
        staging = self.path.with_name(f".{self.path.name}.creating-{uuid.uuid4().hex[:12]}")
        leftovers = (staging, *(staging.with_name(staging.name + e) for e in ("-wal", "-shm", "-journal")))
        draft = SQLiteFile(staging, kind="filter", application_id=APPLICATION_ID, busy_timeout=self._file.busy_timeout)
        try:

            def fill(conn: sqlite3.Connection, fresh: bool) -> None:  # one transaction: schema, budget, every row
                self._create_schema(conn, budget, releases=releases or {})
                self._write(units, spent, spent_delta, conn=conn)

            draft.open(fill)
            draft.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
            draft.close()  # everything in the main file, which alone is linked
            made = os.stat(staging)
            try:
                os.link(staging, self.path)  # atomic, and fails if anything is at the path
            except FileExistsError:
                raise ConfigurationError(
                    f"{self.path} exists; a filter made from another's spend is written to a new file"
                ) from None
            except OSError as exc:
                raise LedgerError(f"cannot create filter {self.path}: {exc}") from None
        except sqlite3.Error as exc:
            raise draft.fail(exc) from None
        finally:
            draft.close()
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)
        try:
            return self.open(budget)
        except BaseException:  # nothing left behind: the linked file goes while it is still the one made here
            self._file.close()
            try:
                if os.path.samestat(os.stat(self.path), made):
                    self.path.unlink()
            except OSError:
                pass
            raise

    def atomically(
        self, orders: int, work: Callable[[Read, Write], T], *, write: bool = True, count_release: str | None = None
    ) -> Any:  # T, or (T, count) with count_release
        with self._file.transaction(write=write or count_release is not None):
            result = work(lambda ids: self._read(ids, orders), self._write)
            if count_release is None:
                return result
            (count,) = self._sql(
                "INSERT INTO releases (tag, count) VALUES (?, 1) ON CONFLICT (tag) DO UPDATE SET count = count + 1"
                " RETURNING count",
                (count_release,),
            ).fetchone()
            return result, self._count(count)

    def release_counts(self) -> tuple[dict[str, int], bool]:
        with self._file.transaction(write=False):
            rows = self._sql("SELECT tag, count FROM releases").fetchall()
            counting = self._sql("SELECT value FROM meta WHERE key = 'counting'").fetchone()
        return {str(t): self._count(c) for t, c in rows}, counting is not None

    def adopt_releases(self, tag: str, count: int) -> None:
        with self._file.transaction():
            self._sql(
                "INSERT INTO releases (tag, count) VALUES (?, ?) ON CONFLICT (tag) DO UPDATE SET count = max(count, ?)",
                (tag, int(count), int(count)),
            )
            self._sql("INSERT INTO meta (key, value) VALUES ('counting', '1') ON CONFLICT (key) DO NOTHING")

    def all_rows(self) -> list[tuple[int, bytes, float]]:
        with self._file.lock:
            rows = self._sql("SELECT unit, spent, spent_delta FROM units ORDER BY unit").fetchall()
        return [(int(u), bytes(b), float(d)) for u, b, d in rows]

    def close(self) -> None:
        self._file.close()

    def _read(self, ids: np.ndarray, orders: int) -> tuple[np.ndarray, np.ndarray]:
        spent = np.zeros((len(ids), orders))
        spent_delta = np.zeros(len(ids))
        found: dict[int, tuple[np.ndarray, float]] = {}
        distinct = np.unique(ids)
        for start in range(0, len(distinct), _CHUNK):
            chunk = distinct[start : start + _CHUNK].tolist()
            marks = ",".join("?" * len(chunk))
            rows = self._sql(f"SELECT unit, spent, spent_delta FROM units WHERE unit IN ({marks})", chunk).fetchall()
            found.update({unit: (self._decode(blob), d) for unit, blob, d in rows})
        for i, unit in enumerate(ids.tolist()):
            if unit in found:
                spent[i], spent_delta[i] = found[unit]
        return spent, spent_delta

    def _count(self, value: object) -> int:
        try:
            count = int(str(value))
        except ValueError:
            count = -1
        if count < 0:
            raise LedgerCorruptError(f"filter {self.path} holds a damaged release count")
        return count

    def _write(
        self, ids: np.ndarray, spent: np.ndarray, spent_delta: np.ndarray, *, conn: sqlite3.Connection | None = None
    ) -> None:
        rows = [
            (unit, encode_spend(row), d) for unit, row, d in zip(ids.tolist(), spent, spent_delta.tolist(), strict=True)
        ]
        try:
            (conn or self._file.connection()).executemany(
                "INSERT INTO units (unit, spent, spent_delta) VALUES (?, ?, ?) "
                "ON CONFLICT(unit) DO UPDATE SET spent = excluded.spent, spent_delta = excluded.spent_delta",
                rows,
            )
        except sqlite3.Error as exc:
            raise self._file.fail(exc) from None

    def _sql(self, query: str, params: tuple | list = ()) -> sqlite3.Cursor:
        try:
            return self._file.connection().execute(query, params)
        except sqlite3.Error as exc:
            raise self._file.fail(exc) from None

    def _read_or_create(
        self, conn: sqlite3.Connection, budget: IndividualBudget | None, fresh: bool
    ) -> IndividualBudget:
        if fresh:
            if budget is None:
                raise LedgerError(f"no filter at {self.path}; create one with a budget first")
            return self._create_schema(conn, budget)
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            raise LedgerFormatError(f"filter {self.path} has a schema this library does not read")
        conn.execute(_RELEASES_TABLE.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))  # a file made before
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

    def _create_schema(
        self, conn: sqlite3.Connection, budget: IndividualBudget, *, releases: dict[str, int] | None = None
    ) -> IndividualBudget:
        if conn.execute("PRAGMA application_id").fetchone()[0] != 0:
            raise ConfigurationError(f"{self.path} exists; a new filter is written to a new file")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE TABLE units (unit INTEGER PRIMARY KEY, spent BLOB NOT NULL, spent_delta REAL NOT NULL)")
        conn.execute(_RELEASES_TABLE)
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("budget", json.dumps(budget.to_dict())), ("owner", self.owner), ("counting", "1")],
        )
        conn.executemany("INSERT INTO releases (tag, count) VALUES (?, ?)", sorted((releases or {}).items()))
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return budget
