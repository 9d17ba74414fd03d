"""Membership inference: real demonstrations and non-private answers against their DP counterparts.

Default (``--model copy``): the copy model of :mod:`copy_model`, which copies from its context, so that a
member that reaches a prompt changes the model's answers (the attack has power). Protocol (after the
DPS-MOZO paper's App. E): in each of ``--trials`` attacks, a target record ``prefix secret`` (four random names,
a random three-digit number) is a member (added to 59 other private records) and another fresh one is a
non-member. The attacker sees what the pipeline releases and scores a target by the model's log-probability of
its secret after ``released material ; prefix``; for the answering paths it asks both targets' prefixes as
queries (both answers are released, and covered by the ε share). AUC over all member and non-member scores
(0.5: no membership signal), with its Hanley–McNeil standard error.

Settings: 0-shot; real demonstrations (the member among the 4, the worst case; or 4 records drawn at random);
PTA and clip-blend synthetic demonstrations at ε = 1, 4 and without noise (δ = 1/|D|); a plain
retrieval-augmented answer (the 4 records nearest the query in the prompt: the non-private kNN pipeline);
MOZO and clip-blend DP decoding at ε = 1, 4; kNN keyword-space answers (:meth:`PrivateKNN.answer`) at
ε = 1, 4 per record.

``--model ginc``: the earlier GINC rows (a target's label after the demonstrations; no power on that model).

    python benchmarks/audit/mia.py                      # 200 attacks per setting, about 3-4 minutes on 2 CPU cores
    python benchmarks/audit/mia.py --quick              # 10 attacks, about 20 s
    python benchmarks/audit/mia.py --model ginc --trials 200   # the GINC rows, about 5 minutes
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
from dp_icl_plugin.ginc.dp_icl import concept_label
from dp_icl_plugin.ginc.prompts import pta_split

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the copy model's helpers sit beside this script
INF = math.inf
N_OTHERS = 59


def auc(members: list[float], non_members: list[float]) -> float:
    """P(member score > non-member score) + ½ P(tie): the Mann–Whitney AUC."""
    m, n = np.asarray(members)[:, None], np.asarray(non_members)[None, :]
    return float(((m > n).sum() + 0.5 * (m == n).sum()) / (m.size * n.size))


def hanley_mcneil(a: float, n_members: int, n_non_members: int) -> float:
    """Standard error of an AUC (Hanley & McNeil 1982, eq. 2)."""
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_members - 1) * (q1 - a * a) + (n_non_members - 1) * (q2 - a * a)) / (
        n_members * n_non_members
    )
    return math.sqrt(max(var, 0.0))


def _table(rows: list[dict[str, object]]) -> str:
    lines = ["| release | ε | attacks | membership-inference AUC | standard error |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['epsilon']} | {r['trials']} | {r['auc']:.3f} | {r['se']:.3f} |")
    return "\n".join(lines)


def run_copy(args: argparse.Namespace) -> int:
    """The copy-model rows (see the module docstring)."""
    import copy_model
    import copy_paths as cp
    from tqdm import tqdm

    started = time.monotonic()
    backend = copy_model.load_backend()
    trials = args.trials or (10 if args.quick else 200)
    settings: list[tuple[str, str, float]] = [("0-shot", "nothing released", INF)]
    settings += [("real", "real demonstrations (the member among the 4)", INF)]
    settings += [("real-random", "real demonstrations (4 of the 60 records at random)", INF)]
    for name in ("PTA", "clip-blend"):
        settings += [("synthesis", f"{name} synthetic demonstrations", eps) for eps in (INF, 1.0, 4.0)]
    settings += [("decoding", "plain retrieval-augmented answer (4 nearest records; non-private kNN)", INF)]
    settings += [("decoding", f"{name} DP decoding", eps) for name in ("MOZO", "clip-blend") for eps in (1.0, 4.0)]
    settings += [("kNN", "kNN keyword-space answer (PrivateKNN.answer)", eps) for eps in (1.0, 4.0)]
    scores: dict[int, tuple[list[float], list[float]]] = {i: ([], []) for i in range(len(settings))}
    for t in tqdm(range(trials), desc="membership attacks", mininterval=5):
        pairs = copy_model.random_canaries(np.random.default_rng([args.seed, t]), N_OTHERS + 2)
        member, non_member, others = pairs[0], pairs[1], pairs[2:]
        knn_records = [member, *others]
        np.random.default_rng([args.seed, t, 1]).shuffle(knn_records)
        records = [f"{p} {s}" for p, s in knn_records]
        targets = (member, non_member)
        for i, (path, name, eps) in enumerate(settings):
            rng = np.random.default_rng([args.seed, t, 2, i])
            if path == "0-shot":
                contexts = ["", ""]
            elif path == "real":
                demos = [records[int(j)] for j in rng.choice(len(records), 4, replace=False)]
                demos = [f"{member[0]} {member[1]}", *[d for d in demos if not d.startswith(member[0])][:3]]
                rng.shuffle(demos)
                contexts = [" ; ".join(demos)] * 2
            elif path in ("real-random", "synthesis"):
                method = "real" if path == "real-random" else "pta" if name.startswith("PTA") else "clip_blend"
                contexts = [" ; ".join(d for d in cp.synthesize(method, eps, records, backend, rng=rng) if d)] * 2
            elif path == "decoding":
                kind = "plain" if name.startswith("plain") else "mozo" if name.startswith("MOZO") else "clip_blend"
                answers = cp.decode(kind, eps, records, [p for p, _ in targets], backend, rng=rng)
                contexts = [f"{p} {a}" for (p, _), a in zip(targets, answers, strict=True)]
            else:
                outs = cp.knn_answer(eps, knn_records, [p for p, _ in targets], backend, rng=rng)
                contexts = [
                    " ; ".join(x for x in (k, f"{p} {a}") if x) for (p, _), (k, a) in zip(targets, outs, strict=True)
                ]
            for j, ((p, s), context) in enumerate(zip(targets, contexts, strict=True)):
                scores[i][j].append(cp.secret_logprob(backend, context, p, s)[0])
    rows = []
    for i, (_, name, eps) in enumerate(settings):
        a = auc(*scores[i])
        rows.append(
            {
                "setting": name,
                "epsilon": cp.eps_name(eps),
                "trials": trials,
                "auc": a,
                "se": hanley_mcneil(a, trials, trials),
            }
        )
    table = _table(rows)
    command = "python benchmarks/audit/mia.py" + (" --quick" if args.quick else "")
    meta = {
        "command": command,
        "seconds": round(time.monotonic() - started, 1),
        "seed": args.seed,
        "records": N_OTHERS + 1,
        "model": "benchmarks/audit/results/copy_model",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "mia_quick" if args.quick else "mia"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "scores": scores}, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(table + "\n")
    print(table)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("copy", "ginc"), default="copy")
    parser.add_argument("--trials", type=int, default=None, help="attacks per setting (default 200; --quick: 10 or 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 attacks per setting (a fast check)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    if args.model == "ginc":
        args.trials = args.trials or (20 if args.quick else 200)
        return run_ginc(args)
    return run_copy(args)


def run_ginc(args: argparse.Namespace) -> int:
    """The GINC rows (no power: see the module docstring)."""
    started = time.monotonic()
    backend, language = load_model(device="cpu")
    split = pta_split(language, n_train=1600, n_test=2 * args.trials, rng=np.random.default_rng(0))
    train, test = split[0]
    label = concept_label(0)

    def record(ex) -> PrivateRecord:
        return PrivateRecord(language.render([*ex.tokens, ex.label]), label)

    def score(demos: list[list[int]], ex) -> float:
        ids = [t for d in demos for t in (*d, 0)] + list(ex.tokens)
        return float(backend.next_token_logprobs([ids])[0][ex.label])

    rng = np.random.default_rng(1)
    order = rng.permutation(len(test))  # which held-out example is the member is decided at random
    pairs = [(test[order[2 * t]], test[order[2 * t + 1]]) for t in range(args.trials)]
    scores: dict[str, tuple[list[float], list[float]]] = {}
    for setting in (
        "0-shot (no demonstrations)",
        "real demonstrations (the member among them)",
        "PTA ε = 1",
        "PTA ε = 4",
    ):
        members, non_members = [], []
        for t, (member, non_member) in enumerate(pairs):
            if setting.startswith("0-shot"):
                demos: list[list[int]] = []
            elif setting.startswith("real"):
                others = [[*train[i].tokens, train[i].label] for i in rng.choice(len(train), 3, replace=False)]
                demos = [[*member.tokens, member.label], *others]
            else:
                eps = float(setting.split("= ")[1])
                data = PrivateDataset(
                    [record(ex) for ex in train] + [record(member)], labels=[label], public_label_counts="observed"
                )  # the size is the same for member and not
                method = PTASynthesizer(
                    epsilon=eps,
                    delta=1 / 1600,
                    alpha=2.0,
                    n_prompts=5,
                    records_per_prompt=4,
                    max_tokens=10,
                    shots_per_label=4,
                    top_k=10,
                    template=PRESETS["ginc"],
                )
                out = method.synthesize(
                    data,
                    backend=backend,
                    budget=BudgetManager(PrivacyBudget(eps, 1 / 1600)),
                    rng=np.random.default_rng(t + 1000 * args.seed),
                    progress=False,
                )
                demos = [list(d.token_ids) for d in out]
            members.append(score(demos, member))
            non_members.append(score(demos, non_member))
        scores[setting] = (members, non_members)
    rows = [
        {
            "setting": name,
            "epsilon": name.split("= ")[1] if "=" in name else "∞",
            "auc": auc(*pair),
            "se": hanley_mcneil(auc(*pair), args.trials, args.trials),
            "trials": args.trials,
        }
        for name, pair in scores.items()
    ]
    table = _table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": f"python benchmarks/audit/mia.py --model ginc --trials {args.trials}",
        "seconds": round(time.monotonic() - started, 1),
    }
    (args.out / "mia_ginc.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / "mia_ginc.md").write_text(table + "\n")
    print(table)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
