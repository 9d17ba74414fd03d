"""Records of a private index in one SQLite file (``records.sqlite`` of the index directory) or in memory.

The file is an :class:`~dp_icl_plugin._storage.sqlite_file.SQLiteFile` like the ledger's and the
filter's (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` writes, a connection per process, typed errors),
recognised by ``PRAGMA application_id`` and its schema by ``user_version``. Schema 2 adds the change version
(a ``version`` column on records, a ``deletions`` table and ``meta.version``) so that processes sharing the
directory keep their FAISS copies in step; a schema-1 file is upgraded in place on open (its records at
version 0).

A removed record leaves no text behind in either file: every connection runs with ``secure_delete`` on (the
deleted row's bytes are overwritten with zeros, whatever the SQLite build's default), and every removal ends
with a ``TRUNCATE`` checkpoint, since the write-ahead log still holds the pages written when it was added.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dp_icl_plugin._storage.sqlite_file import SQLiteFile
from dp_icl_plugin.errors import LedgerCorruptError, LedgerFormatError
from dp_icl_plugin.retrieval.stores.base import (
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
    """The records of one index in ``path`` (a new or existing ``records.sqlite``), or in memory (None).

    Args:
        path: the file, or None for memory.
        busy_timeout: seconds to wait for another connection's lock.
    """

    def __init__(self, path: Path | None, *, busy_timeout: float = 60.0) -> None:
        self.path = path
        self.where = "memory" if path is None else str(path)
        # secure_delete: a removed record's text and embedding are overwritten with zeros, not left in free space
        self._file = SQLiteFile(
            path,
            kind="private index",
            application_id=APPLICATION_ID,
            busy_timeout=busy_timeout,
            pragmas=("PRAGMA secure_delete = ON",),
        )
        self._file.check_header()

    # -- creating and opening ----------------------------------------------------------------------
    def create(self, meta: IndexMeta) -> None:
        """Make the index (refused where one exists).

        Args:
            meta: the new index's metadata.

        Raises:
            LedgerFormatError: the file holds an index already.
        """

        def make(conn: sqlite3.Connection, fresh: bool) -> None:
            if not fresh:
                raise LedgerFormatError(f"{self.where} holds a private index already")
            for statement in _SCHEMA:
                conn.execute(statement)
            values = [
                ("id", meta.id),
                ("group_by_user", "1" if meta.group_by_user else "0"),
                ("embedder", meta.embedder),
                ("dim", ""),
                ("version", "0"),
            ]
            if meta.fingerprint is not None:
                values.append(("embedder_fingerprint", meta.fingerprint))
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", values)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._file.open(make)

    def check(self) -> None:
        """Refuse a file that is not an index of a schema this library reads; upgrade schema 1 in place (in
        the same write transaction: another opener waits, a crash undoes it).

        Raises:
            LedgerFormatError: not a private index, or one of an unknown schema.
        """

        def upgrade(conn: sqlite3.Connection, fresh: bool) -> None:
            schema = conn.execute("PRAGMA user_version").fetchone()[0]
            if fresh:
                raise LedgerFormatError("the records file is not a dp-icl private index")
            if schema == 1:
                for statement in _UPGRADE_FROM_1:
                    conn.execute(statement)
            elif schema != SCHEMA_VERSION:
                raise LedgerFormatError("the private index has a schema this library does not read")

        self._file.open(upgrade)

    def backup_to(self, path: Path) -> None:
        """Copy the whole file (a consistent snapshot) to ``path``.

        Args:
            path: the new file.
        """
        target = sqlite3.connect(path)
        try:
            with self._file.lock:
                self._file.connection().backup(target)
        finally:
            target.close()

    # -- RecordStore ---------------------------------------------------------------------------------
    def meta(self) -> IndexMeta:
        """The index's metadata.

        Raises:
            LedgerCorruptError: the meta table is incomplete.
        """
        with self._file.transaction(write=False) as conn:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
        if not {"id", "group_by_user", "embedder", "dim"} <= meta.keys():
            raise LedgerCorruptError("private index has an incomplete meta table")
        return IndexMeta(
            meta["id"],
            meta["group_by_user"] == "1",
            meta["embedder"],
            meta.get("embedder_fingerprint"),
            int(meta["dim"]) if meta["dim"] else None,
            meta.get("floor"),
        )

    def set_dim(self, dim: int) -> None:
        """Record the embedding dimension (once, with the first records).

        Args:
            dim: the embedding dimension.
        """
        with self._file.transaction() as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'dim'", (str(dim),))

    def set_floor(self, floor: str) -> None:
        """Record the search mask's floor.

        Args:
            floor: its JSON.
        """
        with self._file.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('floor', ?)", (floor,))

    def insert(self, texts, labels, answers, users, vectors) -> Changes:
        """Add records; returns them as the change they make (:meth:`RecordStore.insert`).

        Args:
            texts: the records' texts.
            labels: a label (or None) per record.
            answers: an answer (or None) per record.
            users: a user id (or None) per record.
            vectors: the embeddings, float32 [len(texts), dim].
        """
        with self._file.transaction() as conn:
            version = _next_version(conn)
            units: list[int | None] = [None] * len(texts)
            if any(u is not None for u in users):
                conn.executemany("INSERT OR IGNORE INTO users (name) VALUES (?)", [(u,) for u in set(users)])
                names = dict(conn.execute("SELECT name, unit FROM users"))
                units = [names[u] for u in users]
            ids, unit_ids = [], []
            for text, label, answer, unit, vec in zip(texts, labels, answers, units, vectors, strict=True):
                cur = conn.execute(
                    "INSERT INTO records (unit, text, label, answer, embedding, version) VALUES (-1, ?, ?, ?, ?, ?)",
                    (text, label, answer, vec.tobytes(), version),
                )
                rid = int(cur.lastrowid or 0)
                unit_id = rid if unit is None else unit  # per-record budgets: the unit is the record
                conn.execute("UPDATE records SET unit = ? WHERE id = ?", (unit_id, rid))
                ids.append(rid)
                unit_ids.append(unit_id)
        return Changes(
            version,
            np.asarray(ids, dtype=np.int64),
            np.asarray(unit_ids, dtype=np.int64),
            np.asarray(vectors, dtype=np.float32),
            np.zeros(0, dtype=np.int64),
        )

    def delete(self, ids: np.ndarray) -> Changes:
        """Delete records (text and embedding); ``removed`` holds those that existed.

        Args:
            ids: the record ids to delete.
        """
        with self._file.transaction() as conn:
            version = _next_version(conn)  # the write lock first, then what is present under it
            present = sorted(_present(conn, [int(i) for i in ids.tolist()]))
            conn.executemany("DELETE FROM records WHERE id = ?", [(i,) for i in present])
            conn.executemany(
                "INSERT OR REPLACE INTO deletions (id, version) VALUES (?, ?)", [(i, version) for i in present]
            )
        if present:
            self._checkpoint()
        return removal(version, present)

    def _checkpoint(self) -> None:
        """Copy the write-ahead log into the file and truncate it: until then the log still holds the pages
        with the removed text (written when it was added), whatever ``secure_delete`` zeroed in the new ones.
        TRUNCATE waits (up to the busy timeout) for other connections' readers to move to the newest snapshot."""
        if self.path is None:
            return
        with self._file.lock:
            try:
                busy, _, _ = self._file.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise self._file.fail(exc) from None
        if busy:
            warnings.warn(
                f"records removed from {self.where}, but other connections kept its write-ahead log busy for "
                f"{self._file.busy_timeout:g}s: the removed text stays in {self.path.name}-wal until a later "
                "removal's checkpoint or the last connection closes",
                RuntimeWarning,
                stacklevel=3,
            )

    def fetch(self, ids: Sequence[int]) -> dict[int, StoredRecord]:
        """The stored records among ``ids`` (removed ones are absent).

        Args:
            ids: record ids.
        """
        out: dict[int, StoredRecord] = {}
        with self._file.transaction(write=False) as conn:
            for chunk in _chunks([int(i) for i in ids]):
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(f"SELECT id, text, label, answer FROM records WHERE id IN ({marks})", chunk)
                out.update({r[0]: StoredRecord(*r) for r in rows})
        return out

    def removals(self) -> int:
        """How many records were ever removed from the index."""
        with self._file.transaction(write=False) as conn:
            return int(conn.execute("SELECT count(*) FROM deletions").fetchone()[0])

    def version(self) -> int:
        """The current version (the number of changes made)."""
        with self._file.transaction(write=False) as conn:
            return _version(conn)

    def changes(self, since: int) -> Changes:
        """Every change after version ``since`` (all records when ``since`` is 0).

        Args:
            since: a version this host saw.
        """
        with self._file.transaction(write=False) as conn:  # one snapshot: the version and the rows it covers
            version = _version(conn)
            rows = conn.execute(
                "SELECT id, unit, embedding FROM records WHERE version > ? AND version <= ? ORDER BY id",
                (since, version),
            ).fetchall()
            removed = [
                r[0]
                for r in conn.execute("SELECT id FROM deletions WHERE version > ? AND version <= ?", (since, version))
            ]
        return changes_from_rows(version, rows, removed)

    def close(self) -> None:
        """Close the store's connection."""
        self._file.close()


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    return int(row[0]) if row else 0


def _next_version(conn: sqlite3.Connection) -> int:
    """Inside a write transaction: the change's version (writers are serialised by SQLite's write lock)."""
    conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'version'")
    return _version(conn)


def _present(conn: sqlite3.Connection, ids: list[int]) -> set[int]:
    found: set[int] = set()
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        found.update(r[0] for r in conn.execute(f"SELECT id FROM records WHERE id IN ({marks})", chunk))
    return found


def _chunks(values: list[int]) -> list[list[int]]:
    return [values[i : i + _CHUNK] for i in range(0, len(values), _CHUNK)]
