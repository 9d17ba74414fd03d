"""The record store interface: what a :class:`~dp_icl_plugin.retrieval.index.PrivateIndex` needs from storage.

A store holds the index's metadata, its records (text, label, answer, privacy unit, embedding) and a
*version* that every change (records added or removed) increments, inside the change's own transaction and
in commit order. A host keeps its FAISS copy in step by asking, before each release, for the changes since
the version it last saw (:meth:`RecordStore.changes`): one cheap query when nothing changed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dp_icl_plugin.errors import LedgerCorruptError

__all__ = ["Changes", "IndexMeta", "RecordStore", "StoredRecord", "changes_from_rows", "removal"]


@dataclass(frozen=True)
class StoredRecord:
    """One private record as stored (internal: the private text never leaves through a repr).

    Attributes:
        id: the record's id in the index.
        text: its text.
        label: its label, if any.
        answer: its answer, if any.
    """

    id: int
    text: str
    label: str | None
    answer: str | None

    def __repr__(self) -> str:
        return f"StoredRecord(id={self.id}, <private>)"  # whether it has a label is private too


@dataclass(frozen=True)
class IndexMeta:
    """What an index is: its id (the filter's owner), unit kind, embedder, dimension and search-mask floor.

    Attributes:
        id: the index's id, the owner of its filter.
        group_by_user: whether a unit is a user (else a record).
        embedder: the embedder's name.
        fingerprint: JSON of the embedder's vectors of public probe texts (None for indexes written before).
        dim: the embedding dimension (None before the first record).
        floor: JSON of the search mask's floor (None before the first release).
    """

    id: str
    group_by_user: bool
    embedder: str
    fingerprint: str | None  # JSON of the embedder's probe vectors; None for indexes written before them
    dim: int | None
    floor: str | None = None  # JSON of the cheapest release cost charged so far (the search mask's floor)


@dataclass(frozen=True)
class Changes:
    """Records added (id, unit, embedding rows) and ids removed after some version, up to ``version``.

    Attributes:
        version: the store version the change brings a copy to.
        ids: the ids of the records added.
        units: their privacy units.
        vectors: their embeddings, float32 [len(ids), dim].
        removed: the ids of the records removed.
    """

    version: int
    ids: np.ndarray
    units: np.ndarray
    vectors: np.ndarray = field(repr=False)  # float32 [len(ids), dim]: private, never in a repr
    removed: np.ndarray

    def __repr__(self) -> str:  # the ids would show how many records were added or removed
        return f"Changes(version={self.version}, <private>)"


class RecordStore(ABC):
    """Durable records of one index. Every method is one transaction; writers are serialised by the store."""

    where: str  # for messages: the file or the database (password masked) and the index's name

    @abstractmethod
    def create(self, meta: IndexMeta) -> None:
        """Make the index (refused where one exists).

        Args:
            meta: the new index's metadata.
        """

    @abstractmethod
    def meta(self) -> IndexMeta:
        """The index's metadata."""
        ...

    @abstractmethod
    def set_dim(self, dim: int) -> None:
        """Record the embedding dimension (once, with the first records).

        Args:
            dim: the embedding dimension.
        """

    @abstractmethod
    def set_floor(self, floor: str) -> None:
        """Record the search mask's floor.

        Args:
            floor: its JSON.
        """
        ...

    @abstractmethod
    def insert(
        self,
        texts: Sequence[str],
        labels: Sequence[str | None],
        answers: Sequence[str | None],
        users: Sequence[str | None],
        vectors: np.ndarray,
    ) -> Changes:
        """Add records (a unit per record, or the user's unit when ``users`` are given); returns them as the
        change they make (their ids and units, the new version).

        Args:
            texts: the records' texts.
            labels: a label (or None) per record.
            answers: an answer (or None) per record.
            users: a user id (or None) per record.
            vectors: the embeddings, float32 [len(texts), dim].
        """

    @abstractmethod
    def delete(self, ids: np.ndarray) -> Changes:
        """Delete records (text and embedding); ``removed`` holds those that existed.

        Args:
            ids: the record ids to delete.
        """

    @abstractmethod
    def fetch(self, ids: Sequence[int]) -> dict[int, StoredRecord]:
        """The stored records among ``ids`` (removed ones are absent).

        Args:
            ids: record ids.

        Returns:
            Id → record, for the ids still stored.
        """

    @abstractmethod
    def version(self) -> int:
        """The current version (the number of changes made)."""
        ...

    @abstractmethod
    def removals(self) -> int:
        """How many records were ever removed from the index."""
        ...

    @abstractmethod
    def changes(self, since: int) -> Changes:
        """Every change after version ``since`` (all records when ``since`` is 0).

        Args:
            since: a version this host saw.
        """

    @abstractmethod
    def close(self) -> None:
        """Close the store's connection."""
        ...


def removal(version: int, removed: Sequence[int]) -> Changes:
    """The change a deletion makes.

    Args:
        version: the version after the deletion.
        removed: the ids that existed and were deleted.
    """
    empty = np.zeros(0, dtype=np.int64)
    return Changes(version, empty, empty, np.zeros((0, 0), dtype=np.float32), np.asarray(removed, dtype=np.int64))


def changes_from_rows(version: int, rows: Sequence[tuple[int, int, bytes]], removed: Sequence[int]) -> Changes:
    """Changes from rows of (id, unit, embedding bytes); vectors [n, dim] (dim read from the bytes).

    Args:
        version: the version the change brings a copy to.
        rows: the records added, as (id, unit, embedding bytes).
        removed: the ids removed.

    Raises:
        LedgerCorruptError: the embedding bytes do not divide into equal rows.
    """
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    units = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    blob = b"".join(bytes(r[2]) for r in rows)
    vectors = np.frombuffer(blob, dtype=np.float32)
    if rows:
        if vectors.size % len(rows):
            raise LedgerCorruptError("private index holds embeddings of the wrong size")
        vectors = vectors.reshape(len(rows), -1)
    else:
        vectors = vectors.reshape(0, 0)
    return Changes(version, ids, units, vectors, np.asarray(list(removed), dtype=np.int64))
