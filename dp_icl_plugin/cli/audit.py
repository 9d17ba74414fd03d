"""``dp-icl audit``: the statistical privacy audit (empirical ε lower bounds against the claims)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["add_parser", "run"]

QUICK_SAMPLES = 50_000
FULL_SAMPLES = 400_000


def add_parser(top: Any, common: argparse.ArgumentParser, integer: Any) -> None:
    p = top.add_parser("audit", parents=[common], help="statistical privacy audit of every mechanism")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SAMPLES:,} samples per input (42 rows: 259 s with 2 jobs on a busy 2-core machine)",
    )
    p.add_argument(
        "--samples", type=integer, default=None, help=f"outputs per input and pair (default {FULL_SAMPLES:,})"
    )
    p.add_argument("--seed", type=integer, default=0)
    p.add_argument(
        "--jobs",
        type=integer,
        default=None,
        help="worker processes sharing the cases (default: one per CPU; same rows for any)",
    )
    p.add_argument("--out", default=None, help="also write audit.json and audit.md into this folder")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (default: a bar on a terminal, a line every 30 s elsewhere)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # the audit's cases build a kNN index when imported (faiss, an optional dependency): loaded for this command only
    from dp_icl_plugin._progress import report_lines_off_a_terminal
    from dp_icl_plugin.audit import run_audit, to_markdown
    from dp_icl_plugin.audit.runner import available_cpus

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigurationError(f"--out {args.out} is a file, not a folder")  # before the audit, not after it
    default = QUICK_SAMPLES if args.quick else FULL_SAMPLES
    samples = default if args.samples is None else args.samples  # --samples 0 is an error, not the full audit
    started = time.monotonic()
    jobs = available_cpus() if args.jobs is None else args.jobs
    report_lines_off_a_terminal(not args.no_progress)
    rows = run_audit(samples=samples, seed=args.seed, jobs=jobs, progress=False if args.no_progress else None)
    table = to_markdown(rows)
    ran = [r for r in rows if not r.skipped]  # a skipped case proves nothing either way: listed, not judged
    shipped_ok = all(r.consistent for r in ran if not r.broken)
    broken_caught = all(not r.consistent for r in ran if r.broken)
    skipped = sorted({f"{r.mechanism}: {r.skipped}" for r in rows if r.skipped})
    command = (
        "dp-icl audit" + (" --quick" if args.quick else "") + (f" --samples {args.samples}" if args.samples else "")
    )
    result: dict[str, Any] = {
        "command": command,
        "samples_per_input": samples,
        "seconds": round(time.monotonic() - started, 1),
        "shipped_mechanisms_consistent": shipped_ok,
        "broken_mechanisms_caught": broken_caught,
        "skipped": skipped,
        "rows": [
            {
                "mechanism": r.mechanism,
                "variant": r.variant,
                "delta": r.delta,
                "claimed_epsilon": r.claimed_epsilon,
                "lower_bound": None if r.skipped else r.lower_bound,
                "verdict": r.verdict,
                "test": r.event,
                "seconds": round(r.seconds, 1),
            }
            for r in rows
        ],
        "audit_failed": not (shipped_ok and broken_caught),
    }
    if args.human:
        result = {k: v for k, v in result.items() if k != "rows"} | {"table": "\n" + table}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "audit.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        (out / "audit.md").write_text(f"Command: `{command}` ({result['seconds']} s)\n\n{table}\n")
    return result
