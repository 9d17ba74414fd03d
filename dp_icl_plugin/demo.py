"""The main job of ``make demo``: a real model that learns in context, and the privacy accounting around it.

1. Loads the committed GINC model (a GPT-2 pretrained here on the synthetic GINC language) through
   ``HFBackend`` and measures in-context learning: accuracy with real demonstrations against 0-shot.
   Real demonstrations are exactly what DP-ICL must not put in a prompt as they are.
2. Calibrates the noise of a PTA synthesis run on GINC (Poisson sampling): PTA's own calibration
   (add/remove, PRV) beside this library's default (replace-one, dp-accounting PLD).
3. Charges releases to one shared ledger file, until it refuses.
4. Reads the ledger back as a restarted process would.

Run ``python -m dp_icl_plugin.demo --help`` for options.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dp_icl_plugin.accounting import BudgetManager, PrivacyBudget, calibrate_subsampled_gaussian
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.errors import BudgetExhaustedError
from dp_icl_plugin.ginc import default_model_path, load_model, read_metadata
from dp_icl_plugin.ginc.evaluation import evaluate_icl, to_markdown

__all__ = ["main"]


def _show_in_context_learning(n_prompts: int, seed: int) -> None:
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    started = time.monotonic()
    backend, language = load_model()
    meta = read_metadata()["training"]
    print(f"1. In-context learning of the committed GINC model ({default_model_path()})")
    print(
        f"   GPT-2, {meta['n_layer']} layers × width {meta['n_embd']}, |V| = {backend.vocab_size}, "
        f"pretrained on {meta['steps'] * meta['batch_size'] * meta['seq_len'] / 1e6:.1f}M GINC tokens"
    )
    cells = evaluate_icl(backend, language, shots=(0, 4), ks=(5, 10), n_prompts=n_prompts, seed=seed)
    print("   " + to_markdown(cells).replace("\n", "\n   "))
    by = {(c.k, c.shots): c.accuracy for c in cells}
    for k in (5, 10):
        print(f"   k = {k}: 4 real demonstrations lift accuracy {100 * by[k, 0]:.1f}% → {100 * by[k, 4]:.1f}%")
    print(f"   ({time.monotonic() - started:.1f} s; full table: dp-icl bench ginc-eval --human)")


def main(argv: list[str] | None = None) -> int:
    """Run the demo: GINC in-context learning, PTA's noise calibration, and one shared ledger charged until it refuses.

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(prog="python -m dp_icl_plugin.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=None, help="ledger file (default: a fresh temporary file)")
    parser.add_argument("--prompts", type=int, default=500, help="GINC test prompts per setting (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the GINC test prompts")
    args = parser.parse_args(argv)
    ledger = args.ledger or Path(tempfile.mkdtemp(prefix="dp-icl-demo-")) / "ledger.db"

    _show_in_context_learning(args.prompts, args.seed)

    # PTA's GINC settings (Table 4): M = 5 prompts × N = 4 records of |D_y| = 1,600 per token, 36 steps.
    q, steps, delta = 20 / 1600, 36, 1 / 1600
    print("\n2. Calibrate the noise of a PTA synthesis run on GINC (Poisson sampling)")
    print("   PTA's published σ (Table 4, add/remove, PRV): 0.70, 0.59, 0.47, 0.37")
    for eps in (1.0, 2.0, 4.0, 8.0):
        paper = calibrate_subsampled_gaussian(
            epsilon=eps, delta=delta, sampling_rate=q, steps=steps, accountant="prv", neighbouring="add_remove"
        )
        ours = calibrate_subsampled_gaussian(epsilon=eps, delta=delta, sampling_rate=q, steps=steps)
        print(
            f"   target ε = {eps:<3g} → σ = {paper.value:.2f} add/remove (PRV), "
            f"{ours.value:.2f} replace-one (PLD; this library's default relation)"
        )

    print(f"\n3. One shared budget: ε = 3, δ = {delta:.3g}, replace-one, ledger {ledger}")
    budget = BudgetManager(PrivacyBudget(epsilon=3.0, delta=delta), ledger=ledger)
    sigma = calibrate_subsampled_gaussian(epsilon=1.0, delta=delta, sampling_rate=q, steps=steps).value
    synth = me.tang_event(noise_multiplier=sigma, sampling_rate=q, steps=steps)
    entry = budget.spend(synth, label="pta:synthesize-demos")
    print(f"   charged PTA synthesis (σ = {sigma}): entry #{entry.id}, spent ε = {budget.spent().epsilon:.4f}")
    blend = me.clip_blend_event(clip=10.0, subset_size=255, temperature=1.0, steps=50)
    bounds = tightest().epsilons(blend, delta=delta)
    print(
        "   clip-blend answer (c = 10, s = 255, τ = 1, 50 tokens) costs on its own: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(bounds.items()))
    )
    answers = 0
    try:
        while True:
            budget.spend(blend, label="clip-blend:answer")
            answers += 1
    except BudgetExhaustedError as exc:
        print(f"   answered {answers} queries, then refused: {exc}")

    print("\n4. A restarted process opens the same file and sees everything spent")
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
