"""An in-memory ledger store for tests and short-lived processes (one process, thread-safe)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from dp_icl_plugin.accounting.privacy import PrivacyBudget
from dp_icl_plugin.accounting.stores.base import LedgerRow, LedgerStore, LedgerTransaction
from dp_icl_plugin.errors import BudgetMismatchError, LedgerError

__all__ = ["InMemoryStore"]


class _MemoryTransaction(LedgerTransaction):
    def __init__(self, store: InMemoryStore) -> None:
        self._store = store
        self.pending: list[LedgerRow] = []

    def event_counts(self) -> Counter[str]:
        return self._store._counts.copy()

    def append(self, *, timestamp: float, label: str, event_key: str, certified_epsilon: float) -> int:
        row_id = len(self._store._rows) + len(self.pending) + 1
        self.pending.append(LedgerRow(row_id, timestamp, label, event_key, certified_epsilon))
        return row_id


class InMemoryStore(LedgerStore):
    """Keeps the ledger in process memory; lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._budget: PrivacyBudget | None = None
        self._rows: list[LedgerRow] = []
        self._counts: Counter[str] = Counter()

    def initialize(self, budget: PrivacyBudget | None) -> PrivacyBudget:
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
        with self._lock:
            tx = _MemoryTransaction(self)
            yield tx
            for row in tx.pending:
                self._rows.append(row)
                self._counts[row.event_key] += 1

    def rows(self) -> Iterator[LedgerRow]:
        with self._lock:
            return iter(list(self._rows))

    def event_counts(self) -> Counter[str]:
        with self._lock:
            return self._counts.copy()
