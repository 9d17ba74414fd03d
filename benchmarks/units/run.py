"""Record-level against unit-level ("user-level") privacy at the same ε, on real text: what contribution bounding
and protecting a whole person cost.

Two parts (``--parts trec,e2e``):

1. **TREC, private kNN vote** (:meth:`PrivateKNN.vote`, the real all-MiniLM-L6-v2; the settings of
   ``benchmarks/knn/accuracy.py``: k = 40, τ = 0.3, uses = 4, δ = 1e-5, add/remove). Private records: the 5,452
   TREC training questions, assigned to ``--users`` synthetic users (default 500) with Zipf-like sizes
   (size ∝ 1/rank^``--zipf``, each user at least one record; the assignment is a seeded random permutation cut
   into those sizes, fixed across the DP seeds). Queries: 200 TREC test questions (``accuracy.load``'s fixed
   sample), answered in sequence against one index per (ε, seed).

   - record-level: a per-record index on a record-level ledger (each record is protected at ε; a user with m
     records only at about m·ε, by group privacy);
   - unit-level: ``PrivateIndex(..., group_by_user=True)`` with ``user_ids=`` the users, on a
     ``PrivacyBudget(..., privacy_unit="unit")`` ledger (each user is protected at ε);
   - the non-private kNN (majority of the 40 nearest) and the majority class, for reference.

2. **E2E, DPS-MOZO online decoding** (:class:`MozoDecoder` on SmolLM2-135M-Instruct, the layout, scorer and
   query sampling of ``benchmarks/e2e/run.py``). Private records: the 4,672 E2E dev pairs; unit: the
   restaurant (``name[...]`` of the MR; 20 units of 18 to 679 records). δ = 1/4,672 for both ledgers,
   replace-one. Rows: zero-shot greedy, zero-shot sampled and zero-shot at temperature 1/4 (DPS-MOZO's public
   centre softmax(4·ℓ0), where its output goes as β → 0; no private data), DPS-MOZO+On on a record-level
   ledger (q = 4/4,672) and on a unit-level ledger with ``records_per_unit = 1`` (q = 4/20) at each ε, and the
   ε = ∞ ensemble (no noise, NOT private) drawing records (record level) or units with one random record each
   (unit level: :meth:`MozoOfflineSynthesizer.synthesize_nonprivate` with ``privacy_unit="unit"``), which
   measures what contribution bounding alone costs.

    .venv/bin/python benchmarks/units/run.py                 # the full table (see RESULTS.md for time)
    .venv/bin/python benchmarks/units/run.py --quick         # every row, tiny: under 2 minutes
    .venv/bin/python benchmarks/units/run.py --rebuild benchmarks/units/results/units.json
        # a run stopped between E2E seeds (its rows are saved after each seed): its tables from the seeds done

Writes ``results/units.json`` (every number and answer, the command, machine and settings) and
``results/units.md`` (the tables); ``--quick`` writes to ``results-quick/`` instead.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import platform
import re
import sys
import time
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent

TREC_EPSILONS = (1.0, 4.0, 8.0)
TREC_DELTA = 1e-5
K, SHARDS, TAU, USES = 40, 10, 0.3, 4  # benchmarks/knn/accuracy.py's table row (τ = 0.3, uses = 4)
E2E_EPSILONS = (2.0, 4.0)
N_SHOTS, TOP_K = 4, 100  # DPS-MOZO Table 4 (E2E), as benchmarks/e2e
CENTRE = "zero-shot at temperature 1/4 (DPS-MOZO's β → 0 limit)"
ORDERS = {1.0: 14.0, 2.0: 8.0, 4.0: 5.0}  # benchmarks/e2e: DPS-MOZO §5.1, α with ε(α) ≈ ε/2


@functools.cache
def _module(name: str, path: Path):
    """Import a sibling benchmark's file under its own name (both it and this file are called run.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def knn_bench():
    return _module("knn_accuracy", BENCH / "knn" / "accuracy.py")


def e2e_bench():
    return _module("e2e_run", BENCH / "e2e" / "run.py")


