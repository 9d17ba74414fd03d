"""How fast is ``BudgetManager.spend`` as the ledger grows? Target: under 20 ms at 10,000 recorded events.

Fills a ledger with 10,000 charges of a realistic mix (PTA tokens, clip-blend tokens, pure-DP releases and
Gaussian releases, under four labels), then times further ``spend`` calls, side by side with the same
calls on an empty ledger, for the SQLite file and the in-memory store. The fill goes through the store's
own transaction (one commit) so that the benchmark takes seconds; the timed calls are ordinary spends,
each its own durable ``BEGIN IMMEDIATE`` transaction. The last column times a refused charge, which no
cheap bound admits, so the numerical (PRV) analysis decides it: that is the slow path.

Run: ``.venv/bin/python benchmarks/bench_spend.py [--events 10000] [--calls 200]``
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dp_icl_plugin import BudgetExhaustedError, BudgetManager, PrivacyBudget, PureDPEvent
from dp_icl_plugin.accounting import GaussianEvent, InMemoryStore, LedgerStore, SQLiteStore, TightestAccountant, rdp
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me

BUDGET = PrivacyBudget(epsilon=8.0, delta=1e-5)
MIX: list[tuple[str, ev.DPEvent]] = [
    ("pta:token", me.tang_event(noise_multiplier=3.0, sampling_rate=20 / 30_000, steps=1)),
    (
        "clip-blend:token",
        ev.ExponentialMechanismEvent(
            me.clip_blend_token_epsilon(clip=10, subset_size=380, temperature=2.1), neighbouring="replace_one"
        ),
    ),
    ("knn:vote", PureDPEvent(1e-4, neighbouring="replace_one")),
    ("stats:gaussian", GaussianEvent(noise_multiplier=400.0, neighbouring="replace_one")),
]


def fill(store: LedgerStore, n: int) -> None:
    store.initialize(BUDGET)
    with store.transaction() as tx:
        for i in range(n):
            label, event = MIX[i % len(MIX)]
            tx.append(timestamp=time.time(), label=label, event_key=ev.event_key(event), certified_epsilon=0.0)


def time_spends(manager: BudgetManager, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        label, event = MIX[i % len(MIX)]
        start = time.perf_counter()
        manager.spend(event, label=label)
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where the ledger files go (a real disk)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix=".dp-icl-bench-", dir=args.dir))

    rows = []
    stores = (("sqlite", lambda tag: SQLiteStore(tmp / f"{tag}.db")), ("memory", lambda tag: InMemoryStore()))
    for name, make_store in stores:
        results = {}
        for recorded in (0, args.events):
            store = make_store(f"{name}-{recorded}")
            fill(store, recorded)
            rdp._atom_rdp.cache_clear()  # cold start: no cached curves, a fresh accountant
            manager = BudgetManager(BUDGET, ledger=store, accountant=TightestAccountant())
            first = time_spends(manager, 1)[0]
            warm = time_spends(manager, args.calls)
            results[recorded] = (first, statistics.median(warm), statistics.quantiles(warm, n=20)[-1])
            start = time.perf_counter()
            # A charge no cheap bound admits: the tightest (PRV) analysis decides, then refuses.
            with contextlib.suppress(BudgetExhaustedError):
                manager.spend(PureDPEvent(BUDGET.epsilon, neighbouring="replace_one"), label="too-big")
            refusal = (time.perf_counter() - start) * 1000.0
            results[recorded] = (*results[recorded], refusal)
            assert manager.spent().epsilon <= BUDGET.epsilon
            manager.close()
        rows.append((name, results))

    print(f"BudgetManager.spend, {args.calls} calls, budget ε = {BUDGET.epsilon}, δ = {BUDGET.delta}")
    print(f"{'store':<8}{'recorded':>10}{'first ms':>10}{'median ms':>11}{'p95 ms':>9}{'refusal ms':>12}")
    for name, results in rows:
        for recorded, (first, med, p95, refusal) in results.items():
            print(f"{name:<8}{recorded:>10}{first:>10.2f}{med:>11.2f}{p95:>9.2f}{refusal:>12.1f}")
        ratio = results[args.events][1] / results[0][1]
        print(f"{name:<8} median at {args.events} events / median at 0 events = {ratio:.2f}x")
    sqlite_median = rows[0][1][args.events][1]
    verdict = "meets" if sqlite_median < 20.0 else "MISSES"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"target: < 20 ms per spend at {args.events} events (SQLite): {sqlite_median:.2f} ms, {verdict} the target")


if __name__ == "__main__":
    main()
