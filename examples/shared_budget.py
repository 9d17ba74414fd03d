"""One budget shared by several components of an app, persisted across restarts.

Three "components" (a demonstration synthesizer, a clip-blend decoder and a kNN voter) charge the same
SQLite ledger; each checks ``would_fit`` before doing private work, charges with ``spend`` before
releasing, and stops cleanly when the budget is exhausted.

Run: ``.venv/bin/python examples/shared_budget.py [LEDGER]`` (a temporary file by default), then
``dp-icl budget show --ledger LEDGER --human``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from dp_icl_plugin import BudgetExhaustedError, BudgetManager, PrivacyBudget, PureDPEvent
from dp_icl_plugin.accounting import calibrate_subsampled_gaussian
from dp_icl_plugin.accounting import method_events as me


def main() -> None:
    scratch = None if len(sys.argv) > 1 else tempfile.TemporaryDirectory()  # removed at exit
    ledger = Path(sys.argv[1]) if scratch is None else Path(scratch.name) / "app-ledger.db"
    budget = BudgetManager(PrivacyBudget(epsilon=4.0, delta=1e-5), ledger=ledger)

    # Offline: synthesize demonstrations once (Poisson rate 20/5000, 4 labels × 1 demo × 50 tokens).
    q, steps = 20 / 5_000, 4 * 50
    sigma = calibrate_subsampled_gaussian(epsilon=1.0, delta=1e-5, sampling_rate=q, steps=steps).value
    budget.spend(me.tang_event(noise_multiplier=sigma, sampling_rate=q, steps=steps), label="selector:synthesize")
    print(f"synthesized demonstrations with σ = {sigma}; spent ε = {budget.spent().epsilon:.3f}")

    # Online: answers charged one by one until the budget refuses.
    answer = me.clip_blend_event(clip=10.0, subset_size=380, temperature=1.5, steps=30)
    vote = PureDPEvent(0.05, neighbouring="replace_one")
    served = 0
    while True:
        event, label = (answer, "llm:clip-blend") if served % 2 == 0 else (vote, "retriever:noisy-vote")
        if not budget.would_fit(event):
            break
        try:
            budget.spend(event, label=label)  # another process may have taken the last of the budget
        except BudgetExhaustedError:
            break
        served += 1
    print(f"served {served} private answers; spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon}")
    print(f"ledger: {ledger}")


if __name__ == "__main__":
    main()
