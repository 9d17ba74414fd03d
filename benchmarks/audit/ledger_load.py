"""The shared ledger under load: 8 processes × 4 threads charging one SQLite file at once.

Each round creates a ledger whose budget fits exactly 16 charges of ε0 = 0.25 (computed independently: the
exact privacy profile of 16-fold ε0-DP composition, as in ``tests/test_ledger_concurrency.py``) and lets
8 × 4 × 3 = 96 attempts race for them; the committed count must be exactly 16 every round (no overspend, no
lost charge). A throughput round then lets all 32 threads charge a large budget and reports charges/s.

    python benchmarks/audit/ledger_load.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE.parents[1] / "tests" / "ledger_worker.py"


def race(ledger: Path, eps0: float, threads: int, attempts: int, processes: int) -> tuple[int, float]:
    started = time.perf_counter()
    argv = [sys.executable, str(WORKER), str(ledger), str(eps0), str(threads), str(attempts)]
    pipe = subprocess.PIPE
    procs = [subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True) for _ in range(processes)]
    committed = 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(err)
        committed += int(out.strip())
    return committed, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from dp_icl_plugin import BudgetManager, PrivacyBudget

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            ledger = Path(tmp) / f"round-{r}.db"
            BudgetManager(PrivacyBudget(4.0, 1e-8), ledger=ledger).close()
            committed, _ = race(ledger, 0.25, threads=4, attempts=3, processes=8)
            entries = len(BudgetManager.open(ledger).history())
            ok = committed == 16 == entries
            failures += not ok
            verdict = "ok" if ok else "WRONG"
            print(f"round {r + 1:>2}: {committed} charges committed, {entries} in the ledger: {verdict}")
        ledger = Path(tmp) / "throughput.db"
        BudgetManager(PrivacyBudget(1e6, 1e-8), ledger=ledger).close()
        committed, seconds = race(ledger, 1e-3, threads=4, attempts=50, processes=8)
        print(f"throughput: {committed} charges by 8 processes × 4 threads in {seconds:.1f} s "
              f"(including process start-up): {committed / seconds:.0f} charges/s")  # fmt: skip
    print(f"{args.rounds - failures} of {args.rounds} rounds exact")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
