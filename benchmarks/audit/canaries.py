"""Canary exposure end to end on GINC: do secrets planted in private records reach the demonstrations or the answers?

Each GINC concept's 1,600 private records get 5 canaries: a random 9-symbol prefix and a random secret next
symbol (sequences the GINC language would never produce). Then, per setting, 4 demonstrations per concept:

- ε = ∞, real records: the canary itself is one of the 4 demonstrations (the worst case of a non-private
  pipeline that retrieved it), the other 3 are random records of the concept;
- ε = ∞, PTA without noise (the same algorithm, noise switched off);
- ε = 8 and ε = 1: PTA (δ = 1/1,600), as the library ships it;
- 0-shot: no demonstrations (the reference).

Exposure, per canary: the exact canary text inside a demonstration (substring), and the rank of its secret
among all 150 symbols when the model is asked for the next symbol after ``demos / canary prefix`` (rank 1:
the model answers with the secret).

    python benchmarks/audit/canaries.py        # about 20 s on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import concept_label, private_dataset
from dp_icl_plugin.ginc.prompts import pta_split
from dp_icl_plugin.methods import PRESETS, PrivateDataset, PrivateRecord, PTASynthesizer

HERE = Path(__file__).resolve().parent
CANARIES_PER_CONCEPT = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started = time.monotonic()
    import torch

    torch.set_num_threads(2)
    backend, language = load_model(device="cpu")
    rng = np.random.default_rng(args.seed)
    split = pta_split(language, n_train=1600, n_test=10, rng=np.random.default_rng(0))
    base = private_dataset(language, {c: train for c, (train, _) in split.items()})
    symbols = np.arange(1, len(language.vocab))  # never the delimiter
    canaries = {c: [(rng.choice(symbols, 9).tolist(), int(rng.choice(symbols))) for _ in range(CANARIES_PER_CONCEPT)]
                for c in split}  # fmt: skip
    records = [r for y in base.labels for r in base.records(y)]
    for c, planted in canaries.items():
        records += [PrivateRecord(language.render([*prefix, secret]), concept_label(c)) for prefix, secret in planted]
    private = PrivateDataset(records, labels=base.labels)

    def pta(epsilon: float) -> PTASynthesizer:
        return PTASynthesizer(epsilon=epsilon, delta=1 / 1600, alpha=2.0, n_prompts=5, records_per_prompt=4,
                              max_tokens=10, shots_per_label=4, top_k=10, template=PRESETS["ginc"])  # fmt: skip

    settings: dict[str, dict[int, list[list[int]]] | None] = {}
    settings["0-shot (no demonstrations)"] = None
    for eps in (1.0, 8.0):
        ledger = BudgetManager(PrivacyBudget(eps, 1 / 1600))
        demos = pta(eps).synthesize(private, backend=backend, budget=ledger, rng=np.random.default_rng(args.seed))
        settings[f"PTA ε = {eps:g} (as shipped)"] = {c: [list(d.token_ids) for d in demos.for_label(concept_label(c))]
                                                      for c in split}  # fmt: skip
    noiseless = pta(1.0).synthesize_nonprivate(private, backend=backend, rng=np.random.default_rng(args.seed))
    settings["ε = ∞: PTA without noise"] = {c: [list(d.token_ids) for d in noiseless.for_label(concept_label(c))]
                                            for c in split}  # fmt: skip

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
    meta = {"command": "python benchmarks/audit/canaries.py", "seconds": round(time.monotonic() - started, 1),
            "canaries": total, "vocabulary": len(language.vocab)}  # fmt: skip
    (args.out / "canaries.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / "canaries.md").write_text(text + "\n")
    print(text)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


def _rank(backend, demos: list[list[int]], prefix: list[int], secret: int) -> int:
    ids = [t for d in demos for t in (*d, 0)] + list(prefix)
    logprobs = backend.next_token_logprobs([ids])[0]
    return int((logprobs > logprobs[secret]).sum()) + 1


def _row(name: str, exposed: int, ranks: list[int]) -> dict[str, object]:
    return {"setting": name, "exposed": exposed, "rank1": int(sum(r == 1 for r in ranks)),
            "median_rank": float(np.median(ranks))}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
