"""What paying per token costs the ledger: one draw on an allowance against one per-answer charge.

A decoder paid per token (``pay_per_token=True``) commits one draw per token mechanism, each its own ledger
transaction in which the draws under the allowance are summed and checked against its caps
(:mod:`dp_icl_plugin.accounting.allowance`); a decoder paid per answer commits one charge an answer. Side by side
in one run, for the in-memory store, an SQLite file and a PostgreSQL database (a throw-away server with fsync
on, as a real one; skipped with the reason when the binaries are missing): the ledger is first filled with an
app's history (the allowance's cover, ``--draws`` draws on it, and 200 per-answer charges), then ``--calls``
further draws and per-answer charges (DPS-MOZO, 25 tokens) are timed. The ratio that matters is a draw's
milliseconds against a token mechanism's seconds on the same machine (``benchmarks/decoding_floor.md``).

Run: ``.venv/bin/python benchmarks/allowance_draws.py [--draws 2500] [--calls 200]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.decoding.pay_as_you_go import TokenAllowance

BUDGET = PrivacyBudget(epsilon=1e4, delta=1e-5)  # room for every timed charge: only the cost of a commit is measured
TOKEN = me.mozo_event(beta=0.15, order=5.0, sampling_rate=4 / 4672, steps=1)
ANSWER = me.mozo_event(beta=0.15, order=5.0, sampling_rate=4 / 4672, steps=25)


@contextlib.contextmanager
def places() -> Iterator[tuple[str, str | None]]:
    """(name, ledger location) for memory, SQLite and, when it can start, PostgreSQL (fsync on)."""
    with tempfile.TemporaryDirectory() as tmp:
        found: list[tuple[str, str | None]] = [("memory", None), ("SQLite file", str(Path(tmp) / "ledger.db"))]
        sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
        with contextlib.ExitStack() as stack:
            try:
                from postgres_server import running

                server = stack.enter_context(running(fast=False))
                found.append(("PostgreSQL (fsync on)", server.create_database()))
            except (ImportError, RuntimeError) as exc:
                print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
            yield found  # type: ignore[misc]


def timed(call, n: int) -> float:
    """Median milliseconds of ``n`` calls."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=2500, help="draws already on the ledger (default 2500)")
    parser.add_argument("--calls", type=int, default=200, help="timed calls of each kind (default 200)")
    args = parser.parse_args()
    rows = []
    with places() as found:
        for name, where in found:  # type: ignore[attr-defined]
            ledger = BudgetManager(BUDGET, ledger=where)
            allowance = TokenAllowance(ledger, component="mozo", epsilon=5e3, delta=1e-6, name="bench", orders=(5.0,))
            for _ in range(args.draws):
                allowance.draw(TOKEN)
            for _ in range(200):
                ledger.spend(ANSWER, label="mozo-answer")
            draw = timed(lambda a=allowance: a.draw(TOKEN), args.calls)
            answer = timed(lambda m=ledger: m.spend(ANSWER, label="mozo-answer"), args.calls)
            rows.append((name, draw, answer))
            ledger.close()
    print(
        f"| ledger | one draw (ms) | one per-answer charge (ms) | 25 draws / one charge |  ({args.draws} draws before)"
    )
    print("|---|---:|---:|---:|")
    for name, draw, answer in rows:
        print(f"| {name} | {draw:.2f} | {answer:.2f} | {25 * draw / answer:.1f}× |")


if __name__ == "__main__":
    main()
