"""Where an individual Rényi filter keeps each unit's spend: the :class:`FilterStore` interface beside the ledger's
:class:`~dp_icl_plugin.accounting.stores.base.LedgerStore`.

A store keeps one row per charged unit: its accumulated RDP at the filter's orders (encoded as little-endian
float64) and its spent approximate δ. The filter (:class:`~dp_icl_plugin.accounting.renyi_filter.RenyiFilter`) owns
the privacy decision, which units a release admits; a store only makes its read-decide-write atomic: in memory
(:mod:`~dp_icl_plugin.accounting.stores.filter_memory`), in an SQLite file shared by the processes of one host
(:mod:`~dp_icl_plugin.accounting.stores.filter_sqlite`) or in PostgreSQL shared by hosts
(:mod:`~dp_icl_plugin.accounting.stores.filter_postgres`).

A store also counts the releases charged through it, per *release tag* (the ledger cover a release is recorded
under), in the transaction of each charge (:meth:`FilterStore.release_counts`). A count only grows, and every
release a ledger records under a cover was counted under that cover's tag first, so a count below the ledger's is
a filter rolled back (a backup restored in place): its units would get spent budget back. Counting per cover keeps
releases recorded elsewhere (another ledger, a ledger write that failed) from hiding a rollback. The filter checks
it when it is covered (:meth:`~dp_icl_plugin.accounting.renyi_filter.RenyiFilter.check_releases`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from dp_icl_plugin.accounting.individual_filter import IndividualBudget

__all__ = ["FilterStore", "Read", "Write", "encode_spend"]

T = TypeVar("T")
Read = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``read(ids) -> (spent (n, orders), spent_delta (n,))``: zeros for a unit never charged."""
Write = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""``write(ids, spent, spent_delta)``: the units' new totals."""


def encode_spend(row: np.ndarray) -> bytes:
    """A unit's RDP spend as stored: little-endian float64 at the filter's orders."""
    return np.asarray(row).astype("<f8").tobytes()


@runtime_checkable
class FilterStore(Protocol):
    """The spend rows of one filter; see the module docstring."""

    @property
    def lock(self) -> AbstractContextManager[object]:
        """Held around every transaction of this process (a re-entrant lock)."""
        ...

    def open(self, budget: IndividualBudget | None) -> IndividualBudget:
        """Create the filter with ``budget``, or read the stored one (checked against ``budget`` when given).

        Args:
            budget: the filter's budget, or None to read a stored one.

        Returns:
            The filter's budget.

        Raises:
            ConfigurationError: an in-memory store without a budget.
            LedgerError: nothing stored and no budget given, or the store cannot be used
                (:class:`~dp_icl_plugin.errors.FilterMismatchError` when it belongs to another owner or budget).
        """
        ...

    def create(
        self,
        budget: IndividualBudget,
        units: np.ndarray,
        spent: np.ndarray,
        spent_delta: np.ndarray,
        *,
        releases: dict[str, int] | None = None,
    ) -> IndividualBudget:
        """Create the filter with ``budget`` and these units' spend in one transaction, exclusively: refused when
        the file or the owner exists already (never merged into a live filter, never left half-written).

        Args:
            budget: the filter's budget.
            units: unit ids, shape (n,).
            spent: their RDP spend, shape (n, orders).
            spent_delta: their approximate δ spend, shape (n,).
            releases: the release counts to start from, per tag (a moved filter's; none for a copy under a new
                owner). The new filter counts from its creation.

        Returns:
            The filter's budget.

        Raises:
            ConfigurationError: the file or the owner exists already.
            LedgerError: the store cannot be written (nothing is left behind).
        """
        ...

    def atomically(
        self, orders: int, work: Callable[[Read, Write], T], *, write: bool = True, count_release: str | None = None
    ) -> Any:  # T, or (T, count) with count_release
        """``work(read, write)`` as one transaction: nothing else reads or changes the rows it reads before it
        returns.

        Args:
            orders: the number of Rényi orders in a spend row.
            work: the transaction's body.
            write: whether ``work`` may write.
            count_release: a release tag: add one to its count in the same transaction (a write transaction), and
                return ``(result, count)``, the count after this release (its release number under the tag).

        Returns:
            What ``work`` returns (with the release number when ``count_release`` is given).

        Raises:
            ConfigurationError: the store may no longer be used (an in-memory one after a move or a fork).
            LedgerError: the file or database failed.
        """
        ...

    def release_counts(self) -> tuple[dict[str, int], bool]:
        """The releases charged through this filter per release tag, and whether it has counted every release
        since it was made (False for a filter written before releases were counted, until
        :meth:`adopt_releases`).

        Raises:
            ConfigurationError: the store may no longer be used.
            LedgerError: the file or database failed.
        """
        ...

    def adopt_releases(self, tag: str, count: int) -> None:
        """Take ``count`` as ``tag``'s count (when larger) and mark the filter as counting: an operator's statement
        that a filter written before releases were counted was never restored from a backup.

        Args:
            tag: the release tag.
            count: the releases recorded under it elsewhere (the ledger's).

        Raises:
            ConfigurationError: the store may no longer be used.
            LedgerError: the file or database failed.
        """
        ...

    def all_rows(self) -> list[tuple[int, bytes, float]]:
        """Every charged unit's row, by unit: ``(unit, encoded RDP spend, spent δ)``.

        Raises:
            ConfigurationError: the store may no longer be used.
            LedgerError: the file or database failed.
        """
        ...

    def close(self) -> None:
        """Close this process's connection (an in-memory store has none)."""
        ...
