"""A filter's spend never goes back (issue 40, items 1 and 2).

1. A copy onto a live owner: ``copy_to("<postgresql URL>", owner=X)`` with X a live index's owner was accepted (the
   "path must not exist" check is a filesystem check) and its spend rows replaced X's: a unit exhausted after its
   releases was admitted again. A copy is now created exclusively, owner and rows in one transaction, and a
   failed one leaves nothing; an SQLite file is linked into place (no check-then-act race).
2. A filter restored from a backup: the records joined their releases again under the same cover. The filter now
   counts its releases per cover, and a retriever covering it compares that count with the ledger's releases under
   the cover; a filter from before the counting is refused until its owner says it was never restored.
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
    assert copy.releases() == 1  # a copy under a new owner counts its own releases (none carried over)

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


def _knn(index: PrivateIndex, budget: BudgetManager) -> PrivateKNN:
    return PrivateKNN(index, budget=budget, labels=LABELS, config=CONFIG)


def _votes(index: PrivateIndex, budget: BudgetManager, n: int) -> int:
    """Votes over ``n`` queries; how many of them the records took part in."""
    knn = _knn(index, budget)
    joined = 0
    for _ in range(n):
        retrieval = knn.retrieve("a question about billing", release="vote")
        joined += int(len(retrieval) > 0)
        knn.vote(retrieval, rng=np.random.default_rng(0))
    return joined


def _backup(path: Path, to: Path) -> None:
    live, copy = sqlite3.connect(path), sqlite3.connect(to)
    live.backup(copy)
    live.close()
    copy.close()


def _restore(index: PrivateIndex, backup: Path) -> None:
    filter_file = index.filter.path
    assert filter_file is not None
    index.filter.close()
    shutil.copyfile(backup, filter_file)  # restored in place
    for suffix in ("-wal", "-shm"):
        Path(str(filter_file) + suffix).unlink(missing_ok=True)


def _cover_tag(budget: BudgetManager, index: PrivateIndex) -> str:
    (cover,) = [e for e in budget.history() if e.label == f"knn-filter:{index.id}"]
    return f"knn-filter:{cover.id}@{cover.timestamp!r}"


def test_a_filter_file_restored_from_a_backup_is_refused(tmp_path: Path) -> None:
    """Before: a routine sqlite3 backup of the index's filter, restored in place, let every record join 2 + 2
    votes with uses=2 under one cover."""
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    assert index.filter.path is not None
    _backup(index.filter.path, tmp_path / "backup.sqlite")
    assert _votes(index, budget, 3) == USES  # the third vote finds every record exhausted
    assert index.filter.releases(_cover_tag(budget, index)) == 3
    _restore(index, tmp_path / "backup.sqlite")
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match=r"counts 0 releases but the ledger .* records 3"):
        _knn(reopened, budget)
    assert budget.label_counts()[f"knn-filter:{reopened.id}"] == 1  # nothing more was charged


def test_an_index_reopened_as_it_was_left_is_accepted(tmp_path: Path) -> None:
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    assert _votes(index, budget, 1) == 1
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    again = BudgetManager(ledger=tmp_path / "ledger.db")  # the app restarted: its ledger read back from the file
    assert _votes(reopened, again, 2) == 1  # one more vote each, then exhausted: 2 in all
    assert reopened.filter.releases(_cover_tag(again, reopened)) == 3


def test_a_release_over_no_candidate_is_counted(tmp_path: Path) -> None:
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=tmp_path / "index")
    budget = BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=tmp_path / "ledger.db")
    _votes(index, budget, 2)  # an empty index: both releases are recorded in the ledger
    assert index.filter.releases(_cover_tag(budget, index)) == 2
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    _knn(reopened, budget)  # 2 counted, 2 recorded: accepted


def test_releases_recorded_by_another_ledger_hide_no_rollback(tmp_path: Path) -> None:
    """Cold review: with one count per filter, releases another ledger recorded over the same index made room for a
    restore to pass (3 empty releases through ledger B, a backup, 3 votes through A, the backup restored: 3 ≥ 3).
    Each cover's releases are now counted apart."""
    index, a, _ = _index_and_ledger(tmp_path / "index", tmp_path / "a.db")
    b = BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=tmp_path / "b.db")
    knn_b = PrivateKNN(index, budget=b, labels=LABELS, config=KNNConfig(k=6, shards=2, min_similarity=0.99))
    for _ in range(3):
        knn_b.vote("zzz unrelated", rng=np.random.default_rng(0))  # no candidate: releases counted, nobody pays
    assert index.filter.path is not None
    _backup(index.filter.path, tmp_path / "backup.sqlite")
    assert _votes(index, a, 3) == USES
    _restore(index, tmp_path / "backup.sqlite")
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match="counts 0 releases"):
        _knn(reopened, a)
    PrivateKNN(reopened, budget=b, labels=LABELS, config=KNNConfig(k=6, shards=2, min_similarity=0.99))  # B's 3: kept


