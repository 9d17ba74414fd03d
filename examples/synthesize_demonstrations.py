"""DP synthetic demonstrations, end to end: private records in, a reusable demonstration file out.

Runs offline in well under a minute on the committed GINC model: 1,600 private GINC examples per concept,
PTA at ε = 1 (δ = 1/1,600) charged to a ledger file, four demonstrations per concept saved and loaded back
(loading charges nothing), then the ledger.

    python examples/synthesize_demonstrations.py [LEDGER] [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dp_icl_plugin import PRESETS, BudgetManager, DemoSet, PrivacyBudget, PTASynthesizer
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import private_dataset
from dp_icl_plugin.ginc.prompts import pta_split


def main() -> None:
    workdir = Path("examples-ledgers") / "synthesize_demonstrations"  # in the working directory, not /tmp
    workdir.mkdir(parents=True, exist_ok=True)
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else workdir / "ledger.db"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else workdir / "demos.jsonl"

    backend, language = load_model(device="cpu")
    split = pta_split(language, n_train=1600, n_test=10, rng=np.random.default_rng(0))
    private = private_dataset(language, {c: train for c, (train, _) in split.items()})  # the private records

    # --8<-- [start:synthesize]
    budget = BudgetManager(PrivacyBudget(epsilon=3.0, delta=1 / 1600), ledger=ledger)
    method = PTASynthesizer(
        epsilon=1.0,
        delta=1 / 1600,
        alpha=2.0,
        n_prompts=5,
        records_per_prompt=4,
        max_tokens=10,
        shots_per_label=4,
        top_k=10,
        template=PRESETS["ginc"],
    )
    print("this run will charge:", method.event(private))
    demos = method.synthesize(private, backend=backend, budget=budget, rng=np.random.default_rng())
    demos.save(out)
    # --8<-- [end:synthesize]

    reused = DemoSet.load(out)  # post-processing: reuse forever, no further charge
    print(reused)
    for demo in reused.for_label("concept-0"):
        print("  concept-0:", demo.text)
    print(
        f"ledger {ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
        f"(δ = {budget.budget.delta:.3g}); charges: {budget.label_counts()}"
    )
    budget.close()


if __name__ == "__main__":
    main()
