"""A filter's spend never goes back (issue 40, items 1 and 2).

1. A copy onto a live owner: ``copy_to("<postgresql URL>", owner=X)`` with X a live index's owner was accepted (the
   "path must not exist" check is a filesystem check) and its spend rows replaced X's: a unit exhausted after its
   releases was admitted again. A copy is now created exclusively, owner and rows in one transaction, and a
   failed one leaves nothing; an SQLite file is linked into place (no check-then-act race).
2. A filter restored from a backup: the records joined their releases again under the same cover. The filter now
   counts its releases, and a retriever covering it compares that count with the ledger's releases under the cover.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from postgres_server import PostgresServer, postgres_database_fixture, postgres_server_fixture  # noqa: F401

from dp_icl_plugin import BudgetManager, GaussianEvent, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost, RenyiFilter
from dp_icl_plugin.errors import ConfigurationError, FilterRolledBackError
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from tests.test_knn_retriever import LABELS, BagEmbedder, records

BUDGET = IndividualBudget(epsilon=2.0, delta=1e-5, approximate_delta=0.0)
USES = 2


def cost(sigma: float = 6.0) -> ReleaseCost:
    return ReleaseCost.of(GaussianEvent(sigma, neighbouring="add_remove"), BUDGET.orders)


def exhaust(f: RenyiFilter, unit: int) -> int:
    n = 0
    while f.charge(np.array([unit]), cost())[0]:
        n += 1
    return n


# -- 1. copies ----------------------------------------------------------------------------------------------


def test_a_copy_onto_a_live_postgres_owner_is_refused_and_its_spend_kept(pg_dsn: str) -> None:
    """Before: the copy was accepted and wrote zero spend over the live owner's rows (a unit exhausted after 14
    releases was admitted 13 more times)."""
    pytest.importorskip("psycopg")
    live = RenyiFilter(BUDGET, path=pg_dsn, owner="live")
    fits = exhaust(live, 0)
    assert fits >= 2
    before = live.spent(np.array([0]))
    fresh = RenyiFilter(BUDGET)
    fresh.charge(np.array([0]), cost())  # one release's spend, which the copy wrote over the live owner's
    with pytest.raises(ConfigurationError, match="exists"):
        fresh.copy_to(pg_dsn, owner="live")
    for arr_before, arr_after in zip(before, live.spent(np.array([0])), strict=True):
        np.testing.assert_array_equal(arr_before, arr_after)
    assert not live.charge(np.array([0]), cost())[0]  # still exhausted
    again = RenyiFilter(path=pg_dsn, owner="live")  # another host opening it
    assert not again.charge(np.array([0]), cost())[0]


def test_a_copy_to_postgres_carries_the_spend_and_a_failed_one_leaves_nothing(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("psycopg")
    source = RenyiFilter(BUDGET, owner="source")
    exhaust(source, 3)
    source.charge(np.array([5]), cost())
    copy = source.copy_to(pg_dsn, owner="copy")
    units, spent, _ = copy.all_spent()
    assert units.tolist() == [3, 5]
    np.testing.assert_array_equal(spent, source.all_spent()[1])
    assert not copy.charge(np.array([3]), cost())[0]
    assert copy.releases() == 1  # a copy under a new owner counts its own releases

    from dp_icl_plugin.accounting.stores import filter_postgres

    def broken(row: np.ndarray) -> bytes:
        raise RuntimeError("injected failure after the owner row")

    monkeypatch.setattr(filter_postgres, "encode_spend", broken)
    with pytest.raises(RuntimeError, match="injected"):
        source.copy_to(pg_dsn, owner="half")
    monkeypatch.undo()
    with pytest.raises(Exception, match="create one with a budget"):  # no owner row was left behind
        RenyiFilter(path=pg_dsn, owner="half")


def test_a_copy_onto_an_sqlite_file_created_meanwhile_is_refused_and_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The existence check and the creation were two steps: a file created between them (another process) was
    opened and written into. The copy is now linked into place, which fails when anything is at the path."""
    target = tmp_path / "filter.sqlite"
    live = RenyiFilter(BUDGET, path=target, owner="copy")
    exhaust(live, 0)
    live.close()
    source = RenyiFilter(BUDGET, owner="source")
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: False if self == target else real_exists(self))
    with pytest.raises(ConfigurationError, match="exists"):
        source.copy_to(target, owner="copy")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == ["filter.sqlite"]
    reopened = RenyiFilter(path=target, owner="copy")
    assert not reopened.charge(np.array([0]), cost())[0]  # its spend kept


