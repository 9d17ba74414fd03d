"""Several processes (and threads) hammer one SQLite ledger: exactly the charges that fit are committed.

The maximum that fits is computed independently of the library: the exact privacy profile of k-fold
composition of ε0-DP is that of k-fold randomized response (Kairouz, Oh & Viswanath 2015), a binomial sum.
"""

from __future__ import annotations

import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dp_icl_plugin import BudgetManager, PrivacyBudget

WORKER = Path(__file__).with_name("ledger_worker.py")


def exact_delta(k: int, eps0: float, eps: float) -> float:
    """δ(ε) of k-fold ε0-randomized response: Σ_{b: loss > ε} P_Y(b) − e^ε P_X(b)."""
    p = math.exp(eps0) / (1 + math.exp(eps0))
    total = 0.0
    for b in range(k + 1):  # b = number of "ones"; privacy loss (2b − k)·ε0
        if (2 * b - k) * eps0 > eps:
            total += math.comb(k, b) * (p**b * (1 - p) ** (k - b) - math.exp(eps) * (1 - p) ** b * p ** (k - b))
    return max(total, 0.0)


def max_charges(eps0: float, epsilon: float, delta: float) -> int:
    k = 0
    while exact_delta(k + 1, eps0, epsilon) <= delta:
        k += 1
    return k


def test_independent_maximum_is_what_basic_composition_allows() -> None:
    assert max_charges(0.25, 4.0, 1e-8) == 16
    assert max_charges(0.25, 2.0, 1e-8) == 8


def race_for_the_budget(ledger: str, *, timeout: float) -> None:
    """8 processes × 4 threads × 3 attempts (96) race for a budget that fits exactly 16 charges of ε0 = 0.25:
    exactly the maximum is committed and recorded."""
    eps0, budget = 0.25, PrivacyBudget(4.0, 1e-8)
    BudgetManager(budget, ledger=ledger).close()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), ledger, str(eps0), "4", "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    committed = 0
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        committed += int(out.strip())
    expected = max_charges(eps0, budget.epsilon, budget.delta)
    assert committed == expected  # no overspend, no lost charge
    after = BudgetManager.open(ledger)
    assert len(after.history()) == expected
    assert after.spent().epsilon == pytest.approx(expected * eps0, rel=1e-3)  # PLD: just under the sum at δ > 0


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(5))  # 20 rounds: benchmarks/audit/ledger_load.py
def test_processes_and_threads_commit_exactly_the_maximum(tmp_path: Path, repeat: int) -> None:
    race_for_the_budget(str(tmp_path / f"hammer-{repeat}.db"), timeout=240)


@pytest.mark.slow
def test_concurrent_cli_spends(tmp_path: Path) -> None:
    ledger = tmp_path / "cli.db"
    cli = [sys.executable, "-m", "dp_icl_plugin.cli"]
    init = subprocess.run(
        [*cli, "budget", "init", "--ledger", str(ledger), "--epsilon", "2", "--delta", "1e-8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert init.returncode == 0, init.stderr

    def spend(i: int) -> int:
        args = [*cli, "budget", "spend", "--ledger", str(ledger), "--pure-epsilon", "0.25", "--label", f"cli-{i % 3}"]
        return subprocess.run(args, capture_output=True, text=True, timeout=120).returncode

    with ThreadPoolExecutor(max_workers=6) as pool:
        codes = list(pool.map(spend, range(18)))
    expected = max_charges(0.25, 2.0, 1e-8)
    assert sorted(set(codes)) == [0, 3]
    assert codes.count(0) == expected
    assert codes.count(3) == 18 - expected
    assert len(BudgetManager.open(ledger).history()) == expected


@pytest.mark.slow
def test_kill_9_at_random_points_never_releases_an_uncommitted_charge(tmp_path: Path) -> None:
    harness = Path(__file__).with_name("crash_harness.py")
    done = subprocess.run(
        [sys.executable, str(harness), str(tmp_path / "crash.db"), "200", "7"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = __import__("json").loads(done.stdout)
    assert result["rounds"] == 200 and result["released_without_commit"] == 0
    assert result["committed"] >= result["released"] > 0