# ---------------------------------------------------------------------------------------------------------------
# users


def zipf_sizes(n_records: int, n_users: int, exponent: float) -> np.ndarray:
    """User sizes ∝ 1/rank^exponent summing to ``n_records``, each at least 1 (largest remainders rounding)."""
    if n_users > n_records:
        raise SystemExit(f"{n_users} users for {n_records} records: every user needs a record")
    weights = np.arange(1, n_users + 1, dtype=float) ** -exponent
    raw = n_records * weights / weights.sum()
    sizes = np.maximum(1, np.floor(raw).astype(int))
    left = n_records - int(sizes.sum())
    if left > 0:
        for i in np.argsort(-(raw - np.floor(raw)), kind="stable")[:left]:
            sizes[i] += 1
    while left < 0:  # the floor of 1 overshot: take from the largest users
        sizes[int(np.argmax(sizes))] -= 1
        left += 1
    assert sizes.sum() == n_records and sizes.min() >= 1
    return sizes


def assign_users(n_records: int, sizes: np.ndarray, seed: int) -> list[str]:
    """Each record's user: a seeded random permutation of the records cut into ``sizes`` (user 0 the largest)."""
    order = np.random.default_rng(seed).permutation(n_records)
    users = [""] * n_records
    start = 0
    for rank, size in enumerate(sizes):
        for i in order[start : start + size]:
            users[int(i)] = f"user-{rank:03d}"
        start += int(size)
    return users


def group_privacy(epsilon: float, delta: float, m: int) -> tuple[float, float]:
    """(ε, δ)-DP for one record gives (mε, m·e^((m−1)ε)·δ) for m records (group privacy, add/remove); that δ
    capped at 1 (no guarantee)."""
    log_delta = math.log(m) + (m - 1) * epsilon + math.log(delta)
    return m * epsilon, 1.0 if log_delta >= 0 else math.exp(log_delta)


# ---------------------------------------------------------------------------------------------------------------
# part 1: TREC kNN vote


