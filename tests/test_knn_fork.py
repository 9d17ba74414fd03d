"""Forked workers (a pre-forking web server) and in-memory private state: an in-memory privacy filter, and the
in-memory index that holds it, refuse use outside the process that made them, since each worker's copy would
let every record spend its budget again; an index in a directory stays shared across ``fork()``.

Issue 27, item 2: a record with uses = 1 in an in-memory index forked into 3 workers took part in 3 votes
(participations [1, 1, 1]) under one ledger cover.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dp_icl_plugin import BudgetManager, GaussianEvent, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost, RenyiFilter
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

BUDGET = IndividualBudget(epsilon=1.0, delta=1e-5)
COST = ReleaseCost.of(GaussianEvent(10.0, neighbouring="add_remove"), BUDGET.orders)  # fits several times


def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, float(len(t) % 3), 0.5] for t in texts])


def in_child(work: Callable[[], object]) -> tuple[str, str]:
    """Run ``work`` in a forked child; (error type name or "ok", message or repr of the result)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def target() -> None:
        try:
            send.send(("ok", repr(work())))
        except BaseException as exc:
            send.send((type(exc).__name__, str(exc)))

    child = ctx.Process(target=target)
    child.start()
    try:
        if not receive.poll(60):
            raise AssertionError("the forked child did not answer")
        result = receive.recv()
    finally:
        child.join(60)
    assert child.exitcode == 0
    return result


def test_a_forked_in_memory_filter_refuses_every_use_and_the_parent_keeps_working(tmp_path: Path) -> None:
    memory = RenyiFilter(BUDGET, owner="ix")
    memory.charge(np.array([1]), COST)
    uses = {
        "charge": lambda: memory.charge(np.array([1, 2]), COST).tolist(),
        "spent": lambda: memory.spent(np.array([1])),
        "all_spent": memory.all_spent,
        "epsilon_spent": lambda: memory.epsilon_spent(np.array([1])),
        "move_to": lambda: memory.move_to(tmp_path / "moved.sqlite"),
    }
    for name, use in uses.items():
        kind, message = in_child(use)
        assert kind == "ConfigurationError", (name, kind, message)
        assert "SQLite" in message and "PostgreSQL" in message
    assert not (tmp_path / "moved.sqlite").exists()
    assert memory.charge(np.array([1, 2]), COST).tolist() == [True, True]  # the parent's filter is untouched
    assert memory.all_spent()[0].tolist() == [1, 2]


def test_forked_workers_cannot_each_spend_a_records_budget(tmp_path: Path) -> None:
    """The issue's scenario: an in-memory index forked into 3 workers, a record with uses = 1, one shared
    (SQLite) ledger. Each worker's copy let the record vote: [1, 1, 1]. Now every worker is refused."""
    index = PrivateIndex(budget=BUDGET, embedder=embed)
    index.add(["the record"], labels=["a"])
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-4), ledger=tmp_path / "ledger.db")
    knn = PrivateKNN(index, budget=ledger, labels=["a", "b"], config=KNNConfig(k=1, shards=1, min_similarity=0.5))
    results = [in_child(lambda: len(knn.retrieve("the record"))) for _ in range(3)]
    assert [kind for kind, _ in results] == ["ConfigurationError"] * 3, results
    assert all("SQLite" in message and "PostgreSQL" in message for _, message in results)
    assert [e.label.split(":")[0] for e in ledger.history()] == ["knn-filter"]  # no worker released anything
    assert len(knn.retrieve("the record")) == 1  # the parent, which made the index, still serves it
    assert len(knn.retrieve("the record")) == 0  # and its one use is spent


@pytest.fixture
def one_omp_thread():
    """FAISS searches in a fork()ed child hang once the parent has started an OpenMP thread pool (libgomp does
    not survive fork); one thread runs every parallel region in the calling thread."""
    faiss = pytest.importorskip("faiss")
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.mark.usefixtures("one_omp_thread")
def test_forked_workers_share_an_index_directory(tmp_path: Path) -> None:
    index = PrivateIndex(budget=BUDGET, embedder=embed, path=tmp_path / "ix")
    index.add(["the record"], labels=["a"])
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-4), ledger=tmp_path / "ledger.db")
    knn = PrivateKNN(index, budget=ledger, labels=["a", "b"], config=KNNConfig(k=1, shards=1, min_similarity=0.5))
    results = [in_child(lambda: len(knn.retrieve("the record"))) for _ in range(3)]
    assert results == [("ok", "1"), ("ok", "0"), ("ok", "0")]  # one filter file: the record's one use, once
    assert len(knn.retrieve("the record")) == 0


def test_a_filter_or_index_cannot_be_pickled_or_copied() -> None:
    index = PrivateIndex(budget=BUDGET, embedder=embed)
    for obj in (index, index.filter):
        for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
            with pytest.raises(TypeError, match="second live filter"):
                attempt(obj)


def test_a_release_waits_while_another_process_holds_the_index_turn(tmp_path: Path) -> None:
    """An answer paid per token holds its index's release turn from its first charge to its last; another process's
    release on the index (here a plain charge) waits until the turn is given back (``retrieval.release_turn``)."""
    import threading

    index = PrivateIndex(budget=BUDGET, embedder=embed, path=tmp_path / "ix")
    index.add(["a", "bb"])
    ctx = multiprocessing.get_context("fork")
    held, go = ctx.Event(), ctx.Event()

    def holder() -> None:
        with PrivateIndex.open(tmp_path / "ix", embedder=embed).release_turn.hold():
            held.set()
            go.wait(60)

    child = ctx.Process(target=holder)
    child.start()
    try:
        assert held.wait(60)
        done = threading.Event()
        candidates = index.within(embed(["a"])[0], -1.0)
        worker = threading.Thread(target=lambda: (index.charge(candidates, lambda c: COST), done.set()))
        worker.start()
        assert not done.wait(0.5)  # blocked on the other process's turn
        go.set()
        worker.join(60)
        assert done.is_set()
    finally:
        go.set()
        child.join(60)
    assert child.exitcode == 0
