"""Private kNN label voting on real data: accuracy against ε (kNN DP-ICL paper, Fig. 1 "nearest neighbour only").

Data (``../shared/data``): TREC coarse labels (pool: the 5,452 training questions; queries: the test set) and
AG News (the 7,600-row test file shuffled once: 7,400 pool records, the rest queries). Embeddings: the real
all-MiniLM-L6-v2 (384-d, unit length). 200 queries answered in sequence, per-record budget (ε, δ = 1e-5),
5 seeds (noise and subsampling; the queries are the same), ε ∈ {0.5, 1, 2, 4, 8}. Every method votes over the
labels of k = 40 neighbours with report-noisy-max (Gaussian noise):

- **kNN, no privacy**: the plain majority of the 40 nearest records (ε = ∞).
- **NN-only DP vote (ours)**: :class:`PrivateKNN.vote`. Every active record with cosine similarity
  ≥ τ pays (the provable individual filter); the 40 most similar of them vote. ``uses`` sets the noise so
  that a record can take part in that many releases (1: "each record used about once", as the paper; 4:
  a larger setting).
- **Paper's charging (no valid guarantee)**: the same vote, but only the 40 records actually used pay,
  as the kNN DP-ICL paper does; shown to measure what the provable charging costs.
- **Random-subsample DP vote** (Private-kNN, Zhu et al. 2020; Wu et al.'s Poisson subsampling): each query
  Poisson-samples the pool at rate q = 0.1 and takes the 40 nearest of the sample; the 200 queries are
  composed with PRV accounting at (ε, δ) for the whole dataset.

    python benchmarks/knn/accuracy.py              # ≈ 5 minutes on 2 CPU cores
    python benchmarks/knn/accuracy.py --quick      # 1 seed, 100 queries, TREC only
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1].parent / "shared" / "data"
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
K = 40
SUBSAMPLE_RATE = 0.1
THRESHOLDS = (0.2, 0.3, 0.4, 0.5)
USES = (1, 4)


def load(name: str, n_queries: int) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    """(pool texts, pool labels, query texts, query labels, label names)."""
    if name == "trec":

        def read(path: Path) -> tuple[list[str], list[str]]:
            lines = path.read_text(encoding="latin-1").splitlines()
            return [ln.split(" ", 1)[1] for ln in lines], [ln.split(" ", 1)[0].split(":")[0] for ln in lines]

        pool_x, pool_y = read(DATA / "trec" / "train.txt")
        test_x, test_y = read(DATA / "trec" / "test.txt")
        order = np.random.default_rng(0).permutation(len(test_x))[:n_queries]
        return pool_x, pool_y, [test_x[i] for i in order], [test_y[i] for i in order], sorted(set(pool_y))
    with open(DATA / "agnews" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    names = {"1": "World", "2": "Sports", "3": "Business", "4": "Sci/Tech"}
    texts = [f"{r['Title']}. {r['Description']}".replace("\\", " ") for r in rows]
    labels = [names[r["Class Index"]] for r in rows]
    order = np.random.default_rng(0).permutation(len(texts))
    queries, pool = order[:n_queries], order[200:]
    return (
        [texts[i] for i in pool],
        [labels[i] for i in pool],
        [texts[i] for i in queries],
        [labels[i] for i in queries],
        list(names.values()),
    )


class Lookup:
    """An 'embedder' returning precomputed MiniLM vectors (so each text is embedded once per run); any other
    text (the index's public probe texts, which fingerprint the embedder) is embedded by ``model``."""

    def __init__(self, texts: list[str], vectors: np.ndarray, model) -> None:
        self.table = dict(zip(texts, vectors, strict=True))
        self.model = model
        self.name = "sentence-transformers/all-MiniLM-L6-v2"

    def __call__(self, texts: list[str]) -> np.ndarray:
        from dp_icl_plugin.retrieval.embedding import embed_texts

        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            self.table.update(zip(missing, embed_texts(self.model, missing), strict=True))
        return np.array([self.table[t] for t in texts])


def subsample_noise(epsilon: float, steps: int) -> float:
    from dp_icl_plugin.accounting import GaussianEvent, PoissonSampledEvent, SelfComposedEvent, calibrate

    result = calibrate(
        lambda s: SelfComposedEvent(
            PoissonSampledEvent(
                SUBSAMPLE_RATE, GaussianEvent(s, math.sqrt(2), neighbouring="add_remove"), neighbouring="add_remove"
            ),
            steps,
        ),
        epsilon=epsilon,
        delta=DELTA,
        lo=0.3,
        hi=200.0,
        grid=0.01,
        accountant="prv",
    )
    return result.value * math.sqrt(2)


def run_dataset(name: str, *, n_queries: int, seeds: int, log) -> list[dict]:
    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN, default_embedder
    from dp_icl_plugin.retrieval.embedding import embed_texts

    pool_x, pool_y, query_x, query_y, names = load(name, n_queries)
    t0 = time.perf_counter()
    model = default_embedder()
    pool_v = embed_texts(model, pool_x, batch_size=128)
    query_v = embed_texts(model, query_x, batch_size=128)
    log(f"{name}: {len(pool_x)} pool records, {len(query_x)} queries embedded in {time.perf_counter() - t0:.0f}s")
    lookup = Lookup(pool_x + query_x, np.vstack([pool_v, query_v]), model)
    label_index = {lab: i for i, lab in enumerate(names)}
    pool_codes = np.array([label_index[y] for y in pool_y])
    truth = np.array([label_index[y] for y in query_y])
    sims = query_v @ pool_v.T
    rows: list[dict] = []

    def add(method: str, epsilon: float, accs: list[float], **extra) -> None:
        rows.append(
            {
                "dataset": name,
                "method": method,
                "epsilon": epsilon,
                "mean": float(np.mean(accs)),
                "std": float(np.std(accs)),
                "runs": accs,
                **extra,
            }
        )
        log(
            f"{name} {method} ε = {epsilon:g}: {100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f}"
            + "".join(f" {k}={v}" for k, v in extra.items())
        )

    top = np.argsort(-sims, axis=1)[:, :K]
    majority = [np.bincount(pool_codes[row], minlength=len(names)).argmax() for row in top]
    add("kNN, no privacy", math.inf, [float(np.mean(np.array(majority) == truth))])

    for epsilon in EPSILONS:
        budget = IndividualBudget(epsilon=epsilon, delta=DELTA)
        for tau in THRESHOLDS:
            for uses in USES:
                accs, paid, short = [], [], []
                for seed in range(seeds):
                    index = PrivateIndex(budget=budget, embedder=lookup)
                    index.add(pool_x, labels=pool_y)
                    ledger = BudgetManager(PrivacyBudget(epsilon, DELTA, neighbouring="add_remove"))
                    config = KNNConfig(k=K, shards=10, min_similarity=tau, uses=uses)
                    retriever = PrivateKNN(index, budget=ledger, labels=names, config=config)
                    rng = np.random.default_rng(seed)
                    hits, payers = 0, [0]
                    charge = index.charge

                    def counted(candidates, cost_of, charge=charge, payers=payers):
                        admitted = charge(candidates, cost_of)
                        payers[0] += len(admitted)  # the records that paid (ledger labels name no count)
                        return admitted

                    index.charge = counted  # type: ignore[method-assign]
                    for text, y in zip(query_x, query_y, strict=True):
                        retrieval = retriever.retrieve(text, release="vote")
                        short.append(not retrieval.complete)
                        hits += retriever.vote(retrieval, rng=rng).label == y
                    paid.append(payers[0] / len(query_x))
                    accs.append(hits / len(query_x))
                payers, short_share = round(float(np.mean(paid)), 1), round(float(np.mean(short)), 2)
                add(
                    f"NN-only DP vote (ours), τ = {tau}, uses = {uses}",
                    epsilon,
                    accs,
                    payers_per_query=payers,
                    short_share=short_share,
                )
        for uses in USES:
            accs = []
            for seed in range(seeds):
                index = PrivateIndex(budget=budget, embedder=lookup)
                index.add(pool_x, labels=pool_y)
                ledger = BudgetManager(PrivacyBudget(epsilon, DELTA, neighbouring="add_remove"))
                retriever = PrivateKNN(index, budget=ledger, labels=names, config=KNNConfig(k=K, shards=10, uses=uses))
                cost = retriever._cost("vote", 1)
                rng = np.random.default_rng(seed)
                hits = 0
                for qv, t in zip(query_v, truth, strict=True):
                    used = index.charge(index.search(qv, K), lambda c, cost=cost: cost)  # only the k used pay
                    counts = np.bincount(pool_codes[used.ids - 1], minlength=len(names)).astype(float)
                    hits += report_noisy_max(counts, noise_std=retriever.noise_std, rng=rng) == t
                accs.append(hits / len(query_x))
            add(f"paper's charging (no valid guarantee), uses = {uses}", epsilon, accs)
        sigma = subsample_noise(epsilon, len(query_x))
        accs = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            hits = 0
            for row, t in zip(sims, truth, strict=True):
                mask = np.flatnonzero(rng.random(len(pool_codes)) < SUBSAMPLE_RATE)
                nearest = mask[np.argsort(-row[mask])[:K]]
                counts = np.bincount(pool_codes[nearest], minlength=len(names)).astype(float)
                hits += report_noisy_max(counts, noise_std=sigma, rng=rng) == t
            accs.append(hits / len(query_x))
        add(f"random-subsample DP vote, q = {SUBSAMPLE_RATE}", epsilon, accs, noise_std=round(sigma, 2))
    return rows


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Command: `{meta['command']}` ({meta['seconds'] / 60:.1f} min). Accuracy (%) over {meta['queries']} "
        f"queries, mean ± std over {meta['seeds']} seeds; per-record (ε, δ = {DELTA}).",
        "",
    ]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        lines += [
            f"### {dataset}",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |",
            "|---|" + "---:|" * len(EPSILONS),
        ]
        methods = dict.fromkeys(r["method"] for r in rows if r["dataset"] == dataset)
        for method in methods:
            cells = {r["epsilon"]: r for r in rows if r["dataset"] == dataset and r["method"] == method}
            if math.inf in cells:
                value = f"{100 * cells[math.inf]['mean']:.1f}"
                lines.append(f"| {method} | " + " | ".join([value] * len(EPSILONS)) + " |")
                continue
            cell = [
                f"{100 * cells[e]['mean']:.1f} ± {100 * cells[e]['std']:.1f}" if e in cells else "" for e in EPSILONS
            ]
            lines.append(f"| {method} | " + " | ".join(cell) + " |")
        payers = [
            (r["method"], r["epsilon"], r["payers_per_query"], r["short_share"])
            for r in rows
            if r["dataset"] == dataset and "payers_per_query" in r
        ]
        if payers:
            lines += [
                "",
                "Records charged per query (mean) and share of queries with fewer than k = 40 records:",
                "",
                "| method | ε | charged per query | short |",
                "|---|---:|---:|---:|",
            ]
            lines += [f"| {m} | {e:g} | {p} | {s} |" for m, e, p, s in payers if e in (1.0, 8.0)]
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        chosen = [
            m
            for m in dict.fromkeys(r["method"] for r in rows if r["dataset"] == dataset)
            if "τ = 0.3" in m or "paper" in m or "subsample" in m
        ]
        for method in chosen:
            pts = sorted(
                (r["epsilon"], r["mean"], r["std"]) for r in rows if r["dataset"] == dataset and r["method"] == method
            )
            e, m, s = (np.array(v) for v in zip(*pts, strict=True))
            ax.errorbar(e, 100 * m, yerr=196 * s, marker="o", capsize=3, label=method)
        base = [r["mean"] for r in rows if r["dataset"] == dataset and r["method"] == "kNN, no privacy"]
        ax.axhline(100 * base[0], color="k", linestyle="--", label="kNN, no privacy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("per-record ε")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(dataset)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 100 queries, TREC only")
    parser.add_argument("--datasets", default=None, help="trec,agnews (default both; quick: trec)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if not DATA.is_dir():
        print(f"the datasets are not at {DATA}; nothing to run", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    datasets = (args.datasets or ("trec" if args.quick else "trec,agnews")).split(",")
    seeds = args.seeds or (1 if args.quick else 5)
    queries = args.queries or (100 if args.quick else 200)
    rows = [row for name in datasets for row in run_dataset(name, n_queries=queries, seeds=seeds, log=log)]
    meta = {
        "command": "python benchmarks/knn/accuracy.py" + (" --quick" if args.quick else ""),
        "seeds": seeds,
        "queries": queries,
        "k": K,
        "delta": DELTA,
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "accuracy_quick" if args.quick else "accuracy"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")
    table = to_markdown(rows, meta)
    (args.out / f"{stem}.md").write_text(table + "\n")
    plot(rows, args.out / f"{stem}.png")
    print(table)
    print(f"\ntotal time: {meta['seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
