"""Releases per second of the private kNN retriever on each store: memory, an SQLite directory, PostgreSQL.

One host (process) answers ``--queries`` vote releases; then ``--hosts`` processes share the same index (an
SQLite directory on this machine, or the PostgreSQL database several machines would share) and answer
``--queries`` each at once. Every release embeds the query, refreshes the host's FAISS copy, finds the
candidates above the threshold, charges their units in the filter (one transaction, the units' rows locked),
charges the ledger and reads the used records. Embeddings are hashed bags of words (no model), so the figures
are the storage path's; a real embedder adds its own time per query on every store alike.

    python benchmarks/knn/hosts.py [--records 2000] [--queries 200] [--hosts 4] [--postgres DSN]

Without ``--postgres`` a throw-away PostgreSQL server is started (``tests/postgres_server.py``, fsync on, as
durable as SQLite's ``synchronous=FULL``). Writes ``results/hosts.md`` and ``results/hosts.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from dp_icl_plugin import BudgetManager, PrivacyBudget  # noqa: E402
from dp_icl_plugin.accounting import IndividualBudget  # noqa: E402
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN  # noqa: E402

LABELS = ["business", "sports", "world", "tech"]
BUDGET = IndividualBudget(epsilon=2.0, delta=1e-5)
WARM_UP = 20  # untimed releases per host first (imports, FAISS and connection set-up)
CONFIG = KNNConfig(k=8, shards=4, min_similarity=0.5, uses=1000)  # a record pays for ~1000 releases


class HashedBag:
    """Words hashed into 64 dimensions (deterministic in every process)."""

    name = "hashed-bag-64"

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, sum(map(ord, word)) % 63] += 1.0
            out[i, 63] = 0.5
        return out


def texts(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(300)]
    labels = [LABELS[i % 4] for i in range(n)]
    return [f"{lab} " + " ".join(rng.choice(vocab, 12)) for lab in labels], labels


def answer(where: str, name: str, queries: int, seed: int, out, ready) -> None:
    index = PrivateIndex.open(where, name=name, embedder=HashedBag())
    retriever = PrivateKNN(index, budget=BudgetManager(PrivacyBudget(1e9, 1e-3)), labels=LABELS, config=CONFIG)
    questions, _ = texts(queries, seed)
    rng = np.random.default_rng(seed)
    for q in texts(WARM_UP, seed + 1000)[0]:
        retriever.vote(q, rng=rng)  # warm-up, not timed
    ready.wait()  # every host has opened the index (start-up is not timed)
    started = time.perf_counter()
    for q in questions:
        retriever.vote(q, rng=rng)
    out.put(time.perf_counter() - started)


def run(where: str, name: str, hosts: int, queries: int) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Barrier(hosts + 1)
    procs = [ctx.Process(target=answer, args=(where, name, queries, 100 + h, out, ready)) for h in range(hosts)]
    for p in procs:
        p.start()
    ready.wait(timeout=600)
    started = time.perf_counter()
    for _ in procs:
        out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    return hosts * queries / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--postgres", help="a database DSN (default: start a throw-away server)")
    args = parser.parse_args()
    begun = time.perf_counter()
    corpus, labels = texts(args.records, 0)
    rows = []
    with ExitStack() as stack:
        dsn = args.postgres
        if dsn is None:
            from postgres_server import running

            dsn = stack.enter_context(running(fast=False)).create_database()
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stores = {"sqlite": (str(tmp / "index"), "default"), "postgres": (dsn, f"hosts-{time.time_ns()}")}
        memory = PrivateIndex(budget=BUDGET, embedder=HashedBag())
        memory.add(corpus, labels=labels)
        paid = [0]
        charge = memory.charge

        def counted(candidates, cost_of):
            admitted = charge(candidates, cost_of)
            paid[0] += len(admitted)  # the workload: records that pay per release
            return admitted

        memory.charge = counted  # type: ignore[method-assign]
        knn = PrivateKNN(memory, budget=BudgetManager(PrivacyBudget(1e9, 1e-3)), labels=LABELS, config=CONFIG)
        rng = np.random.default_rng(1)
        questions, _ = texts(args.queries, 100)
        for q in texts(WARM_UP, 1100)[0]:
            knn.vote(q, rng=rng)  # warm-up, not timed
        paid[0] = 0
        started = time.perf_counter()
        for q in questions:
            knn.vote(q, rng=rng)
        rows.append({"store": "memory", "hosts": 1, "releases_per_s": args.queries / (time.perf_counter() - started)})
        payers = paid[0] / args.queries
        for store, (where, name) in stores.items():
            index = PrivateIndex(budget=BUDGET, embedder=HashedBag(), path=where, name=name)
            index.add(corpus, labels=labels)
            for hosts in (1, args.hosts):
                rate = run(where, name, hosts, args.queries)
                rows.append({"store": store, "hosts": hosts, "releases_per_s": rate})
                print(f"{store:8s} {hosts} host(s): {rate:8.1f} releases/s", flush=True)
    base = rows[0]["releases_per_s"]
    lines = [
        "# Private kNN releases per second by store",
        "",
        f"`python benchmarks/knn/hosts.py --records {args.records} --queries {args.queries} --hosts {args.hosts}`"
        f" on {platform.machine()} with {mp.cpu_count()} cores, one run (vote releases, min_similarity "
        f"{CONFIG.min_similarity}: {payers:.1f} records paid per release, hashed-bag embeddings, {WARM_UP} untimed "
        "releases per host first). Processes on one machine stand in for hosts; the PostgreSQL server (fsync on) "
        f"shares the same cores. {time.perf_counter() - begun:.0f} s in all.",
        "",
        "| store | hosts | releases/s (all hosts) | vs memory, 1 host |",
        "|---|---:|---:|---:|",
        *[
            f"| {r['store']} | {r['hosts']} | {r['releases_per_s']:.1f} | {r['releases_per_s'] / base:.2f}× |"
            for r in rows
        ],
    ]
    results = HERE / "results"
    (results / "hosts.md").write_text("\n".join(lines) + "\n")
    (results / "hosts.json").write_text(
        json.dumps({"args": vars(args), "paid_per_release": payers, "rows": rows}, indent=2) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