# -- 2. restored filters ------------------------------------------------------------------------------------


def _index_and_ledger(path: str | Path, ledger: Path) -> tuple[PrivateIndex, BudgetManager, list[int]]:
    texts, labels, _ = records(6)
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=path)
    ids = index.add(texts, labels=labels)
    return index, BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=ledger), ids


CONFIG = KNNConfig(k=6, shards=2, min_similarity=-1.0, uses=USES)  # every record is a candidate and pays


def _votes(index: PrivateIndex, budget: BudgetManager, n: int) -> int:
    """Votes over ``n`` queries; how many of them the first record took part in."""
    knn = PrivateKNN(index, budget=budget, labels=LABELS, config=CONFIG)
    joined = 0
    for _ in range(n):
        retrieval = knn.retrieve("a question about billing", release="vote")
        joined += int(len(retrieval) > 0)
        knn.vote(retrieval, rng=np.random.default_rng(0))
    return joined


def test_a_filter_file_restored_from_a_backup_is_refused(tmp_path: Path) -> None:
    """Before: a routine sqlite3 backup of the index's filter, restored in place, let every record join 2 + 2
    votes with uses=2 under one cover."""
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    filter_file = index.filter.path
    assert filter_file is not None
    backup = tmp_path / "backup.sqlite"
    live, copy = sqlite3.connect(filter_file), sqlite3.connect(backup)
    live.backup(copy)
    live.close()
    copy.close()
    assert _votes(index, budget, 3) == USES  # the third vote finds every record exhausted
    assert index.filter.releases() == 3
    index.filter.close()
    shutil.copyfile(backup, filter_file)  # restored in place
    for suffix in ("-wal", "-shm"):
        Path(str(filter_file) + suffix).unlink(missing_ok=True)
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match=r"counts 0 releases but the ledger .* records 3"):
        PrivateKNN(reopened, budget=budget, labels=LABELS, config=CONFIG)
    assert budget.label_counts()[f"knn-filter:{reopened.id}"] == 1  # nothing more was charged


def test_an_index_reopened_as_it_was_left_is_accepted(tmp_path: Path) -> None:
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    assert _votes(index, budget, 1) == 1
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    assert _votes(reopened, budget, 2) == 1  # one more vote each, then exhausted: 2 in all
    assert reopened.filter.releases() == 3


def test_a_release_over_no_candidate_is_counted(tmp_path: Path) -> None:
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=tmp_path / "index")
    budget = BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=tmp_path / "ledger.db")
    _votes(index, budget, 2)  # an empty index: both releases are recorded in the ledger
    assert index.filter.releases() == 2
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    PrivateKNN(reopened, budget=budget, labels=LABELS, config=CONFIG)  # 2 counted, 2 recorded: accepted


def test_a_filter_written_before_releases_were_counted_starts_from_the_ledger(tmp_path: Path) -> None:
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    _votes(index, budget, 1)
    index.filter.close()
    conn = sqlite3.connect(index.filter.path)  # as an older version wrote it
    with conn:
        conn.execute("DELETE FROM meta WHERE key = 'releases'")
    conn.close()
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    assert reopened.filter.releases() is None
    PrivateKNN(reopened, budget=budget, labels=LABELS, config=CONFIG)
    assert reopened.filter.releases() == 1  # adopted from the ledger, counted from there on


def test_a_postgres_filter_restored_from_a_dump_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    index, budget, _ = _index_and_ledger(pg_dsn, tmp_path / "ledger.db")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the dump: the filter's tables as they are now
        owners = conn.execute("SELECT owner, budget, releases FROM dp_icl_filters").fetchall()
        units = conn.execute("SELECT owner, unit, spent, spent_delta FROM dp_icl_filter_units").fetchall()
    assert _votes(index, budget, 3) == USES
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.transaction():  # restored
        conn.execute("DELETE FROM dp_icl_filter_units")
        conn.execute("DELETE FROM dp_icl_filters")
        for row in owners:
            conn.execute("INSERT INTO dp_icl_filters (owner, budget, releases) VALUES (%s, %s, %s)", row)
        for row in units:
            conn.execute(
                "INSERT INTO dp_icl_filter_units (owner, unit, spent, spent_delta) VALUES (%s, %s, %s, %s)", row
            )
    reopened = PrivateIndex.open(pg_dsn, embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match="counts 0 releases"):
        PrivateKNN(reopened, budget=budget, labels=LABELS, config=CONFIG)
