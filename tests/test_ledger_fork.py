"""Forked workers (a pre-forking web server): an in-memory ledger refuses use outside the process that made
it, since each copy would spend the whole budget again; SQLite ledgers stay shared across ``fork()``.

Issue 27, defect 1: an in-memory ``BudgetManager`` forked into 3 workers let each admit 3 charges of 0.3 on
a budget of 1.0.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from dp_icl_plugin import BudgetExhaustedError, BudgetManager, PrivacyBudget, PureDPEvent
from dp_icl_plugin.accounting.stores import InMemoryStore
from dp_icl_plugin.errors import LedgerError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

CHARGE = PureDPEvent(0.3, neighbouring="replace_one")


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
    with warnings.catch_warnings():  # Python ≥ 3.12 warns when a process with other threads forks
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        child.start()
    try:
        if not receive.poll(60):
            raise AssertionError("the forked child did not answer")
        result = receive.recv()
    finally:
        child.join(60)
    assert child.exitcode == 0
    return result


def spend(manager: BudgetManager) -> Callable[[], object]:
    return lambda: manager.spend(CHARGE, label="worker").id


def test_a_forked_in_memory_ledger_refuses_every_use_and_the_parent_keeps_working() -> None:
    manager = BudgetManager(PrivacyBudget(1.0, 1e-6))
    manager.spend(CHARGE, label="parent")
    uses = {
        "spend": spend(manager),
        "would_fit": lambda: manager.would_fit(CHARGE),
        "spent": manager.spent,
        "remaining": manager.remaining,
        "history": manager.history,
        "label_counts": manager.label_counts,
        "a new manager on the store": lambda: BudgetManager(ledger=manager._store),
    }
    for name, use in uses.items():
        kind, message = in_child(use)
        assert kind == "LedgerError", (name, kind, message)
        assert "SQLite" in message and "PostgreSQL" in message
    # Nothing a child tried reached the parent, which keeps its one ledger.
    assert manager.spend(CHARGE, label="parent").id == 2
    assert manager.spent().epsilon == pytest.approx(0.6, rel=1e-4)
    assert manager.label_counts() == {"parent": 2}


def test_forked_in_memory_workers_cannot_double_spend() -> None:
    """The issue's scenario: 3 workers × 3 charges of 0.3 on ε = 1; at most 3 may be admitted in all."""
    manager = BudgetManager(PrivacyBudget(1.0, 1e-6))
    admitted = 0
    for _ in range(3):
        for _ in range(3):
            kind, _message = in_child(spend(manager))
            admitted += kind == "ok"
    assert admitted == 0  # every worker's charge is refused (they would each have had the whole budget)
    for _ in range(3):
        manager.spend(CHARGE, label="parent")
    with pytest.raises(BudgetExhaustedError):
        manager.spend(CHARGE, label="parent")


def test_a_ledger_made_in_the_child_works_there() -> None:
    def fresh() -> object:
        manager = BudgetManager(PrivacyBudget(1.0, 1e-6))
        return [manager.spend(CHARGE, label="child").id for _ in range(3)]

    assert in_child(fresh) == ("ok", "[1, 2, 3]")


def test_an_in_memory_ledger_cannot_be_pickled_or_copied() -> None:
    store = InMemoryStore()
    BudgetManager(PrivacyBudget(1.0, 1e-6), ledger=store)
    for copier in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="SQLite"):
            copier(store)


def test_forked_workers_share_one_sqlite_ledger(tmp_path: Path) -> None:
    """The parent's connection is open when it forks; each child opens its own and spends the same budget."""
    manager = BudgetManager(PrivacyBudget(1.0, 1e-6), ledger=tmp_path / "ledger.db")
    manager.spend(CHARGE, label="parent")
    results = [in_child(spend(manager)) for _ in range(3)]
    assert [kind for kind, _ in results] == ["ok", "ok", "BudgetExhaustedError"]
    assert manager.label_counts() == {"parent": 1, "worker": 2}
    assert manager.spent().epsilon == pytest.approx(0.9, rel=1e-4)  # PLD is a hair below basic composition
    with pytest.raises(BudgetExhaustedError):
        manager.spend(CHARGE, label="parent")


def test_a_fork_is_recognised_even_when_the_child_has_its_parents_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grandchild may get the pid of an exited grandparent: the at-fork hook's count tells them apart."""
    from dp_icl_plugin.accounting import process_mark

    manager = BudgetManager(PrivacyBudget(1.0, 1e-6))
    monkeypatch.setattr(process_mark, "_forks", process_mark._forks + 1)  # what the hook does in a child
    with pytest.raises(LedgerError, match="another"):
        manager.spend(CHARGE, label="worker")
    monkeypatch.undo()
    assert manager.spend(CHARGE, label="parent").id == 1