def _as_before_counting(filter_file: Path) -> None:
    conn = sqlite3.connect(filter_file)  # as an older version wrote it: no counts, no mark
    with conn:
        conn.execute("DROP TABLE releases")
        conn.execute("DELETE FROM meta WHERE key = 'counting'")
    conn.close()


def test_a_filter_from_before_the_counting_is_refused_until_its_owner_vouches_for_it(tmp_path: Path) -> None:
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    _votes(index, budget, 1)
    index.filter.close()
    assert index.filter.path is not None
    _as_before_counting(index.filter.path)
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    tag = _cover_tag(budget, reopened)
    with pytest.raises(FilterRolledBackError, match=r"before releases were counted.*adopt_releases\(1, "):
        _knn(reopened, budget)
    reopened.filter.adopt_releases(1, release_tag=tag)  # the owner's statement: never restored
    assert _votes(reopened, budget, 2) == 1  # then counted from there on
    assert reopened.filter.releases(tag) == 3


def test_a_backup_from_before_the_counting_is_refused_after_the_upgrade(tmp_path: Path) -> None:
    """Cold review: a backup without counts, restored after the upgrade, was adopted at the ledger's figure and
    gave the records 2 + 2 votes with uses=2. A filter without counts is never trusted silently."""
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    assert index.filter.path is not None
    _backup(index.filter.path, tmp_path / "backup.sqlite")
    _as_before_counting(tmp_path / "backup.sqlite")
    assert _votes(index, budget, 3) == USES
    _restore(index, tmp_path / "backup.sqlite")
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match="before releases were counted"):
        _knn(reopened, budget)


def test_a_copy_onto_a_path_with_a_leftover_journal_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """Cold review: a deleted filter's -wal left at the path was replayed over the new copy (another owner's filter
    appeared at the path, and stayed after the copy failed)."""
    target = tmp_path / "f.sqlite"
    Path(str(target) + "-wal").write_bytes(b"left by a crashed process")
    with pytest.raises(ConfigurationError, match="leftover journal"):
        RenyiFilter(BUDGET, owner="source").copy_to(target, owner="copy")
    assert not target.exists()


def test_a_postgres_filter_restored_from_a_dump_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    index, budget, _ = _index_and_ledger(pg_dsn, tmp_path / "ledger.db")
    tables = ("dp_icl_filters", "dp_icl_filter_units", "dp_icl_filter_releases")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the dump: the filter's tables as they are now
        dump = {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
    assert _votes(index, budget, 3) == USES
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.transaction():  # restored
        for t in reversed(tables):
            conn.execute(f"DELETE FROM {t}")
        for t in tables:
            for row in dump[t]:
                conn.execute(f"INSERT INTO {t} VALUES ({', '.join(['%s'] * len(row))})", row)
    reopened = PrivateIndex.open(pg_dsn, embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match="counts 0 releases"):
        _knn(reopened, budget)


def test_an_index_and_ledger_on_postgres_reopened_as_they_were_left_are_accepted(pg_dsn: str) -> None:
    """The cover's tag names its timestamp: it must read back from a PostgreSQL ledger as it was written."""
    pytest.importorskip("psycopg")
    texts, labels, _ = records(6)
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="left")
    index.add(texts, labels=labels)
    budget = BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=pg_dsn)
    assert _votes(index, budget, 1) == 1
    reopened = PrivateIndex.open(pg_dsn, embedder=BagEmbedder(), name="left")
    again = BudgetManager(ledger=pg_dsn)  # another host: the ledger read back from the database
    assert _votes(reopened, again, 2) == 1
    assert reopened.filter.releases(_cover_tag(again, reopened)) == 3


