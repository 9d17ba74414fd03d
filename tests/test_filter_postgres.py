"""The individual Rényi filter on PostgreSQL: persistence, isolation of owners, and hosts (processes) racing
charges over the same units, admitting exactly what a single process would."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from postgres_server import PostgresServer, postgres_database_fixture, postgres_server_fixture  # noqa: F401

from dp_icl_plugin import GaussianEvent, LedgerError
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost, RenyiFilter
from dp_icl_plugin.errors import FilterMismatchError

pytest.importorskip("psycopg")

BUDGET = IndividualBudget(epsilon=2.0, delta=1e-5, approximate_delta=0.0)


def cost(sigma: float = 6.0) -> ReleaseCost:
    return ReleaseCost.of(GaussianEvent(sigma, neighbouring="add_remove"), BUDGET.orders)


def test_spend_persists_per_owner_and_a_mismatch_is_refused(pg_dsn: str) -> None:
    f = RenyiFilter(BUDGET, path=pg_dsn, owner="index-a")
    assert "postgresql://" in repr(f)
    assert f.charge(np.array([3, 7]), cost()).all()
    spent, _ = f.spent(np.array([3, 7, 9]))
    f.close()
    again = RenyiFilter(path=pg_dsn, owner="index-a")
    assert again.budget == BUDGET
    np.testing.assert_array_equal(again.spent(np.array([3, 7, 9]))[0], spent)
    assert spent[2].sum() == 0 and spent[0].sum() > 0
    units, rows, _ = again.all_spent()
    assert units.tolist() == [3, 7] and rows.shape == (2, len(BUDGET.orders))
    other = RenyiFilter(BUDGET, path=pg_dsn, owner="index-b")  # another index in the same database
    assert other.spent(np.array([3]))[0].sum() == 0
    with pytest.raises(FilterMismatchError, match="epsilon"):
        RenyiFilter(IndividualBudget(epsilon=3.0, delta=1e-5), path=pg_dsn, owner="index-a")
    with pytest.raises(LedgerError, match="create one with a budget"):
        RenyiFilter(path=pg_dsn, owner="index-c")


def test_the_filter_on_postgres_admits_exactly_what_the_one_in_memory_admits(pg_dsn: str) -> None:
    shared, memory = RenyiFilter(BUDGET, path=pg_dsn, owner="x"), RenyiFilter(BUDGET)
    for sigma in (6.0, 3.0, 9.0, 2.0, 6.0, 4.0, 5.0):
        units = np.array([0, 1, 2, 5])
        np.testing.assert_array_equal(shared.charge(units, cost(sigma)), memory.charge(units, cost(sigma)))
    np.testing.assert_array_equal(shared.spent(np.arange(6))[0], memory.spent(np.arange(6))[0])


def _hammer(dsn: str, rounds: int, units: list[int], queue) -> None:
    f = RenyiFilter(path=dsn, owner="shared")
    admitted = np.zeros(max(units) + 1, dtype=int)
    for i in range(rounds):
        order = np.array(units[i % len(units) :] + units[: i % len(units)])  # overlapping sets, rotated
        ok = f.charge(order, cost())
        admitted[order[ok]] += 1
    queue.put(admitted.tolist())


def test_hosts_racing_over_the_same_units_admit_each_exactly_as_often_as_it_fits(postgres: PostgresServer) -> None:
    dsn = postgres.create_database()
    RenyiFilter(BUDGET, path=dsn, owner="shared").close()
    single = RenyiFilter(BUDGET)
    fits = 0
    while single.charge(np.array([0]), cost())[0]:
        fits += 1
    assert fits >= 2
    units = list(range(8))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_hammer, args=(dsn, 2 * fits, units, queue)) for _ in range(4)]
    for w in workers:
        w.start()
    totals = np.sum([queue.get(timeout=120) for _ in workers], axis=0)
    for w in workers:
        w.join(timeout=60)
    assert totals.tolist() == [fits] * len(units)  # every unit exactly `fits` times, across four hosts
    final = RenyiFilter(path=dsn, owner="shared")
    np.testing.assert_allclose(final.spent(np.array(units))[0], single.spent(np.array([0] * len(units)))[0])
