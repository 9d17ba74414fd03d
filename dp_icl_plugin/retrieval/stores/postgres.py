"""Records of a private index in PostgreSQL, shared by every host that serves it (``[postgres]`` extra).

Tables ``dp_icl_index_*`` (created on first use, with ``dp_icl_index_meta`` naming the application and schema
version) hold every index of the database by name. Each change (records added or removed) is one transaction
that first increments the index row's ``version`` (``UPDATE ... RETURNING``): the row lock serialises
writers, so versions commit in order and a host that reads version *v* sees every change up to *v*. Record
ids are allocated from the same row (``next_id``), so each index's ids are small and dense (they index the
hosts' in-memory arrays). Removing a record deletes its row (text and embedding) and logs its id with the
version that removed it. PostgreSQL keeps a deleted row's bytes in the table's pages (dead tuples, until
``VACUUM FULL`` rewrites the table), in the WAL, archives, backups and replicas: ``docs/retrieval.md``
(*Removing records*) says what an operator must do to erase them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dp_icl_plugin._storage.postgres_connection import PostgresConnection, mask_dsn
from dp_icl_plugin.errors import ConfigurationError, LedgerError, LedgerFormatError, NothingStoredError
from dp_icl_plugin.retrieval.stores.base import (
    Changes,
    IndexMeta,
    RecordStore,
    StoredRecord,
    changes_from_rows,
    removal,
)

__all__ = ["PostgresRecordStore"]

APPLICATION = "dp-icl-plugin private index"
SCHEMA_VERSION = 1
_CREATE_LOCK = 0x44504958  # pg_advisory_xact_lock key ("DPIX"): one creator of the tables at a time
_SCHEMA = (
    "CREATE TABLE dp_icl_index_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE dp_icl_indexes (name text PRIMARY KEY, id text NOT NULL UNIQUE, group_by_user boolean NOT NULL,"
    " embedder text NOT NULL, fingerprint text, dim integer, floor text, version bigint NOT NULL DEFAULT 0,"
    " next_id bigint NOT NULL DEFAULT 1, next_unit bigint NOT NULL DEFAULT 1, created double precision NOT NULL)",
    "CREATE TABLE dp_icl_index_users (index_id text NOT NULL REFERENCES dp_icl_indexes(id), name text NOT NULL,"
    " unit bigint NOT NULL, PRIMARY KEY (index_id, name))",
    "CREATE TABLE dp_icl_index_records (index_id text NOT NULL REFERENCES dp_icl_indexes(id), id bigint NOT NULL,"
    " unit bigint NOT NULL, text text NOT NULL, label text, answer text, embedding bytea NOT NULL,"
    " version bigint NOT NULL, PRIMARY KEY (index_id, id))",
    "CREATE INDEX dp_icl_index_records_version ON dp_icl_index_records (index_id, version)",
    "CREATE TABLE dp_icl_index_deletions (index_id text NOT NULL REFERENCES dp_icl_indexes(id), id bigint NOT NULL,"
    " version bigint NOT NULL, PRIMARY KEY (index_id, id))",
    "CREATE INDEX dp_icl_index_deletions_version ON dp_icl_index_deletions (index_id, version)",
)
_TABLES = (
    "dp_icl_index_meta",
    "dp_icl_indexes",
    "dp_icl_index_users",
    "dp_icl_index_records",
    "dp_icl_index_deletions",
)


class PostgresRecordStore(RecordStore):
    """The records of the index ``name`` in the database ``dsn``; :meth:`create` or :meth:`open` it first.

    Args:
        dsn: a ``postgresql://`` URL.
        name: the index's name in the database.
        connect_timeout: seconds to wait for a connection.
        lock_timeout: seconds to wait for a lock.

    Raises:
        ConfigurationError: ``name`` is empty, too long or not printable.
    """

    def __init__(self, dsn: str, *, name: str, connect_timeout: float = 10.0, lock_timeout: float = 60.0) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 200 or not name.isprintable():
            raise ConfigurationError("name must be a non-empty index name of at most 200 printable characters")
        self.name = name
        self._db = PostgresConnection(
            dsn,
            what=f"private index {name!r}",
            kind="dp-icl private index",
            connect_timeout=connect_timeout,
            lock_timeout=lock_timeout,
        )
        self.where = self._db.where()
        self.dsn = dsn
        self._id: str | None = None

    def __repr__(self) -> str:
        return f"PostgresRecordStore({mask_dsn(self.dsn)!r}, name={self.name!r})"

    # -- creating and opening ----------------------------------------------------------------------
    def create(self, meta: IndexMeta) -> None:
        """Make the index (refused where one exists).

        Args:
            meta: the new index's metadata.

        Raises:
            ConfigurationError: an index of that name exists.
        """

        def work(conn: Any) -> None:
            if conn.execute("SELECT 1 FROM dp_icl_indexes WHERE name = %s", (self.name,)).fetchone():
                raise ConfigurationError(f"{self.where} exists already; use PrivateIndex.open")
            conn.execute(
                "INSERT INTO dp_icl_indexes (name, id, group_by_user, embedder, fingerprint, created)"
                " VALUES (%s, %s, %s, %s, %s, extract(epoch from now()))",
                (self.name, meta.id, meta.group_by_user, meta.embedder, meta.fingerprint),
            )

        self._schema_then(work)
        self._id = meta.id

    def open(self) -> IndexMeta:
        """Open the existing index ``name`` (creating the tables if missing).

        Returns:
            Its metadata.

        Raises:
            NothingStoredError: no index of that name (a LedgerError).
        """

        def work(conn: Any) -> None:
            if conn.execute("SELECT 1 FROM dp_icl_indexes WHERE name = %s", (self.name,)).fetchone() is None:
                raise NothingStoredError(f"no {self.where}")

        self._schema_then(work)
        meta = self.meta()
        self._id = meta.id
        return meta

    # -- RecordStore ---------------------------------------------------------------------------------
    def meta(self) -> IndexMeta:
        """The index's metadata.

        Raises:
            LedgerError: the index does not exist.
        """
        row = self._run(
            lambda c: c.execute(
                "SELECT id, group_by_user, embedder, fingerprint, dim, floor FROM dp_icl_indexes WHERE name = %s",
                (self.name,),
            ).fetchone()
        )
        if row is None:
            raise LedgerError(f"no {self.where}")
        return IndexMeta(row[0], bool(row[1]), row[2], row[3], None if row[4] is None else int(row[4]), row[5])

    def set_dim(self, dim: int) -> None:
        """Record the embedding dimension (once, with the first records).

        Args:
            dim: the embedding dimension.
        """
        self._run(
            lambda c: c.execute(
                "UPDATE dp_icl_indexes SET dim = %s WHERE id = %s AND dim IS NULL", (dim, self._opened())
            )
        )

    def set_floor(self, floor: str) -> None:
        """Record the search mask's floor.

        Args:
            floor: its JSON.
        """
        self._run(lambda c: c.execute("UPDATE dp_icl_indexes SET floor = %s WHERE id = %s", (floor, self._opened())))

    def insert(self, texts, labels, answers, users, vectors) -> Changes:
        """Add records; returns them as the change they make (:meth:`RecordStore.insert`).

        Args:
            texts: the records' texts.
            labels: a label (or None) per record.
            answers: an answer (or None) per record.
            users: a user id (or None) per record.
            vectors: the embeddings, float32 [len(texts), dim].
        """
        index_id, n = self._opened(), len(texts)

        def work(conn: Any) -> Changes:
            version, first = conn.execute(
                "UPDATE dp_icl_indexes SET version = version + 1, next_id = next_id + %s WHERE id = %s"
                " RETURNING version, next_id - %s",
                (n, index_id, n),
            ).fetchone()
            ids = list(range(int(first), int(first) + n))
            units = list(ids)  # per-record budgets: the unit is the record
            if any(u is not None for u in users):
                units = self._user_units(conn, index_id, users)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO dp_icl_index_records (index_id, id, unit, text, label, answer, embedding, version)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    [
                        (index_id, i, u, t, lab, ans, v.tobytes(), version)
                        for i, u, t, lab, ans, v in zip(ids, units, texts, labels, answers, vectors, strict=True)
                    ],
                )
            return Changes(
                int(version),
                np.asarray(ids, dtype=np.int64),
                np.asarray(units, dtype=np.int64),
                np.asarray(vectors, dtype=np.float32),
                np.zeros(0, dtype=np.int64),
            )

        return self._run(work, what="cannot store records")

    def delete(self, ids: np.ndarray) -> Changes:
        """Delete records (text and embedding); ``removed`` holds those that existed.

        Args:
            ids: the record ids to delete.
        """
        index_id, wanted = self._opened(), sorted({int(i) for i in ids.tolist()})

        def work(conn: Any) -> Changes:
            (version,) = conn.execute(
                "UPDATE dp_icl_indexes SET version = version + 1 WHERE id = %s RETURNING version", (index_id,)
            ).fetchone()
            removed = [
                r[0]
                for r in conn.execute(
                    "DELETE FROM dp_icl_index_records WHERE index_id = %s AND id = ANY(%s) RETURNING id",
                    (index_id, wanted),
                ).fetchall()
            ]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO dp_icl_index_deletions (index_id, id, version) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    [(index_id, i, version) for i in removed],
                )
            return removal(int(version), sorted(removed))

        return self._run(work, what="cannot remove records")

    def fetch(self, ids: Sequence[int]) -> dict[int, StoredRecord]:
        """The stored records among ``ids`` (removed ones are absent).

        Args:
            ids: record ids.
        """
        index_id, wanted = self._opened(), [int(i) for i in ids]
        rows = self._run(
            lambda c: c.execute(
                "SELECT id, text, label, answer FROM dp_icl_index_records WHERE index_id = %s AND id = ANY(%s)",
                (index_id, wanted),
            ).fetchall(),
            single=True,
        )
        return {int(r[0]): StoredRecord(int(r[0]), r[1], r[2], r[3]) for r in rows}

    def removals(self) -> int:
        """How many records were ever removed from the index."""
        row = self._run(
            lambda c: c.execute(
                "SELECT count(*) FROM dp_icl_index_deletions WHERE index_id = %s", (self._opened(),)
            ).fetchone(),
            single=True,
        )
        return int(row[0])

    def version(self) -> int:
        """The current version (the number of changes made).

        Raises:
            LedgerError: the index was dropped.
        """
        row = self._run(
            lambda c: c.execute("SELECT version FROM dp_icl_indexes WHERE id = %s", (self._opened(),)).fetchone(),
            single=True,
        )
        if row is None:
            raise LedgerError(f"{self.where} was dropped")
        return int(row[0])

    def changes(self, since: int) -> Changes:
        """Every change after version ``since`` (all records when ``since`` is 0).

        Args:
            since: a version this host saw.
        """
        index_id = self._opened()

        def work(conn: Any) -> Changes:
            (version,) = conn.execute("SELECT version FROM dp_icl_indexes WHERE id = %s", (index_id,)).fetchone()
            rows = conn.execute(
                "SELECT id, unit, embedding FROM dp_icl_index_records WHERE index_id = %s AND version > %s"
                " AND version <= %s ORDER BY id",
                (index_id, since, version),
            ).fetchall()
            removed = [
                int(r[0])
                for r in conn.execute(
                    "SELECT id FROM dp_icl_index_deletions WHERE index_id = %s AND version > %s AND version <= %s",
                    (index_id, since, version),
                ).fetchall()
            ]
            return changes_from_rows(int(version), [(int(i), int(u), bytes(e)) for i, u, e in rows], removed)

        return self._run(work)

    def close(self) -> None:
        """Close the store's connection."""
        self._db.close()

    # -- internals --------------------------------------------------------------------------------
    def _opened(self) -> str:
        if self._id is None:
            raise LedgerError(f"{self.where} is not open")
        return self._id

    def _run(self, work: Any, *, what: str | None = None, single: bool = False) -> Any:
        """``work(connection)`` in one transaction (READ COMMITTED; committed on return); a ``single`` read
        statement runs on its own (autocommit: one round trip instead of three)."""
        with self._db.lock:
            conn = self._db.get()
            try:
                if single:
                    return work(conn)
                with conn.transaction():
                    return work(conn)
            except self._db.pg.Error as exc:
                error = self._db.fail(exc)
                raise (LedgerError(f"{what}: {error}") if what else error) from None

    def _schema_then(self, work: Any) -> None:
        def create(conn: Any) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
            present = conn.execute("SELECT " + ", ".join(f"to_regclass('{t}') IS NOT NULL" for t in _TABLES)).fetchone()
            if not any(present):
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO dp_icl_index_meta (key, value) VALUES ('application', %s), ('schema_version', %s)",
                    (APPLICATION, str(SCHEMA_VERSION)),
                )
            elif not all(present):
                raise LedgerFormatError(f"the dp_icl_index_* tables at {mask_dsn(self.dsn)} are incomplete")
            else:
                meta = dict(conn.execute("SELECT key, value FROM dp_icl_index_meta").fetchall())
                if meta.get("application") != APPLICATION or meta.get("schema_version") != str(SCHEMA_VERSION):
                    raise LedgerFormatError(
                        f"the dp_icl_index_* tables at {mask_dsn(self.dsn)} are not a private "
                        f"index of schema {SCHEMA_VERSION}"
                    )
            work(conn)

        self._run(create)

    @staticmethod
    def _user_units(conn: Any, index_id: str, users: Sequence[str | None]) -> list[int]:
        names = sorted({u for u in users if u is not None})
        known = dict(
            conn.execute(
                "SELECT name, unit FROM dp_icl_index_users WHERE index_id = %s AND name = ANY(%s)", (index_id, names)
            ).fetchall()
        )
        new = [u for u in names if u not in known]
        if new:
            (first,) = conn.execute(
                "UPDATE dp_icl_indexes SET next_unit = next_unit + %s WHERE id = %s RETURNING next_unit - %s",
                (len(new), index_id, len(new)),
            ).fetchone()
            for offset, name in enumerate(new):
                known[name] = int(first) + offset
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO dp_icl_index_users (index_id, name, unit) VALUES (%s, %s, %s)",
                    [(index_id, u, known[u]) for u in new],
                )
        return [int(known[u]) for u in users]  # type: ignore[index]
