"""TREC question classification on a real pretrained model: do DP synthetic demonstrations help it?

SmolLM2-135M-Instruct (``HFBackend.from_pretrained("smollm2-135m-instruct")``), TREC's 6 coarse classes
(``../shared/data/trec``: the 5,452 training questions are the private records, ``--n-test`` test questions
the queries, the same in every seed). The model answers after ``Answer Type:``; its prediction is the class
whose name's first token is most likely (the six first tokens are distinct; checked).

Rows, each without and with Zhao et al.'s contextual calibration (2021, "Calibrate Before Use"; PTA App. F.4,
eq. 26: p̂ ∝ diag(p_cf)⁻¹ p, p_cf the average label distribution for the content-free inputs "N/A", "" and
"[MASK]" in the same prompt):

- ``0-shot``: the instruction and the query only.
- ``real demos`` (ε = ∞, NOT private): one real training question per class (drawn per seed), in random order.
- ``PTA demos`` at ε ∈ {1, 2, 4}: :class:`PTASynthesizer` writes one question per class (T = 15 tokens, M = 10
  prompts of N = 1 record, Poisson rate M·N/n_y over the class sizes, which this benchmark declares public as
  PTA's experiments do), on a ledger ``PrivacyBudget(ε, δ = 1/|D|)``, replace-one; used as the examples.

    python benchmarks/classification/run.py             # see RESULTS.md for time and machine
    python benchmarks/classification/run.py --quick     # 1 seed, 60 questions, ε = 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1].parent / "shared" / "data" / "trec"
NAMES = {
    "ABBR": "Abbreviation",
    "DESC": "Description",
    "ENTY": "Entity",
    "HUM": "Person",
    "LOC": "Location",
    "NUM": "Number",
}
INSTRUCTION = (
    "Classify the questions based on whether their answer type is a Number, Location, Person, "
    "Description, Entity, or Abbreviation.\n\n"
)
CONTENT_FREE = ("N/A", "", "[MASK]")


def read(path: Path) -> tuple[list[str], list[str]]:
    lines = path.read_text(encoding="latin-1").splitlines()
    return [ln.split(" ", 1)[1] for ln in lines], [NAMES[ln.split(" ", 1)[0].split(":")[0]] for ln in lines]


def prompt(demos: list[tuple[str, str]], question: str) -> str:
    shots = "".join(f"Question: {q}\nAnswer Type: {y}\n\n" for q, y in demos)
    return f"{INSTRUCTION}{shots}Question: {question}\nAnswer Type:"


class Classifier:
    def __init__(self, backend) -> None:
        self.backend = backend
        self.labels = list(NAMES.values())
        self.first = [backend.encode(" " + name)[0] for name in self.labels]
        if len(set(self.first)) != len(self.first):
            sys.exit("two class names share their first token: the scoring would be ambiguous")

    def label_probs(self, demos: list[tuple[str, str]], questions: list[str]) -> np.ndarray:
        ids = [self.backend.encode(prompt(demos, q), add_special_tokens=True) for q in questions]
        logprobs = self.backend.next_token_logprobs(ids)[:, self.first]
        p = np.exp(logprobs - logprobs.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    def accuracy(self, demos: list[tuple[str, str]], questions: list[str], truth: list[str]) -> tuple[float, float]:
        """(raw accuracy, contextually calibrated accuracy), in %."""
        p = self.label_probs(demos, questions)
        p_cf = self.label_probs(demos, list(CONTENT_FREE)).mean(axis=0)
        calibrated = p / p_cf
        y = np.array([self.labels.index(t) for t in truth])
        return 100 * float(np.mean(p.argmax(1) == y)), 100 * float(np.mean(calibrated.argmax(1) == y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n-test", type=int, default=250)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.quick:
        args.n_test, args.seeds, args.epsilons = 60, 1, [4.0]
        args.out = args.out.with_name(args.out.name + "-quick")
    if not DATA.is_dir():
        sys.exit(f"TREC data not found at {DATA}")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dp_icl_plugin import PRESETS, BudgetManager, PrivacyBudget, PrivateDataset, PTASynthesizer
    from dp_icl_plugin.backends.hf import HFBackend

    start = time.perf_counter()
    pool_x, pool_y = read(DATA / "train.txt")
    test_x, test_y = read(DATA / "test.txt")
    pick = np.random.default_rng(0).permutation(len(test_x))[: args.n_test]
    questions, truth = [test_x[i] for i in pick], [test_y[i] for i in pick]
    backend = HFBackend.from_pretrained("smollm2-135m-instruct")
    classifier = Classifier(backend)
    dataset = PrivateDataset.from_pairs(pool_x, pool_y, labels=classifier.labels, public_label_counts="observed")
    delta = 1.0 / len(pool_x)  # 1/|D|; PTA's 1/min_y n_y would be 1/86 here (Abbreviation), too weak
    rows: list[dict] = []

    def row(seed: int, method: str, epsilon: float, demos: list[tuple[str, str]], t: float, **extra) -> None:
        raw, cal = classifier.accuracy(demos, questions, truth)
        rows.append(
            {
                "seed": seed,
                "method": method,
                "epsilon": epsilon,
                "accuracy": raw,
                "calibrated": cal,
                "seconds": time.perf_counter() - t,
                "demos": demos,
                **extra,
            }
        )
        print(
            f"  seed {seed} {method:11s} ε={epsilon!s:4s} accuracy {raw:5.1f}  calibrated {cal:5.1f}  "
            f"{rows[-1]['seconds']:4.0f}s  {demos[:2]}",
            flush=True,
        )

    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        t = time.perf_counter()
        row(seed, "0-shot", 0.0, [], t)
        t = time.perf_counter()
        real = [
            (pool_x[int(i)], y)
            for y in classifier.labels
            for i in rng.choice([j for j, z in enumerate(pool_y) if z == y], size=1)
        ]
        row(seed, "real demos", math.inf, [real[i] for i in rng.permutation(len(real))], t)
        for eps in args.epsilons:
            t = time.perf_counter()
            ledger = BudgetManager(PrivacyBudget(eps, delta))
            pta = PTASynthesizer(
                epsilon=eps,
                delta=delta,
                n_prompts=10,
                records_per_prompt=1,
                max_tokens=15,
                top_k=100,
                template=PRESETS["trec"],
            )
            made = pta.synthesize(dataset, backend=backend, budget=ledger, rng=rng, progress=False)
            demos = [(d.text.strip().split("\n")[0], d.label) for d in made if d.text.strip()]
            spent = ledger.spent().epsilon
            assert spent <= eps + 1e-9, (spent, eps)
            row(
                seed,
                "PTA demos",
                eps,
                [demos[i] for i in rng.permutation(len(demos))],
                t,
                spent_epsilon=spent,
                sigma=pta.plan(dataset).params.get("noise_multiplier"),
            )
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False))

    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    lines = ["| ε | demonstrations | accuracy | calibrated (Zhao et al.) | s per seed |", "|---|---|---:|---:|---:|"]
    summary = []
    for (method, eps), rs in groups.items():
        entry = {"method": method, "epsilon": eps, "seeds": len(rs)}
        for key in ("accuracy", "calibrated"):
            v = np.array([r[key] for r in rs])
            entry[key] = float(v.mean())
            entry[key + "_se"] = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
        entry["seconds"] = float(np.mean([r["seconds"] for r in rs]))
        summary.append(entry)
        e = "∞" if math.isinf(eps) else f"{eps:g}"
        lines.append(
            f"| {e} | {method} | {entry['accuracy']:.1f} ± {entry['accuracy_se']:.1f} | "
            f"{entry['calibrated']:.1f} ± {entry['calibrated_se']:.1f} | "
            f"{entry['seconds']:.0f} |"
        )
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU"
    minutes = (time.perf_counter() - start) / 60
    majority = 100 * max(truth.count(y) for y in set(truth)) / len(truth)
    meta = {
        "n_test": args.n_test,
        "seeds": args.seeds,
        "epsilons": args.epsilons,
        "machine": machine,
        "minutes": minutes,
        "chance": 100 / 6,
        "majority_class": majority,
    }
    (args.out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    print("\n" + "\n".join(lines))
    print(f"\n{minutes:.0f} min on {machine}; chance {100 / 6:.1f} %, majority class {meta['majority_class']:.1f} %")


if __name__ == "__main__":
    main()
