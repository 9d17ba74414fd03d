"""``dp-icl isolation``: the row-isolation check on the model, device and dtype a deployment uses."""

from __future__ import annotations

import argparse
import time
from typing import Any

from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.isolation import check_row_isolation
from dp_icl_plugin.backends.loading import is_server_url, load_backend
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["add_parser", "run"]


def add_parser(top: Any, common: argparse.ArgumentParser, integer: Any) -> None:
    p = top.add_parser(
        "isolation", parents=[common], help="is a row the same bits whatever shares its batch? (run it where apps run)"
    )
    p.add_argument("--model", required=True, help="a model folder, .gguf file, named model or a server URL")
    p.add_argument("--tokenizer", default=None, help="the served model's tokenizer (with a server URL)")
    p.add_argument("--device", default=None, help="auto (CUDA if available), cpu, cuda, ... (local models)")
    p.add_argument("--dtype", default=None, help="auto, float32, bfloat16, float16 (local models)")
    p.add_argument("--micro-batch-size", type=integer, default=None, help="rows per forward (local models)")
    p.add_argument("--seed", type=integer, default=0)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> dict[str, Any]:

    if is_server_url(args.model):
        if args.device or args.dtype or args.micro_batch_size:
            raise ConfigurationError("--device, --dtype and --micro-batch-size apply to local models only")
        backend = load_backend(args.model, tokenizer=args.tokenizer)
    elif args.micro_batch_size is not None:
        backend = HFBackend.from_pretrained(
            args.model, device=args.device or "auto", dtype=args.dtype or "auto", micro_batch_size=args.micro_batch_size
        )
    else:
        backend = load_backend(args.model, device=args.device, dtype=args.dtype)
    started = time.monotonic()
    report = check_row_isolation(backend, seed=args.seed)
    where = {
        "device": str(getattr(backend, "device", "server")),
        "dtype": str(getattr(getattr(backend, "model", None), "dtype", "server")),
    }
    result: dict[str, Any] = {
        "model": backend.model_id,
        **where,
        "isolated": report.isolated,
        "seconds": round(time.monotonic() - started, 1),
        "cases": [{"case": c.name, "max_abs_diff": c.max_abs_diff, "identical": c.identical} for c in report.cases],
        "audit_failed": not report.isolated,  # exit status 1 when a row is not isolated
    }
    if args.human:
        result = {k: v for k, v in result.items() if k != "cases"} | {"report": "\n" + str(report)}
    return result
