"""Why keyword-space aggregation fails its stability test on E2E: the shards agree, and agreement ties the top.

For a few E2E test MRs, the k nearest dev pairs (MiniLM) are split into shards of 4, SmolLM2-135M-Instruct
answers each shard greedily (as :meth:`PrivateKNN.answer` does, without any charge: this is a diagnosis on
public benchmark data, not a release), and the script prints each MR's keyword histogram head (how many shard
answers hold each token) and the stability distance of the top-k keyword set for several k
(:func:`~dp_icl_plugin.mechanisms.keyword_ptr.stability_distance`; PTR passes only when the noisy distance
exceeds σ·Φ⁻¹(1 − δ₀), printed for the benchmark's settings). It also prints the threshold T of the
threshold release that replaced PTR as the default (in shards, for m keywords per answer; for SmolLM2's
vocabulary and for the 1,517-token copy model of ``benchmarks/audit``), and how many of the 4,672 records are
at least τ similar to a query (they all pay for its release).

    python benchmarks/knn/keyword_ties.py [--queries 3] [--shards 20]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=25)
    args = parser.parse_args()
    from run import load
    from scipy.stats import norm

    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.backends.generation import greedy_generate
    from dp_icl_plugin.backends.loading import load_backend
    from dp_icl_plugin.mechanisms.keyword_ptr import stability_distance
    from dp_icl_plugin.mechanisms.keyword_threshold import keyword_threshold, threshold_sensitivity
    from dp_icl_plugin.retrieval import AnswerPrompt, default_embedder, noise_for_uses
    from dp_icl_plugin.retrieval.embedding import embed_texts

    for epsilon in (1.0, 4.0, 8.0):
        for uses in (1, 4):
            budget = IndividualBudget(epsilon=epsilon, delta=1e-5)
            sigma = noise_for_uses(budget, uses=uses, sensitivity=1.0)
            delta0 = float(budget.approximate_delta or 0.0) / uses
            print(f"ε = {epsilon:g}, uses = {uses}: PTR threshold {sigma * norm.isf(delta0):.1f} shards")
    dev, test = load()
    mrs = sorted(test)[: args.queries * 4 : 4]
    backend = load_backend("smollm2-135m-instruct")
    for vocab, uses_list, label in ((backend.vocab_size, (1, 4), "SmolLM2"), (1517, (20,), "copy model")):
        for epsilon in (1.0, 4.0, 8.0):
            for uses in uses_list:
                budget = IndividualBudget(epsilon=epsilon, delta=1e-5)
                t = {
                    m: keyword_threshold(noise_for_uses(budget, uses=uses, sensitivity=threshold_sensitivity(m)), vocab)
                    for m in (1, 2, 4, 8)
                }
                print(
                    f"threshold release, {label} (|V| = {vocab}), ε = {epsilon:g}, uses = {uses}: T in shards by m "
                    + ", ".join(f"{m}: {v:.1f}" for m, v in t.items())
                )
    model = default_embedder()
    pool_x, pool_a = [mr for mr, _ in dev], [ref for _, ref in dev]
    pool_v, query_v = embed_texts(model, pool_x, batch_size=128), embed_texts(model, mrs)
    sims = query_v @ pool_v.T
    print(
        f"records at least τ similar to a query (mean over {len(mrs)} MRs, of {len(pool_x)}): "
        + ", ".join(f"τ = {tau}: {(sims >= tau).sum(axis=1).mean():.1f}" for tau in (0.3, 0.5, 0.7))
    )
    prompt = AnswerPrompt(context_prefix="Data:", question_prefix="Data:", answer_prefix="Sentence:")
    for mr, v in zip(mrs, query_v, strict=True):
        nearest = np.argsort(-(pool_v @ v))[: 4 * args.shards]
        shards = [[(pool_x[i], pool_a[i]) for i in nearest[s :: args.shards]] for s in range(args.shards)]
        answers = greedy_generate(backend, [prompt.render(d, mr) for d in shards], max_new_tokens=args.max_tokens)
        counts: Counter[int] = Counter()
        for tokens in answers:
            counts.update(t for t in set(tokens) if backend.decode([t]).strip())
        head = [(backend.decode([t]).strip(), c) for t, c in counts.most_common(8)]
        ids = np.array(list(counts), dtype=np.int64)
        cnt = np.array([counts[t] for t in ids], dtype=np.int64)
        distances = {k: stability_distance(ids, cnt, k=k, group_size=1) for k in (1, 2, 4, 8)}
        print(f"{mr[:70]}\n  top counts of {args.shards} shards: {head}\n  stability distance by k: {distances}")


if __name__ == "__main__":
    main()
