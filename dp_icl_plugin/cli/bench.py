"""``dp-icl bench``: the GINC pretraining and in-context-learning benchmarks."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from dp_icl_plugin.ginc import default_model_path, load_model
from dp_icl_plugin.ginc.evaluation import evaluate_icl, write_report
from dp_icl_plugin.ginc.language import GincConfig
from dp_icl_plugin.ginc.training import TrainingConfig, train

__all__ = ["add_parsers", "ginc_eval", "ginc_train"]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    if min(values) < 0:
        raise argparse.ArgumentTypeError(f"negative values in {text!r}")
    return values


def add_parsers(top: Any, common: argparse.ArgumentParser, number: Any, integer: Any) -> None:
    """Register ``bench ginc-train`` and ``bench ginc-eval`` under the top-level subparsers ``top``."""
    bench = top.add_parser("bench", help="GINC benchmarks: train the model, measure in-context learning")
    sub = bench.add_subparsers(dest="what", required=True, metavar="BENCHMARK")

    p = sub.add_parser("ginc-train", parents=[common], help="pretrain a GPT-2 on GINC (resumable)")
    p.add_argument("--out", required=True, help="model directory (a checkpoint there is resumed)")
    p.add_argument("--steps", type=integer, default=10_000, help="optimiser steps (the budget; default 10000)")
    p.add_argument("--n-layer", type=integer, default=4)
    p.add_argument("--n-embd", type=integer, default=128)
    p.add_argument("--n-head", type=integer, default=4)
    p.add_argument("--seq-len", type=integer, default=256)
    p.add_argument("--batch-size", type=integer, default=8)
    p.add_argument("--lr", type=number, default=3e-3)
    p.add_argument("--warmup-steps", type=integer, default=100)
    p.add_argument("--n-documents", type=integer, default=1000)
    p.add_argument("--n-symbols", type=integer, default=150, choices=[50, 150])
    p.add_argument("--language-seed", type=integer, default=0)
    p.add_argument("--data-seed", type=integer, default=1)
    p.add_argument("--train-seed", type=integer, default=0)
    p.add_argument("--threads", type=integer, default=1, help="torch threads (1 is fastest on a busy 2-core box)")
    p.add_argument("--eval-every", type=integer, default=500)
    p.add_argument("--max-minutes", type=number, default=None, help="stop (and checkpoint) after this long")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=ginc_train)

    p = sub.add_parser("ginc-eval", parents=[common], help="in-context-learning accuracy of a GINC model")
    p.add_argument("--model", default=None, help="model directory (default: the committed GINC model)")
    p.add_argument("--shots", type=_int_list, default=[0, 1, 2, 4, 8], help="comma-separated (default 0,1,2,4,8)")
    p.add_argument("--k", type=_int_list, default=[3, 5, 10], help="example lengths, comma-separated (default 3,5,10)")
    p.add_argument("--prompts", type=integer, default=1000, help="prompts per (k, shots) cell (default 1000)")
    p.add_argument("--seed", type=integer, default=0)
    p.add_argument("--report", default=None, help="also write ginc_eval.{json,md,png} to this directory")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, ...")
    p.add_argument("--threads", type=integer, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.set_defaults(handler=ginc_eval)


def ginc_train(a: argparse.Namespace) -> dict[str, Any]:

    config = TrainingConfig(
        n_layer=a.n_layer,
        n_embd=a.n_embd,
        n_head=a.n_head,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        steps=a.steps,
        learning_rate=a.lr,
        warmup_steps=a.warmup_steps,
        n_documents=a.n_documents,
        data_seed=a.data_seed,
        train_seed=a.train_seed,
        threads=a.threads,
        eval_every=a.eval_every,
    )
    language = GincConfig(n_symbols=a.n_symbols, seed=a.language_seed)
    command = (
        "dp-icl bench ginc-train " + shlex.join(sys.argv[sys.argv.index("ginc-train") + 1 :])
        if "ginc-train" in sys.argv
        else None
    )
    r = train(a.out, config, language=language, max_minutes=a.max_minutes, progress=not a.no_progress, command=command)
    return {
        "output_dir": str(r.output_dir),
        "finished": r.finished,
        "step": r.step,
        "steps": config.steps,
        "tokens": r.step * config.batch_size * config.seq_len,
        "train_loss": r.train_loss,
        "validation_loss": r.validation_loss,
        "seconds": round(r.seconds, 1),
        "tokens_per_second": round(r.tokens_per_second, 1),
    }


def ginc_eval(a: argparse.Namespace) -> dict[str, Any]:

    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    started = time.monotonic()
    backend, language = load_model(a.model, device=a.device, micro_batch_size=256)  # thousands of public prompts
    cells = evaluate_icl(
        backend, language, shots=a.shots, ks=a.k, n_prompts=a.prompts, seed=a.seed, progress=a.progress
    )
    accuracy: dict[str, dict[str, float]] = {}
    for c in cells:
        accuracy.setdefault(str(c.k), {})[str(c.shots)] = round(c.accuracy, 4)
    result: dict[str, Any] = {
        "model": str(a.model) if a.model is not None else "committed",
        "model_path": str(a.model if a.model is not None else default_model_path()),
        "n_symbols": language.config.n_symbols,
        "prompts_per_cell": a.prompts,
        "seed": a.seed,
        "accuracy": accuracy,
        "results": [c.to_dict() for c in cells],
        "seconds": round(time.monotonic() - started, 2),
    }
    if a.report is not None:
        meta = {k: v for k, v in result.items() if k not in ("results", "model_path")}  # no machine paths in reports
        result["report"] = write_report(cells, a.report, meta=meta)
    return result
