"""Ledger stores: where the budget manager keeps its charges (see ``base.LedgerStore``); filter stores: where an
individual Rényi filter keeps each unit's spend (see ``filter_base.FilterStore``)."""

from dp_icl_plugin.accounting.stores.base import LedgerRow, LedgerStore, LedgerTransaction
from dp_icl_plugin.accounting.stores.filter_base import FilterStore
from dp_icl_plugin.accounting.stores.filter_memory import MemoryFilterStore
from dp_icl_plugin.accounting.stores.filter_postgres import PostgresFilterStore
from dp_icl_plugin.accounting.stores.filter_sqlite import SQLiteFilterStore
from dp_icl_plugin.accounting.stores.memory import InMemoryStore
from dp_icl_plugin.accounting.stores.postgres import PostgresStore
from dp_icl_plugin.accounting.stores.sqlite import SQLiteStore

__all__ = [
    "FilterStore",
    "InMemoryStore",
    "LedgerRow",
    "LedgerStore",
    "LedgerTransaction",
    "MemoryFilterStore",
    "PostgresFilterStore",
    "PostgresStore",
    "SQLiteFilterStore",
    "SQLiteStore",
]
