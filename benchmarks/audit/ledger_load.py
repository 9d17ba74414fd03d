"""The shared ledger under load: 8 processes × 4 threads charging one SQLite file (or PostgreSQL ledger) at once.

Each round creates a ledger whose budget fits exactly 16 charges of ε0 = 0.25 (computed independently: the
exact privacy profile of 16-fold ε0-DP composition, as in ``tests/test_ledger_concurrency.py``) and lets
8 × 4 × 3 = 96 attempts race for them; the committed count must be exactly 16 every round (no overspend, no
lost charge). A throughput round then lets all 32 threads charge a large budget and reports charges/s.

    python benchmarks/audit/ledger_load.py [--rounds 20] [--backend sqlite|postgres] [--postgres DSN]

``--backend postgres`` starts a throw-away PostgreSQL server (``tests/postgres_server.py``, fsync on, so
commits are as durable as SQLite's ``synchronous=FULL``) unless ``--postgres DSN`` names a database to use;
each round then makes a new named ledger ``ledger-load-<time>-<round>`` there (left behind afterwards).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE.parents[1] / "tests" / "ledger_worker.py"


def race(ledger: list[str], eps0: float, threads: int, attempts: int, processes: int) -> tuple[int, float]:
    """Run the workers on ``ledger`` (``[file]`` or ``[dsn, name]``); (charges committed, seconds)."""
    started = time.perf_counter()
    argv = [sys.executable, str(WORKER), ledger[0], str(eps0), str(threads), str(attempts), *ledger[1:]]
    pipe = subprocess.PIPE
    procs = [subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True) for _ in range(processes)]
    committed = 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(err)
        committed += int(out.strip())
    return committed, time.perf_counter() - started


@contextmanager
def ledgers(backend: str, dsn: str | None) -> Iterator[Callable[[str], list[str]]]:
    """Yields ``fresh(name)``: where a new ledger of that name lives, as the worker's arguments."""
    with ExitStack() as stack:
        if backend == "sqlite":
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            yield lambda name: [str(tmp / f"{name}.db")]
            return
        if dsn is None:
            sys.path.insert(0, str(WORKER.parent))
            from postgres_server import running

            dsn = stack.enter_context(running(fast=False)).create_database()
        stamp = time.strftime("%Y%m%dT%H%M%S")
        yield lambda name: [dsn, f"ledger-load-{stamp}-{name}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default=None, help="default: sqlite")
    parser.add_argument("--postgres", metavar="DSN", help="use this PostgreSQL database (implies --backend postgres)")
    args = parser.parse_args()
    backend = args.backend or ("postgres" if args.postgres else "sqlite")
    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting.stores import PostgresStore

    def manager(ledger: list[str], budget: PrivacyBudget | None) -> BudgetManager:
        return BudgetManager(budget, ledger=PostgresStore(ledger[0], ledger=ledger[1]) if ledger[1:] else ledger[0])

    failures = 0
    with ledgers(backend, args.postgres) as fresh:
        for r in range(args.rounds):
            ledger = fresh(f"round-{r}")
            manager(ledger, PrivacyBudget(4.0, 1e-8)).close()
            committed, _ = race(ledger, 0.25, threads=4, attempts=3, processes=8)
            entries = len(manager(ledger, None).history())
            ok = committed == 16 == entries
            failures += not ok
            verdict = "ok" if ok else "WRONG"
            print(f"round {r + 1:>2}: {committed} charges committed, {entries} in the ledger: {verdict}")
        ledger = fresh("throughput")
        manager(ledger, PrivacyBudget(1e6, 1e-8)).close()
        committed, seconds = race(ledger, 1e-3, threads=4, attempts=50, processes=8)
        print(
            f"throughput ({backend}): {committed} charges by 8 processes × 4 threads in {seconds:.1f} s "
            f"(including process start-up): {committed / seconds:.0f} charges/s"
        )
    print(f"{args.rounds - failures} of {args.rounds} rounds exact")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
