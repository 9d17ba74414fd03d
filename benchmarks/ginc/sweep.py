"""Which GINC model can this machine train? Train several shapes for one step budget, side by side.

Each shape gets the same data, seeds, schedule and number of tokens; the table shows what a CPU hour buys:
parameters, throughput, validation loss and in-context-learning accuracy (0 vs 4 shots at k = 5 and 10,
1,000 prompts per cell). Runs are resumable (re-run the same command after an interruption).

    python benchmarks/ginc/sweep.py --steps 2500 --shapes 4x128,2x128,4x192 --out /tmp/ginc-sweep
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.evaluation import evaluate_icl
from dp_icl_plugin.ginc.training import TrainingConfig, train


def _shape(text: str) -> tuple[int, int]:
    layers, width = text.lower().split("x")
    return int(layers), int(width)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2500, help="optimiser steps per shape (batch 8 × 256 tokens)")
    parser.add_argument("--shapes", default="4x128,2x128,4x192", help="LAYERSxWIDTH, comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="one model directory per shape goes here")
    parser.add_argument("--prompts", type=int, default=1000)
    args = parser.parse_args(argv)

    rows = []
    for layers, width in map(_shape, args.shapes.split(",")):
        config = TrainingConfig(n_layer=layers, n_embd=width, n_head=max(1, width // 32), steps=args.steps)
        result = train(args.out / f"{layers}x{width}", config, progress=sys.stderr.isatty())
        if not result.finished:
            print(f"{layers}x{width}: stopped at step {result.step}; run again to resume", file=sys.stderr)
            return 1
        backend, language = load_model(result.output_dir, device="cpu")
        cells = {
            (c.k, c.shots): c.accuracy
            for c in evaluate_icl(backend, language, shots=(0, 4), ks=(5, 10), n_prompts=args.prompts)
        }
        params = sum(p.numel() for p in backend.model.parameters())
        meta = json.loads((result.output_dir / "ginc.json").read_text())
        rows.append(
            {
                "shape": f"{layers}x{width}",
                "parameters": params,
                "tokens": config.tokens,
                "minutes": round(meta["training_seconds"] / 60, 1),
                "validation_loss": round(meta["validation_loss"], 4),
                **{f"k{k}_{n}shot": round(100 * a, 1) for (k, n), a in cells.items()},
            }
        )
    print("| shape | parameters | tokens | minutes | val loss | k=5 0-shot | k=5 4-shot | k=10 0-shot | k=10 4-shot |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        accuracy = " | ".join(str(r[key]) for key in ("k5_0shot", "k5_4shot", "k10_0shot", "k10_4shot"))
        print(
            f"| {r['shape']} | {r['parameters'] / 1e6:.2f}M | {r['tokens'] / 1e6:.1f}M | {r['minutes']} | "
            f"{r['validation_loss']} | {accuracy} |"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
