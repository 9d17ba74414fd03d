"""The private index: records, their unit-length embeddings in an exact FAISS index, and their privacy filter.

Exact (flat inner-product) search is what the privacy analysis needs: it is *stable*, changing one record
changes the top-k set by at most one element (Wu et al.; the kNN DP-ICL paper, §2.2), and a record's
similarity to a query depends on that record alone, which lets the retriever charge records by a public
similarity threshold (see :mod:`dp_icl_plugin.accounting.individual_filter`).

Records whose unit can no longer afford the *floor* are masked out of every search, without a rebuild: a scan
fetches a few extra neighbours and drops masked ones, falling back to a FAISS ``IDSelectorBitmap`` scan when
too many are masked. The floor is the element-wise cheapest cost any release has *declared* before its search
(:meth:`PrivateIndex.expect_release`: its cost to a unit with one candidate record, a function of the release's
public settings), never a cost actually charged (which depends on other units' candidate counts, and would let
one unit's data decide whether another takes part). Every cost of the current release is at least the floor,
so a masked unit is one its filter would refuse anyway: the mask changes no output. Admission is decided by the
filter inside its own transaction, so another process's charges are always respected.

On disk an index is a directory: ``records.sqlite`` (text, label, answer, user id and embedding of every
record; the source of truth, FAISS is rebuilt from it on :meth:`PrivateIndex.open`) and ``filter.sqlite``
(per-unit spend, bound to this index by its id). Or it lives in a PostgreSQL database (``path`` a
``postgresql://`` URL, the index named ``name``), records and per-unit spend shared by every host that serves
it (:mod:`dp_icl_plugin.retrieval.stores.postgres`, :mod:`dp_icl_plugin.accounting.stores.filter_postgres`).
Removing a record deletes its text and embedding (from an SQLite directory's files and write-ahead log at
once; PostgreSQL keeps dead rows until ``VACUUM FULL``, see ``docs/retrieval.md``, *Removing records*).

**Several processes or hosts.** Each keeps its own FAISS copy and, before every search, applies the records
added and removed since the store version it last saw (one query when nothing changed). Between that check
and the release a copy may be stale, and that is safe: a record added meanwhile is no candidate (it pays
nothing and takes no part), a record removed meanwhile may still be a candidate and pay, but it is dropped
before its text is read (:meth:`PrivateIndex.present`), and a unit that another host exhausted is refused by
the filter's own transaction, which locks that unit's row. A stale copy can only make a unit pay when it
need not, never let one take part without paying or past its budget.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._storage.postgres_connection import is_postgres_url
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost, admissible
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.accounting.renyi_filter import SEVERAL_WORKERS_HINT, RenyiFilter
from dp_icl_plugin.errors import (
    ConfigurationError,
    ConfigurationTypeError,
    LedgerCorruptError,
    LedgerError,
    NothingStoredError,
)
from dp_icl_plugin.retrieval.embedding import (
    default_embedder,
    embed_records,
    embed_texts,
    embedder_fingerprint,
    embedder_name,
    same_embedder,
)
from dp_icl_plugin.retrieval.release_turn import RELEASE_LOCK, ReleaseTurn, release_turn
from dp_icl_plugin.retrieval.stores.base import Changes, IndexMeta, RecordStore, StoredRecord
from dp_icl_plugin.retrieval.stores.postgres import PostgresRecordStore
from dp_icl_plugin.retrieval.stores.sqlite import SQLiteRecordStore

__all__ = ["Candidates", "PrivateIndex", "StoredRecord"]

RECORDS_FILE = "records.sqlite"
FILTER_FILE = "filter.sqlite"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("faiss is missing: pip install 'dp-icl-plugin[retrieval]'") from None
    return faiss


@dataclass(frozen=True)
class Candidates:
    """Record ids with their similarity to a query, most similar first (internal: never released).

    Attributes:
        ids: the record ids.
        similarities: each record's cosine similarity to the query.
    """

    ids: np.ndarray
    similarities: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:  # how many records are near a query is private
        return "Candidates(<private>)"

    def take(self, mask: np.ndarray) -> Candidates:
        """The candidates selected by ``mask``, in order.

        Args:
            mask: a boolean mask over the candidates.
        """
        return Candidates(self.ids[mask], self.similarities[mask])

    def nearest_per_unit(self, units: np.ndarray, limit: int) -> Candidates:
        """Each unit's ``limit`` most similar candidates, in their order (contribution bounding: which of a unit's
        records stay depends on that unit's records and the query alone, never on another unit's). Ties go to the
        lower record id; a record no longer stored (unit −1) is dropped.

        Args:
            units: each candidate's unit (:meth:`PrivateIndex.units_of`).
            limit: the most candidates one unit keeps (a positive integer).
        """
        unit_of = np.asarray(units).tolist()
        seen: dict[int, int] = {}
        keep = np.zeros(len(self.ids), dtype=bool)
        for i in np.lexsort((self.ids, -self.similarities)).tolist():  # most similar first, then by id
            unit = unit_of[i]
            seen[unit] = seen.get(unit, 0) + 1
            keep[i] = unit >= 0 and seen[unit] <= limit
        return self.take(keep)


def _storable(name: str, text: str) -> None:
    """Refuse text every store cannot keep as it is (a NUL byte, a lone surrogate), without echoing it."""
    if "\x00" in text:
        raise ConfigurationError(f"{name} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{name} is not valid Unicode text (a lone surrogate)") from None


def _optional_column(name: str, values: Sequence[object] | None, n: int) -> list[str | None]:
    if values is None:
        return [None] * n
    if isinstance(values, str) or len(values) != n:
        raise ConfigurationError(f"{name} must be a sequence with one entry per text ({n})")
    out: list[str | None] = []
    for i, v in enumerate(values):
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise ConfigurationError(f"{name}[{i}] must be a non-empty string or None")
        if v is not None:
            _storable(f"{name}[{i}]", v)
        out.append(v)
    return out


class PrivateIndex:
    """Private records in an exact inner-product index, each with its own privacy budget.

    This is the data holder's store: :meth:`search`, :meth:`within` and :meth:`records` return private
    data and are no DP release. Apps answer queries through :class:`PrivateKNN`, which charges the
    filter and releases only DP outputs.

    Args:
        budget: every unit's lifetime (ε, δ) budget (see :class:`IndividualBudget`).
        embedder: a SentenceTransformer or a callable mapping a list of texts to vectors; the default is
            the offline all-MiniLM-L6-v2.
        group_by_user: protect people instead of records: all records with one user id share one budget
            (and every record must then have a user id).
        path: a directory to keep the index in (created; must not hold an index yet), a ``postgresql://``
            URL (the index ``name`` in that database, shared by every host that opens it), or ``None`` for
            memory only (:meth:`save` writes it out later).
        name: the index's name in a PostgreSQL database (several indexes may share one).

    Raises:
        ConfigurationError: a bad argument, or ``path`` already holds an index.
        LedgerError: the directory or database cannot be written.
    """

    _retired: str | None  # why this object may no longer be used (saved to a directory)
    _faiss_index: Any  # a faiss.IndexIDMap2 once the dimension is known

    _version: int  # the store version this process's FAISS copy reflects

    def __init__(
        self,
        *,
        budget: IndividualBudget,
        embedder: object | None = None,
        group_by_user: bool = False,
        path: str | os.PathLike[str] | None = None,
        name: str = "default",
    ) -> None:
        if not isinstance(budget, IndividualBudget):
            raise ConfigurationTypeError("budget must be an IndividualBudget")
        if not isinstance(group_by_user, bool):
            raise ConfigurationError("group_by_user must be True or False")
        self._embedder = embedder if embedder is not None else default_embedder()
        self.id = uuid.uuid4().hex
        self.group_by_user = group_by_user
        self.embedder_name = embedder_name(self._embedder)
        self._fingerprint = embedder_fingerprint(self._embedder)  # before anything is stored
        self.dim: int | None = None
        self._lock = threading.RLock()
        meta = IndexMeta(self.id, group_by_user, self.embedder_name, json.dumps(self._fingerprint), None)
        if is_postgres_url(path):
            self.path = None
            store: RecordStore = PostgresRecordStore(str(path), name=name)
            # the filter first: a crash between the two leaves an unused filter row, never a named index
            # without its filter
            self.filter = RenyiFilter(budget, path=str(path), owner=self.id)
            store.create(meta)
        else:
            self.path = None if path is None else Path(path)
            if self.path is not None:
                self._claim_directory(self.path)
            store = SQLiteRecordStore(None if self.path is None else self.path / RECORDS_FILE)
            store.create(meta)
            self.filter = RenyiFilter(
                budget, path=None if self.path is None else self.path / FILTER_FILE, owner=self.id
            )
        self._store = store
        self._init_memory()

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, embedder: object | None = None, name: str = "default"
    ) -> PrivateIndex:
        """Load an index written by this class: a directory, or the index ``name`` in a PostgreSQL database
        (``path`` a ``postgresql://`` URL); its records become this process's FAISS copy.

        Args:
            path: the index's directory, or a ``postgresql://`` URL.
            embedder: the embedder the index was built with (the default: all-MiniLM-L6-v2).
            name: the index's name in a PostgreSQL database.

        Raises:
            NothingStoredError: no index there (a :class:`~dp_icl_plugin.errors.LedgerError`).
            LedgerFormatError: not an index.
            FilterMismatchError: its filter belongs to another index.
            ConfigurationError: the embedder differs from the index's.
        """
        self = cls.__new__(cls)
        self._lock = threading.RLock()
        if is_postgres_url(path):
            self.path = None
            store = PostgresRecordStore(str(path), name=name)
            meta = store.open()
            self._store = store
            filter_at: str | Path = str(path)
        else:
            root = Path(path)
            if not (root / RECORDS_FILE).is_file():
                raise NothingStoredError(f"no private index at {root} (missing {RECORDS_FILE})")
            self.path = root
            sqlite_store = SQLiteRecordStore(root / RECORDS_FILE)
            sqlite_store.check()
            self._store = sqlite_store
            meta = sqlite_store.meta()
            filter_at = root / FILTER_FILE
        self.id = meta.id
        self.group_by_user = meta.group_by_user
        self.dim = meta.dim
        self.embedder_name = meta.embedder
        self._embedder = embedder if embedder is not None else default_embedder()
        self._fingerprint = self._check_embedder(meta.fingerprint)
        if isinstance(filter_at, Path) and not filter_at.is_file():
            raise LedgerCorruptError(f"private index {self.path} has no {FILTER_FILE}: its privacy spend is missing")
        self.filter = RenyiFilter(path=filter_at, owner=self.id)
        self._init_memory()
        self._version = -1  # before any change: the first refresh loads every record (schema-1 ones are at 0)
        self.refresh()
        self._restore_floor(meta.floor)
        return self

    def _check_embedder(self, stored: str | None) -> list[list[float]]:
        """Refuse an embedder that computes other vectors than the index's (whatever its name): the index
        would then search vectors of two models. An index written before fingerprints were kept keeps the
        name check it had (names as that version wrote them) and is not rewritten on open."""
        if stored is None:
            kind = type(self._embedder)
            named = getattr(self._embedder, "dp_icl_name", None) or getattr(self._embedder, "name", None)
            legacy = named if isinstance(named, str) and named else f"{kind.__module__}.{kind.__qualname__}"
            if legacy != self.embedder_name:
                raise ConfigurationError(f"this index was built with embedder {self.embedder_name!r}, not {legacy!r}")
            return embedder_fingerprint(self._embedder)
        fingerprint = json.loads(stored)
        if not same_embedder(fingerprint, self._embedder):
            raise ConfigurationError(
                f"this index was built with another embedder ({self.embedder_name!r}): the given one computes "
                "different vectors for the same public probe texts"
            )
        return fingerprint

    def save(self, path: str | os.PathLike[str]) -> PrivateIndex:
        """Move an in-memory index (records, vectors, filter state) to a new directory; returns it opened.

        A move, not a copy: the index keeps its id, so the ledger's cover charge (looked up by that id) goes
        on covering its records, and their spend then lives in the directory only. This object refuses every
        use afterwards (and a second save), so no record can spend its budget once here and once there. A
        copy under a new id would need a second cover charge for the same records, paying for nothing.

        All or nothing: both files are written in a hidden staging directory beside ``path`` and renamed to
        ``path`` once complete, under the filter's lock (no charge in between), and only then is this object
        retired. A save that fails (a full disk) leaves no index at ``path`` and this object usable; a process
        killed mid-save leaves at most a ``.<name>.saving-*`` directory, which is never opened as an index
        (before, a directory with the records and a filter without its spend was left behind, and opening it
        gave every record its budget again under the same cover).

        Args:
            path: a new or empty directory.

        Returns:
            The index opened from ``path``; use it instead of this object.

        Raises:
            ConfigurationError: the index already lives in a directory or database, was saved already, or
                ``path`` exists and is not an empty directory.
            LedgerError: the directory cannot be written.
        """
        self._check_usable()  # before the lock (a fork may leave it held)
        with self.release_turn.hold(), self._lock:  # never between an answer's tokens (retrieval.release_turn)
            self._check_usable()
            if self.path is not None or not isinstance(self._store, SQLiteRecordStore):
                raise ConfigurationError(f"this index already lives in {self._store.where}; it is saved on each change")
            root = Path(path)
            staging = self._staging_directory(root)
            try:
                self._store.backup_to(staging / RECORDS_FILE)
                # writes the filter's copy, retires the in-memory filter and renames the staging directory
                # into place, all under the filter's lock; put back in use only if nothing was published
                self.filter.move_to(
                    staging / FILTER_FILE,
                    publish=lambda: _publish(staging, root),
                    published=lambda: not staging.exists(),
                ).close()
            except BaseException:
                if staging.exists():  # not published: this index is still the only one
                    _remove_staging(staging)
                    raise
                self._retire_saved(root)  # published after all (an interrupted or misreported rename)
                raise
            self._retire_saved(root)
        return PrivateIndex.open(root, embedder=self._embedder)

    def _retire_saved(self, root: Path) -> None:
        self._retired = (
            f"this in-memory index was saved to {root}: use the index save() returned (or "
            f"PrivateIndex.open on that directory)"
        )
        self._store.close()
        self._faiss_index = None

    @staticmethod
    def _staging_directory(root: Path) -> Path:
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            what = "a private index" if (root / RECORDS_FILE).exists() or (root / FILTER_FILE).exists() else "files"
            raise ConfigurationError(
                f"{root} already holds {what}: an index is saved to a new or empty directory"
                + ("; use PrivateIndex.open" if what == "a private index" else "")
            )
        staging = root.parent / f".{root.name}.saving-{uuid.uuid4().hex[:12]}"
        try:
            staging.mkdir(parents=True)
        except OSError as exc:
            raise LedgerError(f"cannot create index directory {root}: {exc}") from None
        return staging

    # -- records ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        self._check_usable()
        return 0 if self._faiss_index is None else int(self._faiss_index.ntotal)

    def __reduce__(self):
        raise TypeError(
            "a private index cannot be pickled or copied (its copy would be a second live filter for "
            "the same records); open its directory or database again instead"
        )

    def __repr__(self) -> str:  # no record count: how many records an index holds is private (add/remove)
        where = self._store.where
        unit = "user" if self.group_by_user else "record"
        return f"PrivateIndex(per={unit}, embedder={self.embedder_name!r}, at={where!r})"

    def add(
        self,
        texts: Sequence[str],
        *,
        labels: Sequence[str | None] | None = None,
        answers: Sequence[str | None] | None = None,
        user_ids: Sequence[str | None] | None = None,
    ) -> np.ndarray:
        """Embed (each text on its own, :func:`~dp_icl_plugin.retrieval.embedding.embed_records`) and add
        records; returns their ids. Nothing is released, so nothing is charged.

        Args:
            texts: the records' texts (non-empty).
            labels: a label per record, or None.
            answers: an answer per record, or None.
            user_ids: a user id per record, or None (required for every record when grouped by user).

        Returns:
            The new records' ids.

        Raises:
            ConfigurationError: a text or column is invalid, a user id is missing when grouped by user, the
                embedder's dimension differs from the index's, or this object is no longer usable.
        """
        self._check_usable()
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ConfigurationError("texts must be a sequence of strings (pass [text] for one record)")
        n = len(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ConfigurationError(f"texts[{i}] must be a non-empty string")
            _storable(f"texts[{i}]", t)
        label_col = _optional_column("labels", labels, n)
        answer_col = _optional_column("answers", answers, n)
        user_col = _optional_column("user_ids", user_ids, n)
        if self.group_by_user and any(u is None for u in user_col):
            raise ConfigurationError("an index grouped by user needs a user id for every record")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        vectors = embed_records(self._embedder, texts)  # one by one: a record's vector never depends on another
        with self._lock:
            self.refresh()
            if self.dim is not None and vectors.shape[1] != self.dim:
                raise ConfigurationError(
                    f"the embedder returned {vectors.shape[1]}-d vectors; this index holds {self.dim}-d"
                )
            if self.dim is None:
                self._store.set_dim(int(vectors.shape[1]))
                self.dim = int(vectors.shape[1])
                self._new_faiss(self.dim)
            users = user_col if self.group_by_user else [None] * n
            change = self._store.insert(list(texts), label_col, answer_col, users, vectors)
            self._applied_own(change)
        return change.ids

    def remove(self, ids: Sequence[int] | np.ndarray) -> int:
        """Delete records (text and embedding); returns how many existed. Their spend stays on record.

        Args:
            ids: the record ids to delete (unknown ones are ignored).

        Raises:
            ConfigurationError: this object is no longer usable (saved to a directory, or made in another process).
        """
        arr = np.unique(np.asarray(ids, dtype=np.int64))
        self._check_usable()  # before the lock (a fork may leave it held)
        with self.release_turn.hold(), self._lock:  # never between an answer's tokens (retrieval.release_turn)
            self._check_usable()
            change = self._store.delete(arr[arr >= 0])
            self._applied_own(change)
        return len(change.removed)

    def refresh(self) -> None:
        """Bring this process's FAISS copy up to the store: records added and removed by any process or host
        since the version it last saw (one query when nothing changed). Searches call it first."""
        self._check_usable()  # before the lock (a fork may leave it held)
        with self._lock:
            self._check_usable()
            if self._store.version() != self._version:
                change = self._store.changes(self._version)
                self._apply(change)
                self._version = change.version

    def present(self, ids: np.ndarray) -> tuple[np.ndarray, list[StoredRecord]]:
        """The records among ``ids`` still stored (a mask over ``ids``, and those records in order): another
        host may have removed some since this copy last saw the store.

        Args:
            ids: record ids, e.g. a release's candidates.

        Raises:
            ConfigurationError: this object is no longer usable (saved to a directory, or made in another process).
        """
        self._check_usable()
        found = self._store.fetch([int(i) for i in np.asarray(ids).tolist()])
        mask = np.array([int(i) in found for i in np.asarray(ids).tolist()], dtype=bool)
        return mask, [found[int(i)] for i in np.asarray(ids)[mask].tolist()]

    def records(self, ids: np.ndarray) -> list[StoredRecord]:
        """The stored records with these ids, in that order (for a release step; never log them).

        Args:
            ids: record ids.

        Raises:
            ConfigurationError: an id is not in the index, or this object is no longer usable.
        """
        self._check_usable()
        id_list = [int(i) for i in np.asarray(ids).tolist()]
        out = self._store.fetch(id_list)
        missing = [i for i in id_list if i not in out]
        if missing:
            raise ConfigurationError(f"{len(missing)} record ids are not in this index")
        return [out[i] for i in id_list]

    def all_records(self) -> tuple[list[StoredRecord], np.ndarray]:
        """Every stored record (as the store holds them now) and its privacy unit, in id order: the data
        holder's own view, to check what an index reopened at a restart holds (never log or release them).

        Raises:
            ConfigurationError: this object is no longer usable.
        """
        self.refresh()
        with self._lock:
            ids = np.flatnonzero(self._unit_of >= 0)
        found = self._store.fetch([int(i) for i in ids.tolist()])
        kept = np.array([int(i) in found for i in ids.tolist()], dtype=bool)
        ids = ids[kept]
        return [found[int(i)] for i in ids.tolist()], self.units_of(ids)

    def ever_removed(self) -> bool:
        """Whether any record was ever removed from this index (:meth:`remove`).

        Raises:
            ConfigurationError: this object is no longer usable.
        """
        self._check_usable()
        return self._store.removals() > 0

    def units_of(self, ids: np.ndarray) -> np.ndarray:
        """The privacy unit (record or person) of each record id.

        Args:
            ids: record ids.

        Returns:
            The unit of each record; -1 for a record that is no longer stored.
        """
        self._check_usable()
        return self._unit_of[np.asarray(ids, dtype=np.int64)]

    # -- search -----------------------------------------------------------------------------------
    def embed_query(self, query: str) -> np.ndarray:
        """The unit-length embedding of a (public) query.

        Args:
            query: the query text.

        Raises:
            ConfigurationError: the query is empty, or the embedder's dimension differs from the index's.
        """
        self._check_usable()
        if not isinstance(query, str) or not check.has_text(query):
            raise ConfigurationError("query must be a non-empty string")
        vector = embed_texts(self._embedder, [query])
        if self.dim is not None and vector.shape[1] != self.dim:
            raise ConfigurationError(
                f"the embedder returned {vector.shape[1]}-d vectors; this index holds {self.dim}-d"
            )
        return vector[0]

    def search(self, query: np.ndarray, k: int) -> Candidates:
        """The ``k`` most similar active records (fewer if fewer are active); exact, stable.

        One unfiltered scan fetches a few more than ``k`` and drops masked records; only when too many of
        those are masked does a second scan run with the FAISS bitmap selector. Either way the result is
        the exact top-k of the active records.

        Args:
            query: a query embedding (:meth:`embed_query`).
            k: how many records to return.

        Raises:
            ConfigurationError: ``k`` is not a positive integer, or the query has the wrong dimension or a
                non-finite entry.
        """
        self._check_usable()
        k = check.positive_int("k", k)
        q = self._query_matrix(query)
        with self._lock:
            self.refresh()
            n = len(self)
            if not n:
                return Candidates(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
            fetch = min(n, 2 * k + 16)
            sims, ids = self._faiss_index.search(q, fetch)
            sims, ids = sims[0], ids[0]
            ok = (ids >= 0) & self._active[np.maximum(ids, 0)]
            if ok.sum() < k and fetch < n:
                sims, ids = self._faiss_index.search(q, min(k, n), params=self._params())
                sims, ids = sims[0], ids[0]
                ok = ids >= 0
        keep = np.flatnonzero(ok)[:k]
        return Candidates(ids[keep].astype(np.int64), sims[keep])

    def within(self, query: np.ndarray, min_similarity: float) -> Candidates:
        """Every active record with cosine similarity ≥ ``min_similarity``, most similar first.

        Args:
            query: a query embedding (:meth:`embed_query`).
            min_similarity: the similarity threshold, in [-1, 1].

        Raises:
            ConfigurationError: ``min_similarity`` is out of range, or the query has the wrong dimension or a
                non-finite entry.
        """
        self._check_usable()
        tau = check.real("min_similarity", min_similarity)
        if not -1.0 <= tau <= 1.0:
            raise ConfigurationError(f"min_similarity must lie in [-1, 1], got {tau!r}")
        q = self._query_matrix(query)
        with self._lock:
            self.refresh()
            if not len(self):
                return Candidates(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
            # FAISS keeps inner products strictly above the radius: step just below τ, then filter exactly.
            _, sims, ids = self._faiss_index.range_search(q, np.nextafter(np.float32(tau), np.float32(-2)))
            keep = (sims >= np.float32(tau)) & self._active[ids]  # masked (exhausted) records are skipped
        sims, ids = sims[keep], ids[keep].astype(np.int64)
        order = np.lexsort((ids, -sims))  # most similar first; ties broken by id, a public order
        return Candidates(ids[order], sims[order])

    # -- charging ---------------------------------------------------------------------------------
    @property
    def across_hosts(self) -> bool:
        """Whether the index lives in PostgreSQL, where several hosts may charge it (its release turn holds one
        host's processes only: :mod:`~dp_icl_plugin.retrieval.release_turn`)."""
        return isinstance(self._store, PostgresRecordStore)

    @property
    def release_turn(self) -> ReleaseTurn:
        """The index's turn (:mod:`~dp_icl_plugin.retrieval.release_turn`): every charge takes it; an answer paid
        per token holds it from its first charge to its last. Across processes through ``release.lock`` in the
        index's directory; within this process only for an index in memory or in PostgreSQL."""
        if self.path is not None:
            return release_turn(str(self.path.resolve()), self.path / RELEASE_LOCK)
        return release_turn(f"index:{self.id}", None)

    def expect_release(self, cheapest: ReleaseCost) -> None:
        """Declare, before its search, the cost of a release to a unit with one candidate record: the cheapest
        that release can charge (public: it follows from the release's kind and settings alone).

        The search mask hides the units that cannot afford the cheapest cost declared so far; since this
        release's costs are at least ``cheapest``, those are units its filter would refuse anyway, so the mask
        changes no output and depends on nothing but each unit's own spend and public settings.

        Args:
            cheapest: the release's cost to a unit with one candidate record.
        """
        self._check_usable()  # before the lock (a fork may leave it held)
        with self._lock:
            self._check_usable()
            self._lower_floor(cheapest)

    def charge(
        self, candidates: Candidates, cost_of: Callable[[int], ReleaseCost], *, release_tag: str = ""
    ) -> Candidates:
        """Charge the units behind ``candidates`` and return the candidates whose unit was admitted:
        :meth:`charge_release` without the release's number."""
        return self.charge_release(candidates, cost_of, release_tag=release_tag)[0]

    def charge_release(
        self, candidates: Candidates, cost_of: Callable[[int], ReleaseCost], *, release_tag: str = ""
    ) -> tuple[Candidates, int]:
        """Charge the units behind ``candidates``: the candidates whose unit was admitted, and the release's number.

        Args:
            candidates: records that may take part in a release (all are charged if their unit fits).
            cost_of: the cost of the release to a unit with ``c`` records among the candidates; it must not
                fall as ``c`` grows (checked), which the mask relies on.
            release_tag: what the release is recorded under (its ledger cover), counted by the filter.

        Returns:
            The candidates whose unit was admitted (and is still stored), and the release's number under
            ``release_tag`` (:meth:`RenyiFilter.charge_release`; the ledger records it with the release).

        One call is one release: the filter counts it (:meth:`RenyiFilter.releases`) even over no candidate.

        Raises:
            ConfigurationError: ``cost_of`` falls as ``c`` grows.
        """
        self._check_usable()
        with self.release_turn.hold():  # one release at a time (retrieval.release_turn)
            return self._charge_release(candidates, cost_of, release_tag)

    def _charge_release(
        self, candidates: Candidates, cost_of: Callable[[int], ReleaseCost], release_tag: str
    ) -> tuple[Candidates, int]:
        cheapest = cost_of(1)
        self.expect_release(cheapest)  # for the next searches (a direct caller declares before its search)
        if not len(candidates):  # charges no unit; counts the release
            return candidates, self.filter.charge_release(np.zeros(0, dtype=np.int64), [], release_tag=release_tag)[1]
        units = self.units_of(candidates.ids)
        present = units >= 0  # a record removed meanwhile takes no part and pays nothing
        uniq, counts = np.unique(units[present], return_counts=True)
        by_count: dict[int, ReleaseCost] = {1: cheapest}
        for c in {int(c) for c in counts} - {1}:
            by_count[c] = cost_of(c)
        costs = [by_count[int(c)] for c in counts]
        if any((c.rdp < cheapest.rdp).any() or c.delta < cheapest.delta for c in by_count.values()):
            raise ConfigurationError("a release's cost must not fall as a unit's candidate count grows")
        mask, number = self.filter.charge_release(uniq, costs, release_tag=release_tag)
        admitted_units = uniq[mask]
        with self._lock:
            self._update_mask(uniq)
        return candidates.take(present & np.isin(units, admitted_units)), number

    # -- internals --------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        """Refuse an in-memory index in another process than its maker's (before any lock: one held by another
        thread at ``fork()`` stays held in the child), or once it was saved (moved) to a directory."""
        if self._process is not None and self._process != process_mark():
            raise ConfigurationError(
                f"this in-memory private index was made in process {self._process[0]} and cannot be used in "
                f"another ({os.getpid()}): after a fork every worker would hold its own copy of its records' "
                f"privacy filter and let each record spend its budget once per worker; {SEVERAL_WORKERS_HINT}"
            )
        if self._retired is not None:
            raise ConfigurationError(self._retired)

    def _query_matrix(self, query: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=np.float32).reshape(1, -1)
        if self.dim is not None and q.shape[1] != self.dim:
            raise ConfigurationError(f"query has dimension {q.shape[1]}; this index holds {self.dim}-d vectors")
        if not np.isfinite(q).all():
            raise ConfigurationError("query embedding contains NaN or inf")
        return np.ascontiguousarray(q)

    def _claim_directory(self, root: Path) -> None:
        if (root / RECORDS_FILE).exists() or (root / FILTER_FILE).exists():
            raise ConfigurationError(f"{root} already holds a private index; use PrivateIndex.open")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create index directory {root}: {exc}") from None

    def _init_memory(self) -> None:
        self._retired = None
        in_memory = self.path is None and isinstance(self._store, SQLiteRecordStore)
        self._process = process_mark() if in_memory else None  # in-memory state: this process only
        self._faiss_index = None
        self._unit_of = np.zeros(0, dtype=np.int64)  # by record id; -1: no such record
        self._active = np.zeros(0, dtype=bool)  # by record id: present and not known to be exhausted
        self._bitmap = np.zeros(1, dtype=np.uint8)
        self._bitmap_stale = True
        self._selector = None
        self._floor: tuple[np.ndarray, float] | None = None  # element-wise cheapest cost charged so far
        self._version = 0  # the store version this copy reflects
        if self.dim is not None:
            self._new_faiss(self.dim)

    def _new_faiss(self, dim: int) -> None:
        faiss = _faiss()
        self._faiss_index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def _grow(self, ids: np.ndarray, units: np.ndarray) -> None:
        top = int(ids.max()) + 1
        if top > len(self._unit_of):
            size = max(top, 2 * len(self._unit_of))
            self._unit_of = np.concatenate([self._unit_of, np.full(size - len(self._unit_of), -1, dtype=np.int64)])
            self._active = np.concatenate([self._active, np.zeros(size - len(self._active), dtype=bool)])
        self._unit_of[ids] = units
        self._active[ids] = True
        if self._floor is not None:
            self._update_mask(np.unique(self._unit_of[ids]))
        self._bitmap_stale = True

    def _apply(self, change: Changes) -> None:
        """Apply a store change to this copy: add its records not here yet, drop its removed ones. Idempotent
        (ids are never reused), so a change seen twice (made here, then fetched by a refresh) is harmless."""
        if len(change.ids):
            if self.dim is None:
                self.dim = int(change.vectors.shape[1])
                self._new_faiss(self.dim)
            if change.vectors.shape != (len(change.ids), self.dim):
                raise LedgerCorruptError("private index holds embeddings of the wrong size")
            known = change.ids < len(self._unit_of)
            fresh = np.ones(len(change.ids), dtype=bool)
            fresh[known] = self._unit_of[change.ids[known]] < 0
            if fresh.any():
                self._faiss_index.add_with_ids(np.ascontiguousarray(change.vectors[fresh]), change.ids[fresh])
                self._grow(change.ids[fresh], change.units[fresh])
        gone = change.removed[change.removed < len(self._unit_of)]
        gone = gone[self._unit_of[gone] >= 0]
        if len(gone):
            self._faiss_index.remove_ids(gone)
            self._unit_of[gone] = -1
            self._active[gone] = False
            self._bitmap_stale = True

    def _applied_own(self, change: Changes) -> None:
        """A change this process made: applied at once; the copy's version moves only when no other
        process's change came in between (else the next refresh fetches those, and this one again)."""
        self._apply(change)
        if change.version == self._version + 1:
            self._version = change.version

    def _lower_floor(self, cost: ReleaseCost) -> None:
        """Make the mask's floor the element-wise cheapest declared cost; a cheaper one unmasks every unit
        (each may afford it again), and the mask is rebuilt from the units' own spend."""
        if self._floor is not None and not ((cost.rdp < self._floor[0]).any() or cost.delta < self._floor[1]):
            return
        floor = (
            np.asarray(cost.rdp, dtype=float) if self._floor is None else np.minimum(cost.rdp, self._floor[0]),
            float(cost.delta) if self._floor is None else min(float(cost.delta), self._floor[1]),
        )
        self._set_floor(floor)
        self._active[self._unit_of >= 0] = True
        self._bitmap_stale = True
        units, _, _ = self.filter.all_spent()
        self._update_mask(units)

    def _update_mask(self, units: np.ndarray) -> None:
        """Mask out the records of those ``units`` that cannot afford the floor (by their own spend)."""
        if self._floor is None or not len(units):
            return
        spent, spent_delta = self.filter.spent(units)
        broke = units[~admissible(self.filter.budget, spent, spent_delta, self._floor[0], self._floor[1])]
        if len(broke):
            if self.group_by_user:
                self._active[np.isin(self._unit_of, broke)] = False
            else:  # the unit is the record itself
                self._active[broke[broke < len(self._active)]] = False
            self._bitmap_stale = True

    def _set_floor(self, floor: tuple[np.ndarray, float]) -> None:
        self._floor = floor
        self._store.set_floor(json.dumps({"rdp": [float(x) for x in floor[0]], "delta": floor[1]}))

    def _restore_floor(self, stored: str | None) -> None:
        """Re-apply the search mask of a reopened index (units that cannot pay the cheapest release)."""
        if not stored:
            return
        try:
            data = json.loads(stored)
            rdp = np.asarray(data["rdp"], dtype=float)
            floor = (rdp, float(data["delta"]))
        except (ValueError, KeyError, TypeError):
            raise LedgerCorruptError("private index has a damaged search-mask record") from None
        if rdp.shape != (len(self.filter.budget.orders),):
            raise LedgerCorruptError("private index has a damaged search-mask record")
        self._floor = floor
        units, _, _ = self.filter.all_spent()
        self._update_mask(units)

    def _params(self):
        if self._bitmap_stale:
            faiss = _faiss()
            self._bitmap = np.packbits(self._active, bitorder="little")
            if not len(self._bitmap):
                self._bitmap = np.zeros(1, dtype=np.uint8)
            self._selector = faiss.IDSelectorBitmap(len(self._active), faiss.swig_ptr(self._bitmap))
            self._bitmap_stale = False
        return _faiss().SearchParameters(sel=self._selector)


def _publish(staging: Path, root: Path) -> None:
    """Rename the complete staging directory to ``root`` (which must not exist, or be an empty directory)."""
    try:
        os.rename(staging, root)  # POSIX: replaces an empty directory, fails on a non-empty one
    except OSError as exc:
        if not staging.exists() and (root / FILTER_FILE).exists():  # it took effect (e.g. an NFS retransmission)
            return
        raise LedgerError(f"cannot move the saved index into {root}: {exc}") from None


def _remove_staging(staging: Path) -> None:

    shutil.rmtree(staging, ignore_errors=True)
