"""An index an app reopens at every start, so that its records' filter is covered on the ledger once.

A ledger that outlives the process (an SQLite file, PostgreSQL) needs private state that does too. The ledger's
cover of an index (:meth:`~dp_icl_plugin.retrieval.PrivateKNN.cover_event`) pays for every record's whole
filter budget; an index built in memory again at the next start is a new index (new id, fresh filter), whose
cover is charged again and whose records could spend their budget a second time. :func:`kept_index` opens the
index kept at a location, or builds it there once, all or nothing.

**What a reopened index must hold.** The records the app passes now. A per-record index may hold fewer: the
records it lacks are added (each with a fresh filter of the index's budget; a record's spend is its own, so
adding one later is as if it had been there unused). Anything else is refused before any charge: records the
index holds that the app no longer passes (they would still be searched), other groups of a person's records,
another per-record budget, another embedder. The check reads the private records on this host only and
releases nothing; its error says what differs in counts, never which record. Looking and adding run under one
lock (a file beside the directory, or a PostgreSQL advisory lock), so workers starting together never both add a
record they both found missing.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from dp_icl_plugin._storage.exclusive import file_locked, postgres_locked
from dp_icl_plugin._storage.postgres_connection import is_postgres_url
from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError, LedgerError, NothingStoredError
from dp_icl_plugin.retrieval.index import RECORDS_FILE, PrivateIndex

__all__ = ["DEFAULT_INDEX_NAME", "IndexPlace", "index_beside", "kept_index"]

DEFAULT_INDEX_NAME = "knn-experts"
_SUFFIX = ".indexes"

Location = str | os.PathLike[str]
_Row = tuple[str, str | None, str | None]  # text, label, answer


@dataclass(frozen=True)
class IndexPlace:
    """Where an index is kept: a directory or a ``postgresql://`` URL, and its name in that database.

    Attributes:
        location: the directory or URL.
        name: the index's name in a PostgreSQL database (unused for a directory).
    """

    location: Location
    name: str = DEFAULT_INDEX_NAME

    def __repr__(self) -> str:  # the URL may hold a password
        return f"IndexPlace({_where(self.location)!r}, name={self.name!r})"


def index_beside(budget: BudgetManager, name: str = DEFAULT_INDEX_NAME) -> IndexPlace | None:
    """Where the index ``name`` is kept beside the app's ledger.

    Args:
        budget: the app's ledger.
        name: the index's name (one per set of records an app covers on this ledger).

    Returns:
        ``<ledger file>.indexes/<name>`` beside an SQLite ledger; the index ``name`` in a PostgreSQL ledger's
        database (``<ledger name>/<name>`` for a ledger other than ``"default"``, so that apps with ledgers of
        their own in one database never share an index); None (memory) beside an in-memory ledger, which is gone
        at a restart too.

    Raises:
        ConfigurationError: ``name`` is not a plain name, or the ledger is a custom store that does not say
            where it lives (give the index's location yourself).
    """
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ConfigurationError(f"index name must be a plain file name, got {name!r}")
    where = budget.location
    if where is None:
        if not budget.in_memory:
            raise ConfigurationError(
                "this ledger's store does not say where it lives: give the index's location (a directory or a "
                "postgresql:// URL) so that a restart reopens it instead of charging its cover again"
            )
        return None
    if is_postgres_url(where):
        ledger = budget.ledger_name
        return IndexPlace(where, name if ledger in (None, "default") else f"{ledger}/{name}")
    ledger_file = Path(where)
    return IndexPlace(ledger_file.with_name(ledger_file.name + _SUFFIX) / name, name)


def kept_index(
    location: IndexPlace | Location | None,
    *,
    budget: IndividualBudget,
    texts: Sequence[str],
    labels: Sequence[str | None] | None = None,
    answers: Sequence[str | None] | None = None,
    user_ids: Sequence[str | None] | None = None,
    embedder: object | None = None,
    group_by_user: bool = False,
    name: str = DEFAULT_INDEX_NAME,
) -> PrivateIndex:
    """The index of these records kept at ``location``: reopened when it is there (its spend and its ledger
    cover go on), else built there (a directory: complete or not at all; PostgreSQL: the index ``name``).

    Args:
        location: a directory, a ``postgresql://`` URL, an :class:`IndexPlace` (:func:`index_beside`; its name
            is the index's), or None for a new in-memory index (gone at exit).
        budget: every unit's lifetime budget; a reopened index must have been built with it.
        texts: the records' texts, as :meth:`PrivateIndex.add` takes them.
        labels: a label per record, or None.
        answers: an answer per record, or None.
        user_ids: a user id per record (every one when grouped by user), or None.
        embedder: as :class:`PrivateIndex`; a reopened index must have been built with the same.
        group_by_user: as :class:`PrivateIndex`.
        name: the index's name in a PostgreSQL database.

    Returns:
        The index, holding exactly these records.

    Raises:
        ConfigurationError: the index kept there holds other records, another budget, grouping or embedder
            (nothing is charged; the message names the fix), or a bad record.
        LedgerError: the location cannot be read or written.
    """
    if not isinstance(budget, IndividualBudget):
        raise ConfigurationTypeError("budget must be an IndividualBudget")
    if isinstance(location, IndexPlace):
        name = location.name
        location = location.location
    records = _Records(texts, labels, answers, user_ids)
    if location is None:
        return _built(None, budget, records, embedder, group_by_user, name)
    # one process at a time from looking to adding: two workers starting together would otherwise both find a
    # record missing and both add it, and a record indexed twice has two filters (twice its budget)
    with _exclusive(location, name):
        return _kept(location, budget, records, embedder, group_by_user, name)


@dataclass(frozen=True)
class _Records:
    """The records an app passes, as :meth:`PrivateIndex.add` takes them."""

    texts: Sequence[str]
    labels: Sequence[str | None] | None
    answers: Sequence[str | None] | None
    user_ids: Sequence[str | None] | None

    def add_to(self, index: PrivateIndex, positions: Sequence[int] | None = None) -> None:
        """Add these records (or those at ``positions``: the missing ones of a kept per-record index, which holds
        no person grouping, so their ``user_ids`` are not passed) to ``index``."""
        if positions is None:
            index.add(self.texts, labels=self.labels, answers=self.answers, user_ids=self.user_ids)
            return
        index.add(
            [self.texts[i] for i in positions],
            labels=None if self.labels is None else [self.labels[i] for i in positions],
            answers=None if self.answers is None else [self.answers[i] for i in positions],
        )


def _exclusive(location: Location, name: str) -> AbstractContextManager[None]:
    if is_postgres_url(location):
        return postgres_locked(str(location), f"dp-icl kept index {name}")
    root = Path(location).resolve()  # one lock whatever path (a symlink, a relative one) names the directory
    return file_locked(root.with_name(f".{root.name}.lock"))


def _kept(
    location: Location,
    budget: IndividualBudget,
    records: _Records,
    embedder: object | None,
    group_by_user: bool,
    name: str,
) -> PrivateIndex:
    index = _opened(location, embedder, name)
    if index is None:
        try:
            return _built(location, budget, records, embedder, group_by_user, name)
        except (ConfigurationError, LedgerError):
            index = _opened(location, embedder, name)  # another process built it meanwhile: use that one
            if index is None:
                raise
    _check_kept(index, location, budget, group_by_user)
    missing = _missing(index, location, records)
    if missing:
        records.add_to(index, missing)
    return index


def _opened(location: Location, embedder: object | None, name: str) -> PrivateIndex | None:
    """The index at ``location``, or None when none is there."""
    if is_postgres_url(location):
        try:
            return PrivateIndex.open(location, embedder=embedder, name=name)
        except NothingStoredError:
            return None
    if not (Path(location) / RECORDS_FILE).is_file():
        return None
    return PrivateIndex.open(location, embedder=embedder)


def _built(
    location: Location | None,
    budget: IndividualBudget,
    records: _Records,
    embedder: object | None,
    group_by_user: bool,
    name: str,
) -> PrivateIndex:
    if location is not None and is_postgres_url(location):
        index = PrivateIndex(budget=budget, embedder=embedder, group_by_user=group_by_user, path=location, name=name)
        records.add_to(index)
        return index
    index = PrivateIndex(budget=budget, embedder=embedder, group_by_user=group_by_user)
    records.add_to(index)
    return index if location is None else index.save(location)  # all or nothing: a crash leaves no index there


def _check_kept(index: PrivateIndex, location: Location, budget: IndividualBudget, group_by_user: bool) -> None:
    where = _where(location)
    if index.group_by_user != group_by_user:
        grouped = "grouped by person" if index.group_by_user else "per record"
        raise ConfigurationError(f"the index kept at {where} is {grouped}; {_FIX}")
    if index.filter.budget != budget:
        kept = index.filter.budget
        raise ConfigurationError(
            f"the index kept at {where} gives each unit (epsilon={kept.epsilon}, delta={kept.delta}), not "
            f"(epsilon={budget.epsilon}, delta={budget.delta}): its records' spend is measured against the budget "
            f"it was built with; ask for that budget again, or {_FIX_TAIL}"
        )


_FIX_TAIL = (
    "keep a new index under another name (index_name=..., or another location): a new index is covered on the "
    "ledger anew, for every record it holds"
)
_FIX = f"ask for what it was built with, or {_FIX_TAIL}"


def _missing(index: PrivateIndex, location: Location, records: _Records) -> list[int]:
    """The positions of the given records the kept index lacks (per record only: grouped indexes must match
    exactly). Refuses an index that holds a record not given."""
    texts, labels, answers, user_ids = records.texts, records.labels, records.answers, records.user_ids
    n = len(texts)
    given: list[_Row] = [
        (texts[i], None if labels is None else labels[i], None if answers is None else answers[i]) for i in range(n)
    ]
    stored, units = index.all_records()
    kept_rows = [(r.text, r.label, r.answer) for r in stored]
    where = _where(location)
    if index.group_by_user:
        if user_ids is None or len(user_ids) != n:
            raise ConfigurationError("an index grouped by user needs a user id for every record")
        if _groups(kept_rows, [int(u) for u in units.tolist()]) != _groups(given, list(user_ids)):
            raise ConfigurationError(
                f"the index kept at {where} holds other records, or groups them into other people, than those "
                f"given; a person-grouped index is reused only for the same records: {_FIX_TAIL}"
            )
        return []
    kept = Counter(kept_rows)
    if kept - Counter(given):  # counts stay out of the message: how many records an index holds is private
        raise ConfigurationError(
            f"the index kept at {where} holds records that are not among those given: they would still be "
            f"searched, so it is not reused; {_FIX_TAIL}"
        )
    missing: list[int] = []
    for i, row in enumerate(given):
        if kept[row] > 0:
            kept[row] -= 1
        else:
            missing.append(i)
    if missing and index.ever_removed():
        # a per-record index keys a record's spend by its row: a removed record added again would be a new row
        # with a fresh budget, and nothing here can tell a new record from one that came back
        raise ConfigurationError(
            f"records are given that the index kept at {where} does not hold, and records were removed from it: "
            "one of them could be a removed record coming back, which would get a fresh budget. Add records you "
            f"know to be new yourself (PrivateIndex.open(...).add(...)), or {_FIX_TAIL}"
        )
    return missing


def _groups(rows: Sequence[_Row], owners: Sequence[object]) -> Counter[tuple[_Row, ...]]:
    """The records as a multiset of people, each the sorted tuple of its records (owners' names dropped)."""
    by_owner: dict[object, list[_Row]] = {}
    for row, owner in zip(rows, owners, strict=True):
        by_owner.setdefault(owner, []).append(row)
    return Counter(tuple(sorted(group, key=repr)) for group in by_owner.values())


def _where(location: Location) -> str:
    if is_postgres_url(location):
        return "the PostgreSQL database"  # never the URL: it may hold a password
    return str(location)
