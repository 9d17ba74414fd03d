"""The main job of ``make demo`` (for now): calibrate, charge a shared ledger, show it.

Walks through what every DP-ICL component will do: describe a release as an event, calibrate its noise
for a target ε, charge the shared budget before releasing, and read the ledger back from disk as a
restarted process would. Run ``python -m dp_icl_plugin.demo --help`` for options.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dp_icl_plugin.accounting import BudgetManager, PrivacyBudget, calibrate_subsampled_gaussian
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.errors import BudgetExhaustedError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dp_icl_plugin.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=None, help="ledger file (default: a fresh temporary file)")
    args = parser.parse_args(argv)
    ledger = args.ledger or Path(tempfile.mkdtemp(prefix="dp-icl-demo-")) / "ledger.db"

    # AG News settings of PTA (Table 4): M·N = 20 of |D_y| = 30,000 per token, T = 100 tokens.
    q, steps, delta = 20 / 30_000, 100, 1 / 30_000
    print("1. Calibrate the noise of a PTA synthesis run (PRV accounting, Poisson sampling)")
    for eps in (1.0, 2.0, 4.0, 8.0):
        r = calibrate_subsampled_gaussian(epsilon=eps, delta=delta, sampling_rate=q, steps=steps)
        print(f"   target ε = {eps:<3g} → σ = {r.value:.2f} (achieves ε = {r.epsilon:.4f})")

    print(f"\n2. One shared budget: ε = 3, δ = {delta:.3g}, ledger {ledger}")
    budget = BudgetManager(PrivacyBudget(epsilon=3.0, delta=delta), ledger=ledger)
    sigma = calibrate_subsampled_gaussian(epsilon=1.0, delta=delta, sampling_rate=q, steps=steps).value
    synth = me.tang_event(noise_multiplier=sigma, sampling_rate=q, steps=steps)
    entry = budget.spend(synth, label="pta:synthesize-demos")
    print(f"   charged PTA synthesis (σ = {sigma}): entry #{entry.id}, spent ε = {budget.spent().epsilon:.4f}")
    blend = me.clip_blend_event(clip=10.0, subset_size=255, temperature=1.0, steps=50)
    bounds = tightest().epsilons(blend, delta=delta)
    print("   clip-blend answer (c = 10, s = 255, τ = 1, 50 tokens) costs on its own: "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(bounds.items())))  # fmt: skip
    answers = 0
    try:
        while True:
            budget.spend(blend, label="clip-blend:answer")
            answers += 1
    except BudgetExhaustedError as exc:
        print(f"   answered {answers} queries, then refused: {exc}")

    print("\n3. A restarted process opens the same file and sees everything spent")
    reopened = BudgetManager.open(ledger)
    spent, left = reopened.spent(), reopened.remaining()
    print(f"   spent ε = {spent.epsilon:.4f}, remaining ε = {left.epsilon:.4f} at δ = {spent.delta:.3g}")
    for label, count in sorted(reopened.label_counts().items()):
        print(f"   {count:>4} × {label}")
    print(f"\n   inspect it yourself: dp-icl budget show --ledger {ledger} --human")
    budget.close()
    reopened.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
