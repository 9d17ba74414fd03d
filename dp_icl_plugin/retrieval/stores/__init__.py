"""Where a private index keeps its records: one SQLite file per index directory (or memory), or a PostgreSQL
database shared by every host that serves the index (see :class:`~.base.RecordStore`)."""

from dp_icl_plugin.retrieval.stores.base import Changes, IndexMeta, RecordStore, StoredRecord

__all__ = ["Changes", "IndexMeta", "RecordStore", "StoredRecord"]
