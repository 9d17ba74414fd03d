"""The PostgreSQL ledger: the SQLite ledger's guarantees on a real server, shared by processes and threads.

Needs the PostgreSQL binaries and psycopg (``tests/postgres_server.py`` starts a throw-away server, or skips).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from postgres_server import PostgresServer, postgres_database_fixture, postgres_server_fixture  # noqa: F401
from test_ledger_concurrency import race_for_the_budget

from dp_icl_plugin import (
    BudgetExhaustedError,
    BudgetManager,
    BudgetMismatchError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
    PrivacyBudget,
    PureDPEvent,
)
from dp_icl_plugin.accounting.stores import PostgresStore
from dp_icl_plugin.accounting.stores.postgres import mask_dsn

BUDGET = PrivacyBudget(5.0, 1e-6)


def _sql(dsn: str, *statements: str) -> list[Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursors = [conn.execute(s) for s in statements]
        return [cur.fetchall() if cur.description else None for cur in cursors]


def _filled(dsn: str, n: int = 5, *, ledger: str = "default") -> None:
    m = BudgetManager(BUDGET, ledger=PostgresStore(dsn, ledger=ledger))
    for i in range(n):
        m.spend(PureDPEvent(0.01, neighbouring="replace_one"), label=f"component-{i % 3}")
    m.close()


# -- without a server -------------------------------------------------------------------------------
def test_passwords_are_masked() -> None:
    assert mask_dsn("postgresql://app:s3cret@db:5432/ledgers") == "postgresql://app:***@db:5432/ledgers"
    assert mask_dsn("postgresql://db/l?user=app&password=s3cret&sslmode=require") == (
        "postgresql://db/l?user=app&password=***&sslmode=require"
    )
    assert mask_dsn(r"host=db password='it\'s secret' dbname=l") == "host=db password=*** dbname=l"
    assert mask_dsn("host=db dbname=l") == "host=db dbname=l"
    store = PostgresStore("postgresql://app:s3cret@db/ledgers", ledger="team-a")
    assert repr(store) == "PostgresStore('postgresql://app:***@db/ledgers', ledger='team-a')"


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"dp-icl-plugin\[postgres\]"):
        PostgresStore("postgresql://db/ledgers")


def test_unreachable_server_is_a_ledger_error_without_the_password() -> None:
    pytest.importorskip("psycopg")
    dsn = "postgresql://app:s3cret@127.0.0.1:1/ledgers"
    with pytest.raises(LedgerError, match="cannot connect") as info:
        BudgetManager(BUDGET, ledger=PostgresStore(dsn, connect_timeout=2))
    assert "s3cret" not in str(info.value) and "app:***@" in str(info.value)


# -- on a server ------------------------------------------------------------------------------------
def test_create_open_and_persist_across_managers(pg_dsn: str) -> None:
    m = BudgetManager(BUDGET, ledger=pg_dsn)  # a postgresql:// string selects the PostgreSQL store
    m.spend(PureDPEvent(0.5, neighbouring="replace_one"), label="selector")
    m.close()
    again = BudgetManager.open(pg_dsn)
    assert again.budget == BUDGET
    assert again.spent().epsilon == pytest.approx(0.5, rel=1e-4)
    assert again.neighbouring == "replace_one"
    with pytest.raises(BudgetMismatchError, match="add_remove"):  # the relation is part of the stored budget
        BudgetManager(PrivacyBudget(BUDGET.epsilon, BUDGET.delta, neighbouring="add_remove"), ledger=pg_dsn)
    again.spend(PureDPEvent(0.25, neighbouring="replace_one"), label="llm")
    assert [e.label for e in BudgetManager.open(pg_dsn).history()] == ["selector", "llm"]
    meta = dict(_sql(pg_dsn, "SELECT key, value FROM dp_icl_meta")[0])
    assert meta == {"application": "dp-icl-plugin ledger", "schema_version": "2"}
    assert _sql(pg_dsn, "SELECT neighbouring FROM dp_icl_ledgers WHERE name = 'default'")[0] == [("replace_one",)]


def test_spend_refuse_and_never_overspend(pg_dsn: str) -> None:
    m = BudgetManager(PrivacyBudget(1.0, 1e-6), ledger=PostgresStore(pg_dsn))
    for _ in range(3):
        m.spend(PureDPEvent(0.3, neighbouring="replace_one"), label="x")
    with pytest.raises(BudgetExhaustedError):
        m.spend(PureDPEvent(0.3, neighbouring="replace_one"), label="x")
    assert len(m.history()) == 3 and m.spent().epsilon == pytest.approx(0.9, rel=1e-4)
    assert m.would_fit(PureDPEvent(0.1, neighbouring="replace_one")) and not m.would_fit(
        PureDPEvent(0.11, neighbouring="replace_one")
    )


def test_named_ledgers_share_a_database(pg_dsn: str) -> None:
    _filled(pg_dsn, 4, ledger="team-a")
    b = BudgetManager(PrivacyBudget(1.0, 1e-6), ledger=PostgresStore(pg_dsn, ledger="team-b"))
    assert b.spent().epsilon == 0.0
    b.spend(PureDPEvent(0.5, neighbouring="replace_one"), label="b")
    a = BudgetManager(None, ledger=PostgresStore(pg_dsn, ledger="team-a"))
    assert a.budget == BUDGET and len(a.history()) == 4
    assert [e.id for e in a.history()] == sorted(e.id for e in a.history())


def test_a_filtered_release_is_covered_only_by_its_own_ledgers_cover(pg_dsn: str) -> None:
    """Entry ids are shared by the ledgers of one database: a cover in another ledger covers nothing here."""
    from dp_icl_plugin import ConfigurationError
    from dp_icl_plugin.accounting import events as ev

    cover = ev.ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove")
    budget = PrivacyBudget(10.0, 1e-3, neighbouring="add_remove")
    a = BudgetManager(budget, ledger=PostgresStore(pg_dsn, ledger="cover-a"))
    b = BudgetManager(budget, ledger=PostgresStore(pg_dsn, ledger="cover-b"))
    in_a = a.spend(cover, label="knn-filter:index")
    release = ev.FilteredReleaseEvent(
        ev.GaussianEvent(8.0, neighbouring="add_remove"), covered_by=in_a.id, neighbouring="add_remove"
    )
    with pytest.raises(ConfigurationError, match="no entry"):
        b.spend(release, label="knn-vote:index")
    assert b.history() == []
    a.spend(release, label="knn-vote:index")
    with pytest.raises(ConfigurationError, match="another filter"):
        a.spend(release, label="knn-vote:other-index")
    assert a.label_counts() == {"knn-filter:index": 1, "knn-vote:index": 1}


def test_hosts_creating_the_ledger_at_once_agree(pg_dsn: str) -> None:
    def create(i: int) -> PrivacyBudget:
        store = PostgresStore(pg_dsn, ledger=f"l{i % 2}")
        try:
            return store.initialize(BUDGET)
        finally:
            store.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(create, range(6))) == [BUDGET] * 6
    assert _sql(pg_dsn, "SELECT count(*) FROM dp_icl_ledgers")[0] == [(2,)]


def test_missing_ledger_needs_a_budget(pg_dsn: str) -> None:
    with pytest.raises(LedgerError, match="no ledger 'default'"):
        BudgetManager.open(pg_dsn)
    _filled(pg_dsn, 1)
    with pytest.raises(LedgerError, match="no ledger 'other'"):
        BudgetManager(None, ledger=PostgresStore(pg_dsn, ledger="other"))


def test_budget_mismatch_is_refused(pg_dsn: str) -> None:
    _filled(pg_dsn, 2)
    with pytest.raises(BudgetMismatchError, match="refusing"):
        BudgetManager(PrivacyBudget(5.0, 1e-5), ledger=pg_dsn)
    assert BudgetManager.open(pg_dsn).spent().epsilon == pytest.approx(0.02, rel=1e-3)


def test_another_applications_tables_are_refused_untouched(pg_dsn: str) -> None:
    _sql(pg_dsn, "CREATE TABLE dp_icl_ledgers (note text)", "INSERT INTO dp_icl_ledgers VALUES ('theirs')")
    with pytest.raises(LedgerFormatError, match="not a dp-icl ledger"):
        BudgetManager(BUDGET, ledger=pg_dsn)
    assert _sql(pg_dsn, "SELECT note FROM dp_icl_ledgers")[0] == [("theirs",)]
    _sql(
        pg_dsn, "CREATE TABLE dp_icl_meta (key text, value text)", "INSERT INTO dp_icl_meta VALUES ('application', 'x')"
    )
    with pytest.raises(LedgerFormatError, match="another application"):
        BudgetManager(BUDGET, ledger=pg_dsn)


def test_unrelated_tables_are_fine(pg_dsn: str) -> None:
    _sql(pg_dsn, "CREATE TABLE orders (id int)")
    _filled(pg_dsn, 1)
    assert len(BudgetManager.open(pg_dsn).history()) == 1


def test_newer_schema_is_refused(pg_dsn: str) -> None:
    _filled(pg_dsn, 1)
    _sql(pg_dsn, "UPDATE dp_icl_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerFormatError, match="schema version 99"):
        BudgetManager.open(pg_dsn)


@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        ("DELETE FROM dp_icl_entries WHERE id = 2", "inconsistent"),  # someone tries to "refund" a charge
        ("UPDATE dp_icl_ledgers SET epsilon = -1", "no valid budget"),
        ("DROP TABLE dp_icl_entries", "incomplete"),
    ],
)
def test_garbled_ledgers_are_corrupt(pg_dsn: str, tamper: str, match: str) -> None:
    _filled(pg_dsn, 5)
    _sql(pg_dsn, tamper)
    with pytest.raises(LedgerCorruptError, match=match):
        BudgetManager.open(pg_dsn)


def test_a_missing_column_is_refused(pg_dsn: str) -> None:
    _filled(pg_dsn, 1)
    _sql(pg_dsn, "ALTER TABLE dp_icl_entries DROP COLUMN label")
    with pytest.raises(LedgerFormatError):
        BudgetManager.open(pg_dsn)


def test_exception_rolls_back_and_the_row_lock_blocks_other_hosts(pg_dsn: str) -> None:
    owner = PostgresStore(pg_dsn)
    owner.initialize(BUDGET)
    with pytest.raises(RuntimeError), owner.transaction() as tx:
        tx.append(timestamp=time.time(), label="x", event_key='{"kind": "x"}', certified_epsilon=0.1)
        raise RuntimeError("crash before commit")
    assert owner.event_counts() == {} and list(owner.rows()) == []
    other = PostgresStore(pg_dsn, lock_timeout=0.3)  # another host: waits for the row lock, then gives up
    other.initialize(None)
    with owner.transaction():
        started = time.perf_counter()
        with pytest.raises(LedgerError, match="stayed locked"), other.transaction():
            pass
        assert time.perf_counter() - started >= 0.25
    with other.transaction() as tx:  # free again once the owner commits
        assert tx.event_counts() == {}
    owner.close()
    other.close()


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(3))
def test_processes_and_threads_commit_exactly_the_maximum(postgres: PostgresServer, repeat: int) -> None:
    race_for_the_budget(postgres.create_database(), timeout=120)
