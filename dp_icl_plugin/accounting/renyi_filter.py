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
charges (:mod:`dp_icl_plugin.accounting.stores.filter_postgres`): hosts serialise per unit. Each place is a
:class:`~dp_icl_plugin.accounting.stores.filter_base.FilterStore` (memory, SQLite, PostgreSQL); the filter decides,
the store makes the decision's read and write one transaction.

An in-memory filter belongs to the process that made it: after a ``fork()`` (a pre-forking web server,
``multiprocessing``'s ``fork`` start method) every worker would hold its own copy of every unit's spend, so it
refuses use in any other process; a filter cannot be pickled or copied either (a second live filter for the
same units). Several workers share an SQLite file or a PostgreSQL database.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._storage.postgres_connection import is_postgres_url, mask_dsn
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost, admissible
from dp_icl_plugin.accounting.stores.filter_base import FilterStore
from dp_icl_plugin.accounting.stores.filter_memory import SEVERAL_WORKERS_HINT, MemoryFilterStore
from dp_icl_plugin.accounting.stores.filter_postgres import PostgresFilterStore
from dp_icl_plugin.accounting.stores.filter_sqlite import SQLiteFilterStore
from dp_icl_plugin.errors import (
    ConfigurationError,
    ConfigurationTypeError,
    FilterRolledBackError,
    LedgerCorruptError,
)

__all__ = ["SEVERAL_WORKERS_HINT", "RenyiFilter"]


class RenyiFilter:
    """Per-unit RDP spend at fixed orders with a per-unit (ε, δ) budget.

    Args:
        budget: each unit's lifetime budget. May be omitted when opening an existing file.
        path: an SQLite file (created when missing and a budget is given), a ``postgresql://`` URL (the rows
            of this ``owner`` in that database, shared by every host), or ``None`` for memory only.
        owner: an identifier of what the units belong to (e.g. the private index's id); a file made for
            another owner is refused with :class:`FilterMismatchError`.
        busy_timeout: seconds to wait for another process's charge.

    Raises:
        ConfigurationError: a bad argument, or an in-memory filter without a budget.
        LedgerError: the file or database cannot be used (:class:`FilterMismatchError` when it belongs to another
            owner or budget).
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
            raise ConfigurationTypeError("budget must be an IndividualBudget")
        if not isinstance(owner, str):
            raise ConfigurationTypeError("owner must be a string")
        self._place(path, owner, busy_timeout)
        self.budget = self._store.open(budget)

    def _place(self, path: str | os.PathLike[str] | None, owner: str, busy_timeout: float) -> None:
        """Set the owner and the store for ``path`` (nothing is read or written yet)."""
        self.owner = owner
        self._busy_timeout = busy_timeout
        self.url: str | None = None  # the database, password masked, for a filter on PostgreSQL
        self.path: Path | None = None  # the file, for a filter in SQLite
        self._store: FilterStore
        if is_postgres_url(path):
            self.url = mask_dsn(str(path))
            self._store = PostgresFilterStore(str(path), owner=owner, decode_row=self._row, lock_timeout=busy_timeout)
        elif path is not None:
            self.path = Path(path)
            self._store = SQLiteFilterStore(path, owner=owner, decode_row=self._row, busy_timeout=busy_timeout)
        else:
            self._store = MemoryFilterStore()
        self._lock = self._store.lock

    def __repr__(self) -> str:
        where = self.url or ("memory" if self.path is None else str(self.path))
        return f"RenyiFilter(epsilon={self.budget.epsilon}, delta={self.budget.delta}, at={where!r})"

    def __reduce__(self):
        raise TypeError(
            "a privacy filter cannot be pickled or copied (a copy would be a second live filter for the "
            "same units); open its file or database again instead"
        )

    # -- charging ---------------------------------------------------------------------------------
    def charge(self, units: np.ndarray, cost: ReleaseCost | list[ReleaseCost], *, release_tag: str = "") -> np.ndarray:
        """Admit the units that can pay ``cost`` and charge them, atomically: :meth:`charge_release` without its
        release number."""
        return self.charge_release(units, cost, release_tag=release_tag)[0]

    def charge_release(
        self, units: np.ndarray, cost: ReleaseCost | list[ReleaseCost], *, release_tag: str = ""
    ) -> tuple[np.ndarray, int]:
        """Admit the units that can pay ``cost`` and charge them, atomically, counting one release.

        Args:
            units: distinct unit ids, shape (n,).
            cost: one cost for every unit, or one per unit (e.g. a person with several records in the
                release pays for all of them).
            release_tag: what the release is recorded under elsewhere (a ledger cover: ``PrivateKNN`` passes its
                own), counted apart so that :meth:`check_releases` compares like with like.

        Returns:
            Boolean mask over ``units``: True where the unit was admitted (and charged; units refused are not
            charged and must not take part in the release), and the release's number under ``release_tag`` (its
            count after this release: record it with the release, :meth:`check_releases`).

        Every call counts one release under ``release_tag`` (:meth:`releases`), in the same transaction, whether or
        not any unit is admitted (a release over no unit included): call it once per release.

        Raises:
            ConfigurationError: bad unit ids or costs, or an in-memory filter used after a move or in another
                process.
            LedgerError: the file or database failed.
        """
        ids = self._units(units)
        rdp_cost, delta_cost = self._costs(cost, len(ids))

        def admit(read, write) -> np.ndarray:
            spent, spent_delta = read(ids)
            ok = admissible(self.budget, spent, spent_delta, rdp_cost, delta_cost)
            if ok.any():
                write(ids[ok], (spent + rdp_cost)[ok], (spent_delta + delta_cost)[ok])
            return ok

        if not isinstance(release_tag, str):
            raise ConfigurationError("release_tag must be a string")
        found = self._store.atomically(len(self.budget.orders), admit, count_release=release_tag)
        mask, number = found  # with count_release: (result, count)
        return mask, number

    # -- reading ----------------------------------------------------------------------------------
    def spent(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Accumulated RDP (n, n_orders) and approximate δ (n,) of ``units`` (zeros for unseen units).

        Args:
            units: unit ids, shape (n,).

        Raises:
            ConfigurationError: bad unit ids, or an in-memory filter used after a move or in another process.
        """
        ids = self._units(units, distinct=False)
        return self._store.atomically(len(self.budget.orders), lambda read, _: read(ids), write=False)

    def all_spent(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(unit ids, RDP spend, approximate δ spend) of every unit charged at least once.

        Raises:
            ConfigurationError: an in-memory filter used after a move or in another process.
        """
        return self._decode_rows(self._store.all_rows())

    def epsilon_spent(self, units: np.ndarray) -> np.ndarray:
        """The best (ε, δ) guarantee each unit has lost so far, as ε at the budget's δ (0 when unused).

        Args:
            units: unit ids, shape (n,).

        Raises:
            ConfigurationError: bad unit ids, or an in-memory filter used after a move or in another process.
        """
        spent, _ = self.spent(units)
        b = self.budget
        a = np.asarray(b.orders)
        delta_k = b.conversion_delta / len(a)
        eps = spent + np.log1p(-1.0 / a) - (np.log(delta_k) + np.log(a)) / (a - 1)
        return np.where(spent.sum(axis=1) > 0, np.maximum(eps.min(axis=1), 0.0), 0.0)

    def releases(self, release_tag: str = "") -> int:
        """How many releases were charged through this filter under ``release_tag`` (:meth:`charge` calls).

        Raises:
            ConfigurationError: an in-memory filter used after a move or in another process.
            LedgerError: the file or database failed.
        """
        return self._store.release_counts()[0].get(release_tag, 0)

    def check_releases(self, recorded: int, *, release_tag: str, ledger: str = "the ledger") -> None:
        """Refuse a filter rolled back: one that counts fewer releases under ``release_tag`` than ``recorded``, the
        releases a ledger holds under the cover that tag names.

        Each release is counted here, under its cover's tag, before the ledger records it, and a count only grows,
        so a live filter always counts at least as many; releases recorded elsewhere (another ledger) count under
        other tags. Fewer means the spend was put back (a backup of the file or a dump of the database restored in
        place): its units would get back budget they spent under the same cover. A filter written before releases
        were counted cannot tell: it is refused too, until :meth:`adopt_releases` says it was never restored.

        Args:
            recorded: the filtered releases a ledger records under the cover.
            release_tag: the cover's tag (the one its releases were charged under).
            ledger: the ledger, for the message.

        Raises:
            FilterRolledBackError: the filter counts fewer releases than ``recorded``.
            ConfigurationError: ``recorded`` is not a non-negative integer.
            LedgerError: the file or database failed.
        """
        recorded = check.int_at_least("recorded", recorded, 0)
        counts, counting = self._store.release_counts()
        counted = counts.get(release_tag, 0)
        if counted >= recorded:
            return
        where = self.url or self.path or "memory"
        if not counting:
            raise FilterRolledBackError(
                f"the privacy filter of index {self.owner} at {where} was written before releases were counted: it "
                f"counts {counted} of the {recorded} releases {ledger} records under its cover, and cannot tell "
                "whether it was restored from a backup. If it never was, say so once: "
                f"index.filter.adopt_releases({recorded}, release_tag={release_tag!r}); otherwise build a new "
                "index, which the ledger covers anew"
            )
        raise FilterRolledBackError(
            f"the privacy filter of index {self.owner} at {where} counts {counted} releases but {ledger} records "
            f"{recorded} under its cover: it was restored from a backup or rolled back, and its records would get "
            "back budget they spent. Refusing to use it. Restore the filter as it was last written (with every "
            "later release), or build a new index over the records, which the ledger covers anew"
        )

    def adopt_releases(self, recorded: int, *, release_tag: str) -> None:
        """Say that a filter written before releases were counted was never restored from a backup: take
        ``recorded`` as its count under ``release_tag`` and count from here on (the message of
        :meth:`check_releases` gives the call). Nothing can check this statement: make it only for a filter whose
        file or rows were never put back.

        Args:
            recorded: the releases the ledger records under the cover.
            release_tag: the cover's tag.

        Raises:
            ConfigurationError: ``recorded`` is not a non-negative integer.
            LedgerError: the file or database failed.
        """
        recorded = check.int_at_least("recorded", recorded, 0)
        self._store.adopt_releases(release_tag, recorded)

    def copy_to(self, path: str | os.PathLike[str], *, owner: str) -> RenyiFilter:
        """A new filter at ``path`` (a file, or a ``postgresql://`` URL) for another ``owner``, starting from this
        filter's budget and spend.

        Two live filters for one owner would let each unit spend its budget in each (the ledger's cover is
        looked up by owner), so the copy must belong to another owner (which the ledger covers on its own);
        :meth:`move_to` writes an in-memory filter to a file under the same owner. The copy is created
        exclusively, its budget and every unit's spend in one transaction: an existing file, or an owner that
        already has a filter in the database, is refused and left as it was, and a copy that fails leaves nothing.

        Args:
            path: the new file (must not exist), or a database where ``owner`` has no filter yet.
            owner: the copy's owner, not this filter's.

        Raises:
            ConfigurationError: the same owner, ``path`` exists, or ``owner`` has a filter in that database.
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

        Raises:
            ConfigurationError: the filter is not in memory, is no longer usable, or ``path`` exists.
        """
        if is_postgres_url(path):
            raise ConfigurationError(
                f"move_to writes a filter file, not {mask_dsn(str(path))}: open a filter on PostgreSQL with a budget "
                "instead"
            )
        store = self._store
        if not isinstance(store, MemoryFilterStore):
            raise ConfigurationError(
                f"this filter already lives in {self.url or self.path}; only an in-memory filter is moved"
            )
        store.check_usable()
        with self._lock:  # no charge between the copy and the retirement
            store.check_usable()
            moved = self._write_copy(path, self.owner, releases=store.release_counts()[0])
            rows = store.retire(
                f"this in-memory filter was saved to {path}: use the filter there (the index's save() returned it)"
            )
            if publish is not None:
                moved.close()  # complete on disk (its log checkpointed) before it is published
                try:
                    publish()
                except BaseException:
                    if published is not None and not published():
                        store.reinstate(rows)  # nothing was published: still the only one
                    raise
        return moved

    def _write_copy(
        self, path: str | os.PathLike[str], owner: str, *, releases: dict[str, int] | None = None
    ) -> RenyiFilter:
        """A new filter at ``path`` with this one's budget and spend, created exclusively and whole (the store's
        ``create``: one transaction, or a complete file linked into place): never merged into a live filter,
        never left half-written (a budget without its units' spend would be a second filter at zero spend)."""
        if not is_postgres_url(path) and Path(path).exists():  # a fast refusal; create() refuses it atomically
            raise ConfigurationError(f"{path} exists; a copy is written to a new filter file")
        units, spent, spent_delta = self.all_spent()
        copy = RenyiFilter.__new__(RenyiFilter)
        copy._place(path, owner, self._busy_timeout)
        try:
            copy.budget = copy._store.create(self.budget, units, spent, spent_delta, releases=releases)
        except BaseException:
            copy.close()
            raise
        return copy

    def close(self) -> None:
        """Close the file's or database's connection (an in-memory filter has none)."""
        self._store.close()

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
