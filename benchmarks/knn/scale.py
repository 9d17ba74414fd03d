"""Private kNN at scale: filtered private search against raw FAISS, filter updates, memory, persistence.

Synthetic records: random unit vectors in 384 dimensions (the MiniLM width), one unit per record. For each
size the script builds a :class:`PrivateIndex` on disk, exhausts a share of the records through the filter,
then measures side by side in one run:

- query throughput of the index's masked search (exhausted records skipped with an ``IDSelectorBitmap``)
  and of a raw ``IndexFlatIP`` over the same vectors (one query at a time, k = 40): the ratio;
- a release's filter update (charge 40 units in one SQLite transaction), per release;
- memory per record (FAISS vectors, in-process arrays, the SQLite files on disk);
- the time to reopen the index (SQLite → FAISS, filter state, mask).

    python benchmarks/knn/scale.py                   # 100,000 and 1,000,000 records
    python benchmarks/knn/scale.py --sizes 20000     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIM = 384
K = 40


class VectorTable:
    """An 'embedder' that returns precomputed vectors for texts of the form 'r<row>' (no model needed)."""

    name = "synthetic-unit-vectors"

    def __init__(self, vectors: np.ndarray) -> None:
        self.vectors = vectors

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.vectors[[int(t[1:]) for t in texts]]


def timed(fn, repeats: int) -> float:
    t0 = time.perf_counter()
    for i in range(repeats):
        fn(i)
    return (time.perf_counter() - t0) / repeats


def interleaved(first, second, repeats: int) -> tuple[float, float]:
    """Mean seconds of two calls timed alternately on the same inputs (after one warm-up each), so that
    cache and clock effects fall on both alike."""
    first(0)
    second(0)
    a = b = 0.0
    for i in range(repeats):
        t0 = time.perf_counter()
        first(i)
        t1 = time.perf_counter()
        second(i)
        t2 = time.perf_counter()
        a, b = a + t1 - t0, b + t2 - t1
    return a / repeats, b / repeats


def run(size: int, *, queries: int, exhausted_share: float, workdir: Path, log) -> dict[str, float]:
    import faiss

    from dp_icl_plugin import GaussianEvent
    from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost
    from dp_icl_plugin.retrieval import PrivateIndex
    from dp_icl_plugin.retrieval.index import Candidates
    from dp_icl_plugin.retrieval.retriever import noise_for_uses

    rng = np.random.default_rng(size)
    vectors = rng.normal(size=(size, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    table = VectorTable(vectors)
    budget = IndividualBudget(epsilon=1.0, delta=1e-6)
    root = workdir / f"index-{size}"
    t0 = time.perf_counter()
    index = PrivateIndex(budget=budget, embedder=table, path=root)
    for start in range(0, size, 50_000):
        index.add([f"r{i}" for i in range(start, min(size, start + 50_000))])
    build = time.perf_counter() - t0
    log(f"{size:,}: built in {build:.1f}s")

    # Exhaust a share of the records: one charge that uses up every order's cap.
    noise = noise_for_uses(budget, uses=1, sensitivity=1.0)
    full = ReleaseCost.of(GaussianEvent(noise, neighbouring="add_remove"), budget.orders)
    n_out = int(exhausted_share * size)
    out_ids = rng.choice(np.arange(1, size + 1), size=n_out, replace=False)
    for start in range(0, n_out, 20_000):
        chunk = out_ids[start : start + 20_000]
        index.charge(Candidates(chunk, np.ones(len(chunk), dtype=np.float32)), lambda c: full)

    q = rng.normal(size=(queries, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    raw = faiss.IndexFlatIP(DIM)
    raw.add(vectors)
    raw_s, private_s = interleaved(lambda i: raw.search(q[i : i + 1], K), lambda i: index.search(q[i], K), queries)
    within_s = timed(lambda i: index.within(q[i], 0.2), queries)
    found = index.search(q[0], K)
    assert not set(found.ids.tolist()) & set(out_ids.tolist())

    light = ReleaseCost.of(GaussianEvent(200.0, neighbouring="add_remove"), budget.orders)
    active = np.setdiff1d(np.arange(1, size + 1), out_ids)
    batches = [rng.choice(active, size=K, replace=False) for _ in range(51)]
    index.charge(Candidates(batches[50], np.ones(K, dtype=np.float32)), lambda c: light)  # a new, cheaper floor
    update_s = timed(lambda i: index.charge(Candidates(batches[i], np.ones(K, dtype=np.float32)), lambda c: light), 50)

    disk = sum(f.stat().st_size for f in root.iterdir())
    in_process = vectors.nbytes + index._unit_of.nbytes + index._active.nbytes + index._bitmap.nbytes
    index = None  # drop the first handle before reopening
    t0 = time.perf_counter()
    reopened = PrivateIndex.open(root, embedder=table)
    load = time.perf_counter() - t0
    assert len(reopened) == size
    np.testing.assert_array_equal(reopened.search(q[0], K).ids, found.ids)
    result = {
        "records": size,
        "exhausted_share": exhausted_share,
        "raw_flat_queries_per_s": 1 / raw_s,
        "private_search_queries_per_s": 1 / private_s,
        "private_vs_raw": raw_s / private_s,
        "private_within_queries_per_s": 1 / within_s,
        "filter_update_ms_per_release": 1000 * update_s,
        "memory_bytes_per_record_in_process": in_process / size,
        "disk_bytes_per_record": disk / size,
        "build_s": build,
        "open_s": load,
    }
    log(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
    shutil.rmtree(root)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--exhausted-share", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads (the same for both searches)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DP_ICL_BENCH_TMP")) as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(
                run(size, queries=args.queries, exhausted_share=args.exhausted_share, workdir=Path(tmp), log=log)
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps({"threads": args.threads, "k": K, "rows": rows}, indent=2) + "\n")
    lines = [
        "| records | raw flat q/s | private search q/s | ratio | within(τ=0.2) q/s | filter update ms/release "
        "| memory B/record | disk B/record | open s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['records']:,} | {r['raw_flat_queries_per_s']:.1f} | {r['private_search_queries_per_s']:.1f} | "
            f"{r['private_vs_raw']:.2f}× | {r['private_within_queries_per_s']:.1f} | "
            f"{r['filter_update_ms_per_release']:.2f} | {r['memory_bytes_per_record_in_process']:.0f} | "
            f"{r['disk_bytes_per_record']:.0f} | {r['open_s']:.1f} |"
        )
    table = "\n".join(lines)
    (args.out / "scale.md").write_text(table + "\n")
    print(table)
    print(f"\ntotal time: {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
