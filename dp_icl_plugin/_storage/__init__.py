"""Private storage plumbing shared by the ledger stores (:mod:`dp_icl_plugin.accounting.stores`) and the record
stores (:mod:`dp_icl_plugin.retrieval.stores`): PostgreSQL connections and SQLite files."""