def run_trec(args, log: Callable[[str], None]) -> dict:
    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN, default_embedder
    from dp_icl_plugin.retrieval.embedding import embed_texts

    knn = knn_bench()
    pool_x, pool_y, query_x, query_y, names = knn.load("trec", args.queries)
    if args.pool:
        pool_x, pool_y = pool_x[: args.pool], pool_y[: args.pool]
    sizes = zipf_sizes(len(pool_x), args.users, args.zipf)
    users = assign_users(len(pool_x), sizes, args.assign_seed)
    stats = {
        "users": len(sizes),
        "records": len(pool_x),
        "zipf_exponent": args.zipf,
        "assign_seed": args.assign_seed,
        "largest": int(sizes.max()),
        "median": float(np.median(sizes)),
        "mean": float(sizes.mean()),
        "users_with_one_record": int((sizes == 1).sum()),
        "top10_share": float(sizes[:10].sum() / sizes.sum()),
        "sizes_head": [int(s) for s in sizes[:10]],
    }
    log(
        f"trec: {len(pool_x)} records over {len(sizes)} users (Zipf {args.zipf}): largest {stats['largest']}, "
        f"median {stats['median']:g}, mean {stats['mean']:.1f}, {stats['users_with_one_record']} users with one "
        f"record, top 10 users hold {100 * stats['top10_share']:.0f} %; first sizes {stats['sizes_head']}"
    )
    t0 = time.perf_counter()
    model = default_embedder()
    pool_v = embed_texts(model, pool_x, batch_size=128)
    query_v = embed_texts(model, query_x, batch_size=128)
    log(f"trec: {len(pool_x)} records and {len(query_x)} queries embedded in {time.perf_counter() - t0:.0f}s")
    lookup = knn.Lookup(pool_x + query_x, np.vstack([pool_v, query_v]), model)
    label_index = {lab: i for i, lab in enumerate(names)}
    pool_codes = np.array([label_index[y] for y in pool_y])
    truth = np.array([label_index[y] for y in query_y])
    sims = query_v @ pool_v.T
    top = np.argsort(-sims, axis=1)[:, :K]
    majority_knn = np.array([np.bincount(pool_codes[row], minlength=len(names)).argmax() for row in top])
    majority_class = int(np.bincount(pool_codes, minlength=len(names)).argmax())
    candidates_fresh = float(np.mean((sims >= TAU).sum(axis=1)))
    rows: list[dict] = [
        {
            "method": "kNN, no privacy (40 nearest, majority)",
            "epsilon": math.inf,
            "runs": [float(np.mean(majority_knn == truth))],
        },
        {
            "method": f"majority class ({names[majority_class]}), no data per query",
            "epsilon": 0.0,
            "runs": [float(np.mean(truth == majority_class))],
        },
    ]
    for r in rows:
        log(f"trec {r['method']}: {100 * r['runs'][0]:.1f}")
    log(f"trec: records with cosine ≥ τ = {TAU} per query on the fresh pool: {candidates_fresh:.1f}")

    for epsilon in args.trec_epsilons:
        # (row, the ledger's unit, KNNConfig.records_per_unit: a user's nearest records only, or all of them)
        for level, unit, per_user in (("record", "record", None), ("unit", "unit", None), ("unit-1", "unit", 1)):
            accs, charged, charged_users, refused, used, short, secs = [], [], [], [], [], [], []
            for seed in range(args.trec_seeds):
                t = time.perf_counter()
                grouped = unit == "unit"
                index = PrivateIndex(
                    budget=IndividualBudget(epsilon=epsilon, delta=TREC_DELTA), embedder=lookup, group_by_user=grouped
                )
                index.add(pool_x, labels=pool_y, user_ids=users if grouped else None)
                ledger = BudgetManager(PrivacyBudget(epsilon, TREC_DELTA, neighbouring="add_remove", privacy_unit=unit))
                config = KNNConfig(k=K, shards=SHARDS, min_similarity=TAU, uses=USES, records_per_unit=per_user)
                retriever = PrivateKNN(index, budget=ledger, labels=names, config=config)
                rng = np.random.default_rng(seed)
                tally = {"records": 0, "units": 0, "refused": 0}
                charge = index.charge

                def counted(candidates, cost_of, charge=charge, tally=tally, index=index):
                    admitted = charge(candidates, cost_of)
                    tally["records"] += len(admitted)  # every admitted candidate's unit paid
                    tally["units"] += len(np.unique(index.units_of(admitted.ids)))
                    tally["refused"] += len(candidates) - len(admitted)  # its unit could no longer pay
                    return admitted

                index.charge = counted  # type: ignore[method-assign]
                hits, n_used, n_short = 0, 0, 0
                for text, y in zip(query_x, query_y, strict=True):
                    retrieval = retriever.retrieve(text, release="vote")
                    n_used += len(retrieval)
                    n_short += not retrieval.complete
                    hits += retriever.vote(retrieval, rng=rng).label == y
                spent = ledger.spent()
                if spent.epsilon > epsilon + 1e-9:
                    raise AssertionError(f"{level}-level ledger spent {spent.epsilon} > {epsilon}")
                n = len(query_x)
                accs.append(hits / n)
                charged.append(tally["records"] / n)
                charged_users.append(tally["units"] / n)
                refused.append(tally["refused"] / n)
                used.append(n_used / n)
                short.append(n_short / n)
                secs.append(time.perf_counter() - t)
            row = {
                "method": f"{unit}-level DP vote" + (f", {per_user} nearest record per user" if per_user else ""),
                "level": level,
                "records_per_unit": per_user,
                "epsilon": epsilon,
                "delta": TREC_DELTA,
                "runs": accs,
                "mean": float(np.mean(accs)),
                "std": float(np.std(accs)),
                "records_charged_per_query": float(np.mean(charged)),
                "units_charged_per_query": float(np.mean(charged_users)),
                "candidates_refused_per_query": float(np.mean(refused)),
                "records_voting_per_query": float(np.mean(used)),
                "short_share": float(np.mean(short)),
                "noise_std": float(retriever.noise_std),
                "seconds_per_seed": float(np.mean(secs)),
            }
            rows.append(row)
            log(
                f"trec {row['method']} ε = {epsilon:g}: {100 * row['mean']:.1f} ± {100 * row['std']:.1f} "
                f"({args.trec_seeds} seeds; charged {row['records_charged_per_query']:.1f} records / "
                f"{row['units_charged_per_query']:.1f} units per query, refused "
                f"{row['candidates_refused_per_query']:.1f}, voting {row['records_voting_per_query']:.1f}, "
                f"short {row['short_share']:.2f}; {row['seconds_per_seed']:.0f}s per seed)"
            )
    for r in rows:
        r.setdefault("mean", float(np.mean(r["runs"])))
        r.setdefault("std", float(np.std(r["runs"])))
    group = {
        str(m): {f"{e:g}": list(group_privacy(e, TREC_DELTA, m)) for e in args.trec_epsilons}
        for m in sorted({1, int(np.median(sizes)), int(sizes[49]), int(sizes[9]), int(sizes.max())})
    }
    return {
        "users": stats,
        "queries": len(query_x),
        "seeds": args.trec_seeds,
        "candidates_per_query_fresh": candidates_fresh,
        "group_privacy_of_record_level": group,
        "rows": rows,
    }


