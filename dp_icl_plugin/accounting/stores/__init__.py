"""Ledger stores: where the budget manager keeps its charges (see ``base.LedgerStore``)."""

from dp_icl_plugin.accounting.stores.base import LedgerRow, LedgerStore, LedgerTransaction
from dp_icl_plugin.accounting.stores.memory import InMemoryStore
from dp_icl_plugin.accounting.stores.postgres import PostgresStore
from dp_icl_plugin.accounting.stores.sqlite import SQLiteStore

__all__ = ["InMemoryStore", "LedgerRow", "LedgerStore", "LedgerTransaction", "PostgresStore", "SQLiteStore"]
