"""Canary exposure end to end: do secrets planted in private records reach what is released?

Default (``--model copy``): the copy model of :mod:`copy_model`, a tiny GPT-2 that copies from its context,
so that a record in a prompt really leaks (ε = ∞ must expose). 20 canaries ``prefix secret`` (four random
names, a random three-digit number) are planted among 80 other records of the same form. Per setting:

- what is released: 4 demonstrations (synthesis paths), or the answer to each canary's prefix asked as the
  query (decoding and kNN paths; the query is public, the answer is what is released);
- exact exposure: the canary's text inside a demonstration, or its secret among the answer's tokens (for kNN
  also among the released keywords);
- secret rank: the rank of the secret's token among all 1,517 tokens when the model is asked to continue
  ``released material ; prefix`` (rank 1: the model, reading what was released, answers with the secret).

Settings: ε = ∞ references (real records with the canary among the demonstrations; PTA and clip-blend
without noise; plain retrieval-augmented decoding and non-private kNN, the 4 records nearest the query in the
prompt), then at ε = 1 and 8: PTA and clip-blend synthesis (δ = 1/|D|), MOZO and clip-blend DP decoding (one
ε share for the 20 answers), and kNN keyword-space answers (:meth:`PrivateKNN.answer`, each record's
own ε over the 20 answers, every record paying for every query). "Without noise" rows run the same DP
algorithm with its noise switched off. A second block plants every canary 10 times (a recurring secret).

``--model ginc``: the earlier table on the GINC model (PTA only; that model does not copy random sequences,
so only the exact-text measure separates the settings there).

    python benchmarks/audit/canaries.py               # about 20-40 s on 2 CPU cores
    python benchmarks/audit/canaries.py --quick       # 5 canaries among 25 records, about 15 s
    python benchmarks/audit/canaries.py --model ginc  # the GINC table, about 20 s
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from dp_icl_plugin import PRESETS, BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord, PTASynthesizer
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import concept_label, private_dataset
from dp_icl_plugin.ginc.prompts import pta_split

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the copy model's helpers sit beside this script

CANARIES_PER_CONCEPT = 5
INF = math.inf
REPEATS = 10  # the second block plants every canary this many times


def run_copy(args: argparse.Namespace) -> int:
    """The copy-model table (see the module docstring)."""
    import copy_model
    import copy_paths as cp
    from tqdm import tqdm

    started = time.monotonic()
    backend = copy_model.load_backend()
    rng = np.random.default_rng(args.seed)
    n_canaries, n_others = (5, 20) if args.quick else (20, 80)
    pairs = copy_model.random_canaries(rng, n_canaries + n_others)
    canaries, others = pairs[:n_canaries], pairs[n_canaries:]
    queries = [p for p, _ in canaries]

    settings: list[tuple[int, str, str, float]] = []
    for copies in (1, REPEATS):
        if copies == 1:
            settings += [(1, "0-shot", "nothing released", INF)]
        settings += [(copies, "demonstrations", "real records (the canary among 4)", INF)]
        for name in ("PTA", "clip-blend"):
            settings += [(copies, "synthesis", name, eps) for eps in (INF, 1.0, 8.0)]
        settings += [(copies, "decoding", "plain decoding, 4 nearest records in the prompt", INF)]
        settings += [(copies, "decoding", name, eps) for name in ("MOZO", "clip-blend") for eps in (INF, 1.0, 8.0)]
        settings += [(copies, "kNN", "plain kNN answer, 4 nearest records in the prompt", INF)]
        settings += [(copies, "kNN", "PrivateKNN.answer (keywords)", eps) for eps in (INF, 1.0, 8.0)]

    rows = []
    for copies, path, name, eps in tqdm(settings, desc="canary settings", mininterval=5):
        # each canary planted `copies` times (a secret that recurs in the data), then shuffled in
        planted = [c for c in canaries for _ in range(copies)] + others
        order = np.random.default_rng([args.seed, copies]).permutation(len(planted))
        knn_records = [planted[i] for i in order]
        records = [f"{p} {s}" for p, s in knn_records]
        run_rng = np.random.default_rng([args.seed, len(rows)])
        released: list[tuple[bool, str]] = []  # per canary: exposed exactly, the context it is ranked after
        if path == "0-shot":
            released = [(False, "") for _ in canaries]
        elif path == "demonstrations":
            for p, s in canaries:
                picked = run_rng.choice(len(others), 3, replace=False)
                demos = [f"{p} {s}", *(" ".join(others[int(i)]) for i in picked)]
                run_rng.shuffle(demos)
                released.append((True, " ; ".join(demos)))
        elif path == "synthesis":
            method = "pta" if name == "PTA" else "clip_blend"
            demos = cp.synthesize(method, eps, records, backend, rng=run_rng, shots=4)
            context = " ; ".join(d for d in demos if d)
            released = [(any(f"{p} {s}" in " ".join(d.split()) for d in demos), context) for p, s in canaries]
        elif path == "decoding":
            kind = "plain" if name.startswith("plain") else "mozo" if name == "MOZO" else "clip_blend"
            answers = cp.decode(kind, eps, records, queries, backend, rng=run_rng)
            released = [(s in a.split(), f"{p} {a}") for (p, s), a in zip(canaries, answers, strict=True)]
        else:
            noise_off = math.isinf(eps) and not name.startswith("plain")
            outs = cp.knn_answer(eps, knn_records, queries, backend, rng=run_rng, noise_off=noise_off)
            released = [
                (s in f"{k} {a}".split(), " ; ".join(x for x in (k, f"{p} {a}") if x))
                for (p, s), (k, a) in zip(canaries, outs, strict=True)
            ]
        ranks = [
            cp.secret_logprob(backend, context, p, s)[1]
            for (p, s), (_, context) in zip(canaries, released, strict=True)
        ]
        if math.isinf(eps) and path in ("synthesis", "decoding", "kNN") and not name.startswith("plain"):
            name += {
                "PTA": " without noise",
                "clip-blend": " without noise (τ = 0.001)" if path == "decoding" else " without noise (greedy)",
                "MOZO": " without noise (β = 1,000)",
                "PrivateKNN.answer (keywords)": " without noise (σ = 0.001)",
            }[name]
        rows.append(
            {
                "copies": copies,
                "path": path,
                "setting": name,
                "epsilon": cp.eps_name(eps),
                "exposed": int(sum(e for e, _ in released)),
                "rank1": int(sum(r == 1 for r in ranks)),
                "median_rank": float(np.median(ranks)),
                "ranks": ranks,
            }
        )

    header = (
        "| copies of each canary | path | setting | ε | canary exposed (exact) | secret ranked 1st | "
        "median rank of the secret |"
    )
    table = [header, "|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        counts = f"{r['exposed']} / {n_canaries} | {r['rank1']} / {n_canaries} | {r['median_rank']:g}"
        table.append(f"| {r['copies']} | {r['path']} | {r['setting']} | {r['epsilon']} | {counts} |")
    text = "\n".join(table)
    command = "python benchmarks/audit/canaries.py" + (" --quick" if args.quick else "")
    meta = {
        "command": command,
        "seconds": round(time.monotonic() - started, 1),
        "seed": args.seed,
        "canaries": n_canaries,
        "other_records": n_others,
        "repeats": [1, REPEATS],
        "vocabulary": backend.vocab_size,
        "model": "benchmarks/audit/results/copy_model",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "canaries_quick" if args.quick else "canaries"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("copy", "ginc"), default="copy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="5 canaries among 25 records (a fast check)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    return run_copy(args) if args.model == "copy" else run_ginc(args)


def run_ginc(args: argparse.Namespace) -> int:
    """The GINC table: PTA demonstrations only (the model does not copy, see the module docstring)."""
    started = time.monotonic()
    backend, language = load_model(device="cpu")
    rng = np.random.default_rng(args.seed)
    split = pta_split(language, n_train=1600, n_test=10, rng=np.random.default_rng(0))
    base = private_dataset(language, {c: train for c, (train, _) in split.items()})
    symbols = np.arange(1, len(language.vocab))  # never the delimiter
    canaries = {
        c: [(rng.choice(symbols, 9).tolist(), int(rng.choice(symbols))) for _ in range(CANARIES_PER_CONCEPT)]
        for c in split
    }
    records = [r for y in base.labels for r in base.records(y)]
    for c, planted in canaries.items():
        records += [PrivateRecord(language.render([*prefix, secret]), concept_label(c)) for prefix, secret in planted]
    private = PrivateDataset(records, labels=base.labels, public_label_counts="observed")  # sizes fixed by design

    def pta(epsilon: float) -> PTASynthesizer:
        return PTASynthesizer(
            epsilon=epsilon,
            delta=1 / 1600,
            alpha=2.0,
            n_prompts=5,
            records_per_prompt=4,
            max_tokens=10,
            shots_per_label=4,
            top_k=10,
            template=PRESETS["ginc"],
        )

    settings: dict[str, dict[int, list[list[int]]] | None] = {}
    settings["0-shot (no demonstrations)"] = None
    for eps in (1.0, 8.0):
        ledger = BudgetManager(PrivacyBudget(eps, 1 / 1600))
        demos = pta(eps).synthesize(private, backend=backend, budget=ledger, rng=np.random.default_rng(args.seed))
        settings[f"PTA ε = {eps:g} (as shipped)"] = {
            c: [list(d.token_ids) for d in demos.for_label(concept_label(c))] for c in split
        }
    noiseless = pta(1.0).synthesize_nonprivate(private, backend=backend, rng=np.random.default_rng(args.seed))
    settings["ε = ∞: PTA without noise"] = {
        c: [list(d.token_ids) for d in noiseless.for_label(concept_label(c))] for c in split
    }

    rows = []
    for name, demos_by_concept in settings.items():
        exposed, ranks = 0, []
        for c, planted in canaries.items():
            for prefix, secret in planted:
                demos = [] if demos_by_concept is None else demos_by_concept[c]
                exposed += any(language.render([*prefix, secret]) in language.render(d) for d in demos)
                ranks.append(_rank(backend, demos, prefix, secret))
        rows.append(_row(name, exposed, ranks))
    # The non-private worst case: the canary record itself is among the demonstrations.
    exposed, ranks = 0, []
    for c, planted in canaries.items():
        others = [list(language.parse(r.text)) for r in base.records(concept_label(c))[:3]]
        for prefix, secret in planted:
            demos = [[*prefix, secret], *others]
            exposed += 1  # the canary's text is a demonstration
            ranks.append(_rank(backend, demos, prefix, secret))
    rows.insert(1, _row("ε = ∞: real records (the canary among them)", exposed, ranks))

    header = "| setting | canaries in the demonstrations (exact text) | secret ranked 1st | median rank of the secret |"
    table = [header, "|---|---:|---:|---:|"]
    total = CANARIES_PER_CONCEPT * len(canaries)
    for r in rows:
        table.append(f"| {r['setting']} | {r['exposed']} / {total} | {r['rank1']} / {total} | {r['median_rank']:g} |")
    text = "\n".join(table)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python benchmarks/audit/canaries.py --model ginc",
        "seconds": round(time.monotonic() - started, 1),
        "canaries": total,
        "vocabulary": len(language.vocab),
    }
    (args.out / "canaries_ginc.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / "canaries_ginc.md").write_text(text + "\n")
    print(text)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


def _rank(backend, demos: list[list[int]], prefix: list[int], secret: int) -> int:
    ids = [t for d in demos for t in (*d, 0)] + list(prefix)
    logprobs = backend.next_token_logprobs([ids])[0]
    return int((logprobs > logprobs[secret]).sum()) + 1


def _row(name: str, exposed: int, ranks: list[int]) -> dict[str, object]:
    return {
        "setting": name,
        "exposed": exposed,
        "rank1": int(sum(r == 1 for r in ranks)),
        "median_rank": float(np.median(ranks)),
    }


if __name__ == "__main__":
    raise SystemExit(main())