def test_releases_the_ledger_never_recorded_leave_no_room_for_a_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second review: releases counted by the filter whose ledger write then failed (a busy timeout, a crash) made
    room for as many rolled-back ones. Each release's number under its cover is now recorded with it, and the filter
    must count up to the highest."""
    from dp_icl_plugin.errors import LedgerError

    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    knn = PrivateKNN(index, budget=budget, labels=LABELS, config=KNNConfig(k=6, shards=2, min_similarity=0.99))
    real_spend = BudgetManager.spend

    def failing(self: BudgetManager, event: object, *, label: str) -> object:
        raise LedgerError("the ledger stayed locked (injected)")

    monkeypatch.setattr(BudgetManager, "spend", failing)
    for _ in range(3):
        with pytest.raises(LedgerError):
            knn.vote("zzz unrelated", rng=np.random.default_rng(0))  # counted by the filter, not recorded
    monkeypatch.setattr(BudgetManager, "spend", real_spend)
    assert index.filter.path is not None
    _backup(index.filter.path, tmp_path / "backup.sqlite")
    assert _votes(index, budget, 3) == USES
    assert [e.label.rpartition("#")[2] for e in budget.history()][1:] == ["4", "5", "6"]  # gaps, not slack
    _restore(index, tmp_path / "backup.sqlite")
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match=r"counts 3 releases but the ledger .* records 6"):
        _knn(reopened, budget)
    assert budget.label_counts() == {f"knn-filter:{index.id}": 1, f"knn-vote:{index.id}": 3}


def test_every_cover_of_an_index_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Second review: two hosts starting together may both charge a cover; only the first was checked."""
    index, budget, _ = _index_and_ledger(tmp_path / "index", tmp_path / "ledger.db")
    _knn(index, budget)  # the first cover
    real_history = BudgetManager.history
    monkeypatch.setattr(BudgetManager, "history", lambda self: [])  # the race: the second host saw none yet
    second = _knn(index, budget)
    monkeypatch.setattr(BudgetManager, "history", real_history)
    assert [e.label.split(":")[0] for e in budget.history()] == ["knn-filter", "knn-filter"]
    assert index.filter.path is not None
    _backup(index.filter.path, tmp_path / "backup.sqlite")
    for _ in range(2):
        second.vote("a question about billing", rng=np.random.default_rng(0))
    _restore(index, tmp_path / "backup.sqlite")
    reopened = PrivateIndex.open(tmp_path / "index", embedder=BagEmbedder())
    with pytest.raises(FilterRolledBackError, match="cover entry 2"):
        _knn(reopened, budget)


def test_a_cover_read_back_from_postgres_with_short_floats_is_the_same_cover(pg_dsn: str) -> None:
    """Second review: with extra_float_digits = 0 (a database or role setting) the cover's time read back shortened,
    named another tag, and every restart was refused. Connections now ask for exact floats."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET extra_float_digits = 0")
    texts, labels, _ = records(6)
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="short")
    index.add(texts, labels=labels)
    budget = BudgetManager(PrivacyBudget(1e6, 1e-3), ledger=pg_dsn)
    assert _votes(index, budget, 1) == 1
    again = BudgetManager(ledger=pg_dsn)
    assert _votes(PrivateIndex.open(pg_dsn, embedder=BagEmbedder(), name="short"), again, 1) == 1
