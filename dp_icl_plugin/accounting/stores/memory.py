"""An in-memory ledger store for tests and short-lived processes (one process, thread-safe).

**One process.** The ledger lives in the memory of the process that made it. A ``fork()`` (a pre-forking web
server, ``multiprocessing``'s ``fork`` start method) gives every child a private copy, and each copy would
admit the whole budget again: three workers could each spend what only one may. So the store remembers the
process that made it and refuses every use elsewhere (reading the spend included) with a
:class:`~dp_icl_plugin.errors.LedgerError` that names the fix: a ledger shared by several worker processes is
an SQLite file or a PostgreSQL database. It cannot be pickled or copied either (a copy would be a second
live ledger for the same records).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from dp_icl_plugin.accounting.privacy import PrivacyBudget
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.accounting.stores.base import LedgerRow, LedgerStore, LedgerTransaction
from dp_icl_plugin.errors import BudgetMismatchError, LedgerError

__all__ = ["InMemoryStore"]

_SHARED_HINT = (
    "to share one budget between worker processes, give BudgetManager an SQLite ledger file "
    "(ledger='budget.db') or a PostgreSQL URL (ledger='postgresql://...')"
)


class _MemoryTransaction(LedgerTransaction):
    def __init__(self, store: InMemoryStore) -> None:
        self._store = store
        self.pending: list[LedgerRow] = []

    def event_counts(self) -> Counter[str]:
        return self._store._counts.copy()

    def entry(self, entry_id: int) -> LedgerRow | None:
        rows = self._store._rows  # committed only: not this transaction's pending rows
        return rows[entry_id - 1] if 1 <= entry_id <= len(rows) else None

    def append(self, *, timestamp: float, label: str, event_key: str, certified_epsilon: float) -> int:
        row_id = len(self._store._rows) + len(self.pending) + 1
        self.pending.append(LedgerRow(row_id, timestamp, label, event_key, certified_epsilon))
        return row_id


class InMemoryStore(LedgerStore):
    """Keeps the ledger in process memory; lost when the process ends, refused in any other process."""

    def __init__(self) -> None:
        self._process = process_mark()
        self._lock = threading.RLock()
        self._budget: PrivacyBudget | None = None
        self._rows: list[LedgerRow] = []
        self._counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return "InMemoryStore()"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"an in-memory ledger cannot be pickled or copied (it would be a second live ledger); {_SHARED_HINT}"
        )

    def _check_process(self) -> None:
        # Before the lock: a lock held by another thread at fork() time stays held forever in the child.
        if self._process != process_mark():
            raise LedgerError(
                f"this in-memory ledger was made in process {self._process[0]} and cannot be used in another "
                f"(after a fork, every worker's copy would spend the whole budget again); {_SHARED_HINT}"
            )

    def initialize(self, budget: PrivacyBudget | None) -> PrivacyBudget:
        """Create the ledger with ``budget`` or open the existing one and check that ``budget`` matches.

        Args:
            budget: the budget, or None to open an existing ledger.

        Returns:
            The ledger's budget.

        Raises:
            BudgetMismatchError: the ledger exists with another budget.
            LedgerError: no budget was given for a new ledger, or this is another process.
        """
        self._check_process()
        with self._lock:
            if self._budget is None:
                if budget is None:
                    raise LedgerError("an empty in-memory ledger needs a budget")
                self._budget = budget
            elif budget is not None and budget != self._budget:
                raise BudgetMismatchError(f"ledger budget is {self._budget}, not {budget}")
            return self._budget

    @contextmanager
    def transaction(self) -> Iterator[LedgerTransaction]:
        """An exclusive check-and-commit section (commit on exit, roll back on exception)."""
        self._check_process()
        with self._lock:
            tx = _MemoryTransaction(self)
            yield tx
            for row in tx.pending:
                self._rows.append(row)
                self._counts[row.event_key] += 1

    def rows(self) -> Iterator[LedgerRow]:
        """All committed charges in commit order."""
        self._check_process()
        with self._lock:
            return iter(list(self._rows))

    def event_counts(self) -> Counter[str]:
        """Committed charges per distinct event key (a consistent snapshot)."""
        self._check_process()
        with self._lock:
            return self._counts.copy()