def trec_table(part: dict) -> str:
    eps = sorted({r["epsilon"] for r in part["rows"] if 0 < r["epsilon"] < math.inf})
    lines = [
        f"TREC accuracy (%), {part['queries']} test questions, mean ± std over {part['seeds']} seeds "
        f"(n = {part['queries']} per seed):",
        "",
        "| method | guarantee | " + " | ".join(f"ε = {e:g}" for e in eps) + " |",
        "|---|---|" + "---:|" * len(eps),
    ]
    for r in part["rows"]:
        if not 0 < r["epsilon"] < math.inf:
            value = f"{100 * r['mean']:.1f}"
            lines.append(f"| {r['method']} | none | " + " | ".join([value] * len(eps)) + " |")
    variants = (
        ("record", "record-level DP vote", "(ε, δ) per record"),
        ("unit", "unit-level DP vote, every near record of a user", "(ε, δ) per user"),
        ("unit-1", "unit-level DP vote, each user's nearest record (`records_per_unit=1`)", "(ε, δ) per user"),
    )
    for level, name, what in variants:
        cells = {r["epsilon"]: r for r in part["rows"] if r.get("level") == level}
        if not cells:
            continue  # a run from before the variant
        lines.append(
            f"| {name} | {what} | "
            + " | ".join(f"{100 * cells[e]['mean']:.1f} ± {100 * cells[e]['std']:.1f}" for e in eps)
            + " |"
        )
    lines += [
        "",
        "Per query (mean over queries and seeds): records charged (every admitted candidate with cosine ≥ τ), "
        "units charged, candidates refused (their unit's budget spent), records voting (≤ k = 40):",
        "",
        "| level | ε | records charged | units charged | refused | voting | short of k |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in part["rows"]:
        if "level" in r:
            lines.append(
                f"| {r['level']} | {r['epsilon']:g} | {r['records_charged_per_query']:.1f} | "
                f"{r['units_charged_per_query']:.1f} | {r['candidates_refused_per_query']:.1f} | "
                f"{r['records_voting_per_query']:.1f} | {r['short_share']:.2f} |"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# part 2: E2E DPS-MOZO online


def restaurant(mr: str) -> str:
    found = re.search(r"name\[([^\]]*)\]", mr)
    if found is None:
        raise SystemExit(f"an E2E MR without name[...]: {mr[:60]!r}")
    return found.group(1)


def run_e2e(args, log: Callable[[str], None]) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dp_icl_plugin import BudgetManager, MozoOfflineSynthesizer, PrivacyBudget, PrivateDataset, PrivateRecord
    from dp_icl_plugin.backends.generation import greedy_generate
    from dp_icl_plugin.backends.hf import HFBackend
    from dp_icl_plugin.decoding.decoders import MozoDecoder

    e2e = e2e_bench()
    t0 = time.perf_counter()
    dev, test = e2e.load()
    backend = HFBackend.from_pretrained("smollm2-135m-instruct")
    template = e2e.chat_layout(backend)
    scorer = e2e.Scorer(test)
    records = [PrivateRecord(mr, ref, unit=restaurant(mr)) for mr, ref in dev]
    by_record = PrivateDataset(records)
    by_unit = PrivateDataset(records, records_per_unit=1)
    unit_sizes = sorted(np.unique([r.unit for r in records], return_counts=True)[1].tolist())
    delta = 1.0 / len(dev)
    tokens = args.max_tokens
    log(
        f"e2e: {len(dev)} records, {len(unit_sizes)} restaurants (sizes {unit_sizes[0]}..{unit_sizes[-1]}), "
        f"{len(test)} test MRs; model and scorer loaded in {time.perf_counter() - t0:.0f}s"
    )
    rows: list[dict] = []
    mrs_all = list(test)
    for seed in range(args.e2e_seeds):
        order = np.random.default_rng(1000 + seed).permutation(len(mrs_all))  # benchmarks/e2e's queries
        queries = [mrs_all[i] for i in order[: args.n_test]]

        def row(  # the seed and its queries bound now (B023)
            method: str,
            level: str | None,
            epsilon: float,
            outputs: list[str],
            start: float,
            seed: int = seed,
            queries: list[str] = queries,
            **extra,
        ) -> None:
            rouge, cosine = scorer(queries, outputs)
            each = score_each(scorer, queries, outputs)
            rows.append(
                {
                    "seed": seed,
                    "method": method,
                    "level": level,
                    "epsilon": epsilon,
                    "rouge_l": rouge,
                    "cosine": cosine,
                    "seconds": time.perf_counter() - start,
                    "queries": queries,
                    "outputs": outputs,
                    "rouge_each": each[0],
                    "cosine_each": each[1],
                    **extra,
                }
            )
            log(
                f"  e2e seed {seed} {method:34s} ε={epsilon:<4g} ROUGE-L {rouge:5.1f} cos {cosine:5.1f} "
                f"{rows[-1]['seconds']:5.0f}s  e.g. {outputs[0][:60]!r}"
            )

        def rng_for(tag: int, seed: int = seed) -> np.random.Generator:
            return np.random.default_rng([seed, tag])  # each row its own stream: rows do not depend on order

        t = time.perf_counter()
        prompts = [backend.encode(template.zero_shot_prompt(m), add_special_tokens=True) for m in queries]
        greedy = greedy_generate(backend, prompts, max_new_tokens=tokens, stop=("\n",))
        row("zero-shot greedy", None, 0.0, [backend.decode(o).strip() for o in greedy], t)

        t = time.perf_counter()
        sampled = zero_shot_sampled(backend, prompts, tokens, rng_for(1))
        row("zero-shot sampled (top-100)", None, 0.0, sampled, t)

        t = time.perf_counter()
        centre = zero_shot_sampled(backend, prompts, tokens, rng_for(4), scale=N_SHOTS)
        row(CENTRE, None, 0.0, centre, t)

        for eps in args.e2e_epsilons:
            for level, dataset in (("record", by_record), ("unit", by_unit)):
                ledger = BudgetManager(PrivacyBudget(eps, delta, privacy_unit=level))
                t = time.perf_counter()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    decoder = MozoDecoder(
                        dataset,
                        backend=backend,
                        budget=ledger,
                        n_queries=args.n_test,
                        max_tokens=tokens,
                        epsilon=eps,
                        delta=delta,
                        n_shots=N_SHOTS,
                        top_k=TOP_K,
                        order=ORDERS.get(eps, 8.0),
                        template=template,
                    )
                rng = rng_for(10 + int(eps * 10) + (0 if level == "record" else 1))
                outs = [decoder.generate(q, rng=rng, stop=["\n"]).text.strip() for q in queries]
                spent = ledger.spent()
                if spent.epsilon > eps + 1e-9:
                    raise AssertionError(f"{level}-level ledger spent {spent.epsilon} > {eps}")
                row(
                    f"DPS-MOZO+On, {level}-level",
                    level,
                    eps,
                    outs,
                    t,
                    beta=decoder.beta,
                    sampling_rate=decoder.sampling_rate,
                    order=decoder.order,
                    delta=delta,
                    spent_epsilon=spent.epsilon,
                    warnings=[str(w.message) for w in caught],
                )

        for level, dataset in (("record", by_record), ("unit", by_unit)):
            t = time.perf_counter()
            method = MozoOfflineSynthesizer(
                beta=1.0, n_shots=N_SHOTS, max_tokens=tokens, top_k=TOP_K, template=template
            )
            demos = method.synthesize_nonprivate(
                dataset,
                public_inputs=queries,
                backend=backend,
                rng=rng_for(2 if level == "record" else 3),
                progress=False,
                privacy_unit=level,
            )
            row(
                f"ε = ∞ ensemble, {level}-level draws (NOT private)",
                level,
                math.inf,
                [d.text.strip() for d in demos],
                t,
            )
        args.save_partial(rows)
    return e2e_part(rows, len(dev), unit_sizes, args)


def zero_shot_sampled(
    backend, prompts: list[list[int]], tokens: int, rng: np.random.Generator, *, scale: float = 1.0
) -> list[str]:
    """Sampled from the zero-shot distribution restricted to its top 100, renormalised, its log-probabilities
    times ``scale``: 1 is benchmarks/e2e's ε = 0 row; ``N_SHOTS`` is DPS-MOZO's public centre softmax(n_shots·ℓ0)
    (the output when every λ_i = 0, what the projected mechanism shrinks towards: its β → 0 limit)."""
    return e2e_bench().sample_top_k(backend, prompts, tokens, rng, scale=scale)


def score_each(scorer, queries: list[str], outputs: list[str]) -> tuple[list[float], list[float]]:
    """Each answer's ROUGE-L F1 and MiniLM cosine (×100, best reference)."""
    pairs = [scorer([q], [o]) for q, o in zip(queries, outputs, strict=True)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _se(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def summarise(rows: list[dict]) -> list[dict]:
    """Per (method, ε): the mean over every answer, its standard error over answers (n = 8 per seed, all seeds
    pooled) and over seed means; for a unit-level row, the paired difference to the record-level row of the
    same ε on the same queries."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        entry = {
            "method": method,
            "level": rs[0]["level"],
            "epsilon": eps,
            "seeds": len(rs),
            "answers": sum(len(r["outputs"]) for r in rs),
            "seconds_per_seed": float(np.mean([r["seconds"] for r in rs])),
        }
        if "beta" in rs[0]:
            entry["beta"] = rs[0]["beta"]
            entry["sampling_rate"] = rs[0]["sampling_rate"]
        for key in ("rouge_l", "cosine"):
            each = np.concatenate([r[key.split("_")[0] + "_each"] for r in rs])
            entry[key] = float(each.mean())
            entry[key + "_se"] = _se(each)
            entry[key + "_se_seeds"] = _se(np.array([r[key] for r in rs]))
        twin = [r for r in rows if r["epsilon"] == eps and r["level"] == "record" and r["method"] != method]
        if rs[0]["level"] == "unit" and twin:
            twin = sorted(twin, key=lambda r: r["seed"])
            diff = np.concatenate(
                [np.array(u["rouge_each"]) - np.array(t["rouge_each"]) for u, t in zip(rs, twin, strict=True)]
            )
            entry["rouge_l_minus_record"] = float(diff.mean())
            entry["rouge_l_minus_record_se"] = _se(diff)
        out.append(entry)
    return out


def e2e_table(part: dict) -> str:
    def eps_text(e: float) -> str:
        return "∞" if math.isinf(e) else f"{e:g}"

    lines = [
        f"E2E, SmolLM2-135M-Instruct, {part['n_test']} test MRs × {part['seeds']} seed(s), at most "
        f"{part['max_tokens']} tokens an answer; ROUGE-L F1 and MiniLM cosine ×100 against the best reference, mean "
        "± standard error over the n answers; unit − record: the paired ROUGE-L difference on the same queries:",
        "",
        "| ε | method | q | β | ROUGE-L F1 | unit − record | MiniLM cosine | n answers | s per seed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def position(s: dict) -> tuple[float, int, str]:
        kind = ("zero-shot greedy", "zero-shot sampled", CENTRE[:20], "record", "unit")
        rank = next((i for i, k in enumerate(kind) if k in s["method"] or k == s["level"]), len(kind))
        return (1e9 if math.isinf(s["epsilon"]) else s["epsilon"], rank, s["method"])

    for s in sorted(part["summary"], key=position):
        q = f"{s['sampling_rate']:.2g}" if "sampling_rate" in s else ""
        beta = f"{s['beta']:.3g}" if "beta" in s else ""
        diff = (
            f"{s['rouge_l_minus_record']:+.1f} ± {s['rouge_l_minus_record_se']:.1f}"
            if "rouge_l_minus_record" in s
            else ""
        )
        lines.append(
            f"| {eps_text(s['epsilon'])} | {s['method']} | {q} | {beta} | {s['rouge_l']:.1f} ± {s['rouge_l_se']:.1f} | "
            f"{diff} | {s['cosine']:.1f} ± {s['cosine_se']:.1f} | {s['answers']} | {s['seconds_per_seed']:.0f} |"
        )
    return "\n".join(lines)


def e2e_part(rows: list[dict], dev_size: int, unit_sizes: list[int], args) -> dict:
    return {
        "records": dev_size,
        "unit_sizes": unit_sizes,
        "delta": 1.0 / dev_size,
        "n_test": args.n_test,
        "seeds": len({r["seed"] for r in rows}),
        "max_tokens": args.max_tokens,
        "rows": rows,
        "summary": summarise(rows),
    }


def centre_row(seed: int, queries: list[str], scorer, results: dict, log: Callable[[str], None]) -> dict:
    """The public-centre row of ``seed`` as :func:`run_e2e` computes it (same queries, same random stream), for
    a results file written before that row existed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dp_icl_plugin.backends.hf import HFBackend

    tokens = results["meta"]["settings"]["max_tokens"]
    backend = HFBackend.from_pretrained("smollm2-135m-instruct")
    template = e2e_bench().chat_layout(backend)
    t = time.perf_counter()
    prompts = [backend.encode(template.zero_shot_prompt(m), add_special_tokens=True) for m in queries]
    outputs = zero_shot_sampled(backend, prompts, tokens, np.random.default_rng([seed, 4]), scale=N_SHOTS)
    rouge, cosine = scorer(queries, outputs)
    log(f"  e2e seed {seed} {CENTRE}: ROUGE-L {rouge:5.1f} cos {cosine:5.1f} (added by --rebuild)")
    return {
        "seed": seed,
        "method": CENTRE,
        "level": None,
        "epsilon": 0.0,
        "rouge_l": rouge,
        "cosine": cosine,
        "seconds": time.perf_counter() - t,
        "queries": queries,
        "outputs": outputs,
    }


def rebuild(path: Path, log: Callable[[str], None]) -> dict:
    """The results file of a run stopped after some E2E seeds (``e2e_partial_rows``, saved after each seed),
    completed: per-answer scores added where missing, the E2E part and its summary built from the seeds done."""
    results = json.loads(path.read_text())
    rows = results.pop("e2e_partial_rows", None) or results.get("e2e", {}).get("rows")
    if not rows:
        raise SystemExit(f"{path} holds no E2E rows")
    e2e = e2e_bench()
    dev, test = e2e.load()
    scorer = e2e.Scorer(test)
    added = []
    for seed in sorted({r["seed"] for r in rows}):
        if not any(r["seed"] == seed and r["method"] == CENTRE for r in rows):
            added.append(centre_row(seed, next(r for r in rows if r["seed"] == seed)["queries"], scorer, results, log))
    if added:
        rows.extend(added)
        results["meta"]["added_by_rebuild"] = [CENTRE]
    for r in rows:
        if "rouge_each" not in r:
            r["rouge_each"], r["cosine_each"] = score_each(scorer, r["queries"], r["outputs"])
    settings = argparse.Namespace(**results["meta"]["settings"])
    sizes = sorted(np.unique([restaurant(mr) for mr, _ in dev], return_counts=True)[1].tolist())
    results["e2e"] = e2e_part(rows, len(dev), sizes, settings)
    seeds = results["e2e"]["seeds"]
    if seeds < settings.e2e_seeds:
        results["meta"]["stopped"] = (
            f"stopped after {seeds} of {settings.e2e_seeds} E2E seeds; every row of a seed depends on that seed "
            f"alone, so these rows are what --e2e-seeds {seeds} gives"
        )
    log(f"rebuilt the E2E part from {len(rows)} rows ({seeds} seed(s))")
    return results


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every row, tiny (a smoke check: about 2 minutes)")
    parser.add_argument("--parts", default="trec,e2e")
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--zipf", type=float, default=1.1, help="user size ∝ 1/rank^zipf")
    parser.add_argument("--assign-seed", type=int, default=0)
    parser.add_argument("--queries", type=int, default=200, help="TREC test questions")
    parser.add_argument("--pool", type=int, default=0, help="use only the first N TREC records (0: all)")
    parser.add_argument("--trec-seeds", type=int, default=3)
    parser.add_argument("--trec-epsilons", type=float, nargs="+", default=list(TREC_EPSILONS))
    parser.add_argument("--e2e-seeds", type=int, default=2)
    parser.add_argument("--n-test", type=int, default=8, help="E2E test MRs per seed")
    parser.add_argument("--max-tokens", type=int, default=20, help="tokens of an E2E answer (all charged)")
    parser.add_argument("--e2e-epsilons", type=float, nargs="+", default=list(E2E_EPSILONS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--rebuild", type=Path, default=None, help="complete a stopped run's results file (tables from its seeds)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.queries, args.pool, args.users, args.trec_seeds, args.trec_epsilons = 30, 600, 60, 1, [1.0, 8.0]
        args.e2e_seeds, args.n_test, args.max_tokens, args.e2e_epsilons = 1, 1, 4, [2.0]
        args.out = args.out.with_name(args.out.name + "-quick")  # ignored by git
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.threads)
    started = time.monotonic()
    command = "python benchmarks/units/run.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else "")

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", flush=True)

    meta = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU",
        "date": date.today().isoformat(),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("save")
        },
    }
    results: dict = {"meta": meta}

    def save(name: str = "units") -> None:
        meta["seconds"] = round(time.monotonic() - started, 1)
        (args.out / f"{name}.json").write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n")

    def save_partial(rows: list[dict]) -> None:
        results["e2e_partial_rows"] = rows
        save()

    args.save_partial = save_partial
    parts = args.parts.split(",")
    tables = []
    if args.rebuild is not None:
        results = rebuild(args.rebuild, log)
        tables = [trec_table(results["trec"])] if "trec" in results else []
        tables.append(e2e_table(results["e2e"]))
        args.rebuild.write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n")
        command = results["meta"]["command"] + f" (rebuilt: {command})"
        (args.rebuild.parent / "units.md").write_text(f"Command: `{command}`\n\n" + "\n\n".join(tables) + "\n")
        log("\n" + "\n\n".join(tables))
        return 0
    if "trec" in parts:
        t = time.monotonic()
        results["trec"] = run_trec(args, log)
        results["trec"]["seconds"] = round(time.monotonic() - t, 1)
        save()
        tables.append(trec_table(results["trec"]))
        log("\n" + tables[-1])
    if "e2e" in parts:
        t = time.monotonic()
        results["e2e"] = run_e2e(args, log)
        results["e2e"]["seconds"] = round(time.monotonic() - t, 1)
        results.pop("e2e_partial_rows", None)
        save()
        tables.append(e2e_table(results["e2e"]))
        log("\n" + tables[-1])
    save()
    (args.out / "units.md").write_text(f"Command: `{command}`\n\n" + "\n\n".join(tables) + "\n")
    log(f"total {meta['seconds'] / 60:.1f} min; wrote {args.out / 'units.json'} and units.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
