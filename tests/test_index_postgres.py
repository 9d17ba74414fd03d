"""A private index on PostgreSQL, served by several hosts (processes, each with its own FAISS copy): records
added or removed on one are seen by the others before their next release, a stale copy never lets a record
take part without paying, and hosts racing releases over the same records admit each record exactly as often
as one process would; a host killed mid-release leaves no release without its charges."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from postgres_server import PostgresServer, postgres_database_fixture, postgres_server_fixture  # noqa: F401

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.errors import ConfigurationError, LedgerError
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from tests.test_knn_retriever import CANARY, LABELS, BagEmbedder, records

pytest.importorskip("psycopg")
pytest.importorskip("faiss")

BUDGET = IndividualBudget(epsilon=2.0, delta=1e-5)
USES = 3
CONFIG = KNNConfig(k=8, shards=4, min_similarity=-1.0, uses=USES)  # every active record is a candidate and pays


def knn(index: PrivateIndex) -> PrivateKNN:
    return PrivateKNN(index, budget=BudgetManager(PrivacyBudget(1e6, 1e-3)), labels=LABELS, config=CONFIG)


def test_hosts_see_each_others_records_before_their_next_release(pg_dsn: str) -> None:
    texts, labels, _ = records(12)
    a = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="tickets")
    a.add(texts[:6], labels=labels[:6])
    b = PrivateIndex.open(pg_dsn, name="tickets", embedder=BagEmbedder())
    assert len(b) == 6 and b.id == a.id and "postgresql://" in repr(b)
    new = b.add(texts[6:], labels=labels[6:])
    query = a.embed_query(texts[8])
    assert set(new) <= set(a.within(query, -1.0).ids.tolist())  # a refreshed before searching
    assert b.remove(new[:3]) == 3
    assert not set(new[:3]) & set(a.search(query, 12).ids.tolist())
    assert len(a) == len(b) == 9
    with pytest.raises(ConfigurationError, match="exists already"):
        PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="tickets")
    with pytest.raises(LedgerError, match="no private index"):
        PrivateIndex.open(pg_dsn, name="other", embedder=BagEmbedder())
    with pytest.raises(ConfigurationError, match="embedder"):
        PrivateIndex.open(pg_dsn, name="tickets", embedder=lambda t: np.ones((len(t), 32)))


def test_a_record_removed_behind_a_stale_copy_may_pay_but_never_takes_part(pg_dsn: str) -> None:
    texts, labels, _ = records(9)
    a = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="stale")
    ids = a.add(texts, labels=labels)
    b = PrivateIndex.open(pg_dsn, name="stale", embedder=BagEmbedder())
    b.remove(ids[:4])
    a.refresh = lambda: None  # type: ignore[method-assign]  # the removal lands between a's refresh and its release
    retrieval = knn(a).retrieve(texts[0], release="vote")
    used = {r.text.reveal() for r in retrieval}
    assert not used & set(texts[:4]) and used <= set(texts[4:])
    spent = a.filter.epsilon_spent(ids)
    assert (spent[4:] > 0).all()  # the others paid as usual; the removed ones may have paid, harmlessly


def _release_until_exhausted(dsn: str, log: str, rounds: int) -> None:
    index = PrivateIndex.open(dsn, name="race", embedder=BagEmbedder())
    retriever = knn(index)
    with open(log, "a") as out:
        for i in range(rounds):
            retrieval = retriever.retrieve(f"red thing number{i % 7}", release="vote")
            # a release's output exists only after its charges committed: log the records it used (a vote uses
            # the k nearest of those that paid), durably
            out.write(",".join(str(int(x)) for x in retrieval._candidates.ids) + "\n")
            out.flush()
            os.fsync(out.fileno())


def _charged_uses(index: PrivateIndex, ids: np.ndarray) -> np.ndarray:
    """How many releases each record paid for (its spend over one release's cost)."""
    one = knn(index)._cost("vote", 1, CONFIG.k)
    spent, _ = index.filter.spent(ids)
    return np.rint(spent[:, -1] / one.rdp[-1]).astype(int)


@pytest.mark.parametrize("kill", [False, True], ids=["all-finish", "one-killed"])
def test_hosts_racing_releases_admit_each_record_exactly_as_one_process_would(
    postgres: PostgresServer, tmp_path: Path, kill: bool
) -> None:
    dsn = postgres.create_database()
    texts, labels, _ = records(24)
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=dsn, name="race")
    ids = index.add(texts, labels=labels)
    single = PrivateIndex(budget=BUDGET, embedder=BagEmbedder())
    single.add(texts, labels=labels)
    alone = knn(single)
    for i in range(2 * USES):
        alone.retrieve(f"red thing number{i % 7}", release="vote")
    expected = _charged_uses(single, ids)
    assert (expected == USES).all()  # one process: every record takes part exactly USES times

    ctx = mp.get_context("spawn")
    logs = [tmp_path / f"host{i}.log" for i in range(4)]
    hosts = [ctx.Process(target=_release_until_exhausted, args=(dsn, str(log), 2 * USES)) for log in logs]
    for h in hosts:
        h.start()
    if kill:
        deadline = time.monotonic() + 60
        while not logs[0].exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(hosts[0].pid, signal.SIGKILL)  # mid-run: in or between releases
    for h in hosts:
        h.join(timeout=120)
    assert all(h.exitcode == (-signal.SIGKILL if kill and h is hosts[0] else 0) for h in hosts)

    charged = _charged_uses(PrivateIndex.open(dsn, name="race", embedder=BagEmbedder()), ids)
    released = np.zeros(len(ids), dtype=int)
    for log in logs:
        for line in log.read_text().splitlines() if log.exists() else []:
            for x in filter(None, line.split(",")):
                released[int(x) - int(ids[0])] += 1
    assert (released <= charged).all()  # no release of a record without its charge, killed host included
    assert (charged <= USES).all()  # never past its budget
    if not kill:
        np.testing.assert_array_equal(charged, expected)  # exactly as many as one process admits
    assert CANARY not in " ".join(log.read_text() for log in logs if log.exists())


def test_passwords_never_show_and_bad_text_is_refused_before_it_is_stored(pg_dsn: str) -> None:
    from dp_icl_plugin._storage.postgres_connection import mask_dsn
    from dp_icl_plugin.retrieval.stores.postgres import PostgresRecordStore

    assert mask_dsn("postgresql://u:se?cret@db:5432/x") == "postgresql://u:***@db:5432/x"  # a raw '?' in it
    assert "abc" not in mask_dsn("host=db sslpassword=abc dbname=l")
    store = PostgresRecordStore("postgresql://u:se?cret@127.0.0.1:1/x", name="n")
    assert "se?cret" not in repr(store) + store.where
    index = PrivateIndex(budget=BUDGET, embedder=BagEmbedder(), path=pg_dsn, name="text")
    for bad in ("a\x00b " + CANARY, "a\ud800 " + CANARY):
        with pytest.raises(ConfigurationError) as info:
            index.add([bad])
        assert CANARY not in str(info.value)
    assert len(index) == 0
