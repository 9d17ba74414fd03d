"""Records of a private index in one SQLite file (``records.sqlite`` of the index directory) or in memory.

WAL journal, ``synchronous=FULL``; the file is recognised by ``PRAGMA application_id`` and its schema by
``user_version``. Schema 2 adds the change version (a ``version`` column on records, a ``deletions`` table
and ``meta.version``) so that processes sharing the directory keep their FAISS copies in step; a schema-1
file is upgraded in place on open (its records at version 0).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dp_icl_plugin.errors import LedgerCorruptError, LedgerError, LedgerFormatError
from dp_icl_plugin.methods.knn.stores.base import (
    Changes,
    IndexMeta,
    RecordStore,
    StoredRecord,
    changes_from_rows,
    removal,
)

__all__ = ["SQLiteRecordStore"]

APPLICATION_ID = 0x44504958  # "DPIX"
SCHEMA_VERSION = 2
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE users (unit INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE)",
    "CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, unit INTEGER NOT NULL, text TEXT NOT NULL, "
    "label TEXT, answer TEXT, embedding BLOB NOT NULL, version INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE deletions (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
)
_UPGRADE_FROM_1 = (
    "ALTER TABLE records ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE deletions (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('version', '0')",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_CHUNK = 900  # under SQLite's limit on bound parameters


class SQLiteRecordStore(RecordStore):
    """The records of one index in ``path`` (a new or existing ``records.sqlite``), or in memory (None)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.where = "memory" if path is None else str(path)
        if path is not None and path.exists():
            with open(path, "rb") as fh:
                if fh.read(16) != b"SQLite format 3\x00":
                    raise LedgerFormatError(f"{path} is not a dp-icl private index")
        self._lock = threading.RLock()
        self._pid = 0
        self._memory: sqlite3.Connection | None = None
        if path is None:  # memory: one connection for the store's life
            self._memory = sqlite3.connect(":memory:", check_same_thread=False)

    @property
    def _conn(self) -> sqlite3.Connection:
        """This process's connection (a file's is never reused across ``fork()``)."""
        if self._memory is not None:
            return self._memory
        if self._pid != os.getpid():
            conn = sqlite3.connect(self.path, check_same_thread=False)  # type: ignore[arg-type]
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._file_conn, self._pid = conn, os.getpid()
        return self._file_conn

    # -- creating and opening ----------------------------------------------------------------------
    def create(self, meta: IndexMeta) -> None:
        with self._lock, self._conn:
            for statement in _SCHEMA:
                self._conn.execute(statement)
            values = [("id", meta.id), ("group_by_user", "1" if meta.group_by_user else "0"),
                      ("embedder", meta.embedder), ("dim", ""), ("version", "0")]  # fmt: skip
            if meta.fingerprint is not None:
                values.append(("embedder_fingerprint", meta.fingerprint))
            self._conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", values)
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def check(self) -> None:
        """Refuse a file that is not an index of a schema this library reads; upgrade schema 1 in place."""
        try:
            if self._conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                raise LedgerFormatError("the records file is not a dp-icl private index")
            schema = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if schema == 1:
                with self._lock:
                    self._conn.execute("BEGIN IMMEDIATE")  # one transaction: another opener waits, a crash undoes
                    try:
                        if self._conn.execute("PRAGMA user_version").fetchone()[0] == 1:
                            for statement in _UPGRADE_FROM_1:
                                self._conn.execute(statement)
                        self._conn.execute("COMMIT")
                    except BaseException:
                        self._conn.execute("ROLLBACK")
                        raise
            elif schema != SCHEMA_VERSION:
                raise LedgerFormatError("the private index has a schema this library does not read")
        except sqlite3.Error as exc:
            raise LedgerCorruptError(f"private index is damaged or unreadable: {exc}") from None

    def backup_to(self, path: Path) -> None:
        target = sqlite3.connect(path)
        try:
            with self._lock:
                self._conn.backup(target)
        finally:
            target.close()

    # -- RecordStore ---------------------------------------------------------------------------------
    def meta(self) -> IndexMeta:
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta"))
        except sqlite3.Error as exc:
            raise LedgerCorruptError(f"private index is damaged or unreadable: {exc}") from None
        if not {"id", "group_by_user", "embedder", "dim"} <= meta.keys():
            raise LedgerCorruptError("private index has an incomplete meta table")
        return IndexMeta(meta["id"], meta["group_by_user"] == "1", meta["embedder"],
                         meta.get("embedder_fingerprint"), int(meta["dim"]) if meta["dim"] else None,
                         meta.get("floor"))  # fmt: skip

    def set_dim(self, dim: int) -> None:
        self._write("UPDATE meta SET value = ? WHERE key = 'dim'", (str(dim),))

    def set_floor(self, floor: str) -> None:
        self._write("INSERT OR REPLACE INTO meta (key, value) VALUES ('floor', ?)", (floor,))

    def insert(self, texts, labels, answers, users, vectors) -> Changes:
        try:
            with self._lock, self._conn:
                version = self._next_version()
                units: list[int | None] = [None] * len(texts)
                if any(u is not None for u in users):
                    self._conn.executemany("INSERT OR IGNORE INTO users (name) VALUES (?)", [(u,) for u in set(users)])
                    names = dict(self._conn.execute("SELECT name, unit FROM users"))
                    units = [names[u] for u in users]
                ids, unit_ids = [], []
                for text, label, answer, unit, vec in zip(texts, labels, answers, units, vectors, strict=True):
                    cur = self._conn.execute(
                        "INSERT INTO records (unit, text, label, answer, embedding, version)"
                        " VALUES (-1, ?, ?, ?, ?, ?)",
                        (text, label, answer, vec.tobytes(), version),
                    )
                    rid = int(cur.lastrowid or 0)
                    unit_id = rid if unit is None else unit  # per-record budgets: the unit is the record
                    self._conn.execute("UPDATE records SET unit = ? WHERE id = ?", (unit_id, rid))
                    ids.append(rid)
                    unit_ids.append(unit_id)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot store records: {exc}") from None
        return Changes(version, np.asarray(ids, dtype=np.int64), np.asarray(unit_ids, dtype=np.int64),
                       np.asarray(vectors, dtype=np.float32), np.zeros(0, dtype=np.int64))  # fmt: skip

    def delete(self, ids: np.ndarray) -> Changes:
        id_list = [int(i) for i in ids.tolist()]
        try:
            with self._lock, self._conn:
                version = self._next_version()  # first: the write lock, then what is present under it
                present = sorted(self.fetch_ids(id_list))
                self._conn.executemany("DELETE FROM records WHERE id = ?", [(i,) for i in present])
                self._conn.executemany("INSERT OR REPLACE INTO deletions (id, version) VALUES (?, ?)",
                                       [(i, version) for i in present])  # fmt: skip
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot remove records: {exc}") from None
        return removal(version, present)

    def fetch_ids(self, ids: Sequence[int]) -> set[int]:
        found: set[int] = set()
        for chunk in _chunks(list(ids)):
            marks = ",".join("?" * len(chunk))
            found.update(r[0] for r in self._conn.execute(f"SELECT id FROM records WHERE id IN ({marks})", chunk))
        return found

    def fetch(self, ids: Sequence[int]) -> dict[int, StoredRecord]:
        out: dict[int, StoredRecord] = {}
        with self._lock:
            for chunk in _chunks([int(i) for i in ids]):
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT id, text, label, answer FROM records WHERE id IN ({marks})", chunk
                ).fetchall()
                out.update({r[0]: StoredRecord(*r) for r in rows})
        return out

    def version(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return int(row[0]) if row else 0

    def changes(self, since: int) -> Changes:
        with self._lock:
            self._conn.execute("BEGIN")  # one snapshot: the version and the rows it covers
            try:
                version = self.version()
                rows = self._conn.execute(
                    "SELECT id, unit, embedding FROM records WHERE version > ? AND version <= ? ORDER BY id",
                    (since, version),
                ).fetchall()
                removed = [r[0] for r in self._conn.execute(
                    "SELECT id FROM deletions WHERE version > ? AND version <= ?", (since, version))]  # fmt: skip
            finally:
                self._conn.execute("COMMIT")
        return changes_from_rows(version, rows, removed)

    def close(self) -> None:
        if self._memory is not None or self._pid == os.getpid():
            self._conn.close()

    # -- internals --------------------------------------------------------------------------------
    def _next_version(self) -> int:
        """Inside a write transaction: the change's version (writers are serialised by SQLite's write lock)."""
        self._conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'version'")
        return self.version()

    def _write(self, statement: str, params: tuple) -> None:
        try:
            with self._lock, self._conn:
                self._conn.execute(statement, params)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot write the private index: {exc}") from None


def _chunks(values: list[int]) -> list[list[int]]:
    return [values[i : i + _CHUNK] for i in range(0, len(values), _CHUNK)]
