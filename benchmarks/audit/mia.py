"""Membership inference on GINC: real demonstrations against DP synthetic ones (PTA at ε = 1 and 4).

Protocol (after the DPS-MOZO paper's App. E): in each of ``--trials`` attacks a target example of concept 0
is a member (added to the private records) and another, fresh example of the same concept is a non-member.
The attacker sees the demonstrations the pipeline puts in its prompts and scores an example by the model's
log-probability of its label after ``demos / example input``; a member should score higher. AUC over all
member and non-member scores (0.5: no membership signal).

- real demonstrations: the member is one of the 4 demonstrations (a non-private pipeline that selected it);
- PTA ε = 1, 4: 4 synthetic demonstrations from the private records (member included), δ = 1/1,600.

    python benchmarks/audit/mia.py              # 200 attacks per setting, about 5 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import concept_label
from dp_icl_plugin.ginc.prompts import pta_split
from dp_icl_plugin.methods import PRESETS, PrivateDataset, PrivateRecord, PTASynthesizer

HERE = Path(__file__).resolve().parent


def auc(members: list[float], non_members: list[float]) -> float:
    """P(member score > non-member score) + ½ P(tie): the Mann–Whitney AUC."""
    m, n = np.asarray(members)[:, None], np.asarray(non_members)[None, :]
    return float(((m > n).sum() + 0.5 * (m == n).sum()) / (m.size * n.size))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started = time.monotonic()
    import torch

    torch.set_num_threads(2)
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
    for setting in ("0-shot (no demonstrations)", "real demonstrations (the member among them)", "PTA ε = 1",
                    "PTA ε = 4"):  # fmt: skip
        members, non_members = [], []
        for t, (member, non_member) in enumerate(pairs):
            if setting.startswith("0-shot"):
                demos: list[list[int]] = []
            elif setting.startswith("real"):
                others = [[*train[i].tokens, train[i].label] for i in rng.choice(len(train), 3, replace=False)]
                demos = [[*member.tokens, member.label], *others]
            else:
                eps = float(setting.split("= ")[1])
                data = PrivateDataset([record(ex) for ex in train] + [record(member)], labels=[label])
                method = PTASynthesizer(epsilon=eps, delta=1 / 1600, alpha=2.0, n_prompts=5, records_per_prompt=4,
                                        max_tokens=10, shots_per_label=4, top_k=10,
                                        template=PRESETS["ginc"])  # fmt: skip
                out = method.synthesize(data, backend=backend, budget=BudgetManager(PrivacyBudget(eps, 1 / 1600)),
                                        rng=np.random.default_rng(t), progress=False)  # fmt: skip
                demos = [list(d.token_ids) for d in out]
            members.append(score(demos, member))
            non_members.append(score(demos, non_member))
        scores[setting] = (members, non_members)
    rows = [{"setting": name, "auc": auc(*pair), "trials": args.trials} for name, pair in scores.items()]
    table = "\n".join(["| demonstrations | membership-inference AUC |", "|---|---:|"]
                      + [f"| {r['setting']} | {r['auc']:.3f} |" for r in rows])  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python benchmarks/audit/mia.py", "seconds": round(time.monotonic() - started, 1)}
    (args.out / "mia.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (args.out / "mia.md").write_text(table + "\n")
    print(table)
    print(f"\ntotal time: {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
