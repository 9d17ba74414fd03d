"""Paired gains of harness rows over a control row from another run on the same held-out queries.

    python benchmarks/harness/against_control.py CONTROL.json "METHOD PREFIX" RUN.json [RUN.json ...]

Each row of each RUN whose task the control has is scored per query against the control row (the first of the
control's rows whose method starts with METHOD PREFIX, same task), with the harness's seeded 95 % bootstrap
interval (:func:`run.gain_interval`). The runs' restricted zero-shot scores must equal the control's, query by
query (the same queries in the same order), or the script stops.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run import gain_interval


def main(argv: list[str]) -> None:
    control_path, prefix, *runs = argv
    control = json.loads(Path(control_path).read_text())["rows"]
    chosen = {r["task"]: r for r in reversed(control) if r["method"].startswith(prefix)}
    baseline = {r["task"]: r for r in control if "restricted" in r["method"]}
    for path in runs:
        rows = json.loads(Path(path).read_text())["rows"]
        for row in rows:
            task = row["task"]
            if task not in chosen or row.get("scores") is None or row is chosen[task] or row["epsilon"] == 0:
                continue
            theirs = next(r for r in rows if r["task"] == task and "restricted" in r["method"])
            if theirs["scores"] != baseline[task]["scores"]:
                raise SystemExit(f"{path}: not the control's queries (restricted zero-shot differs on {task})")
            g = gain_interval(np.asarray(row["scores"]) - np.asarray(chosen[task]["scores"]))
            print(
                f"{task}\t{row['method']}\tε={row['epsilon']:g}\t{row['score']:.1f} against {chosen[task]['score']:.1f}"
                f"\t{g['gain']:+.1f} [{g['gain_low']:+.1f}, {g['gain_high']:+.1f}]"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
