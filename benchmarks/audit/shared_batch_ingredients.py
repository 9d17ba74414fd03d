"""Which ingredient of the old shared batch moved DPS-MOZO's public zero-shot row (issue 27)?

Before row isolation (commit f0de48a), ``HFBackend`` computed a MOZO step's rows in three moves, each a
candidate for making the zero-shot row depend on the drawn records:

1. **the cut**: the rows were cut where they stop differing (their longest common suffix with the zero-shot
   prompt), a cut read from the private rows;
2. **the parts together**: every row's part before the cut went through one left-padded forward, as wide as
   the call's longest part;
3. **the suffix over padded keys**: every part's keys and values were zero-padded on the left to the call's
   longest part, and one forward computed the common suffix for all rows.

This takes the prompts of the real ``MozoDecoder``'s first token on SmolLM2-135M-Instruct in bfloat16, on D
(the drawn record two words) and D′ (the same record 50 or 300 words), and computes them in one call, as the
decoder sent them before row isolation, through the old algorithm as the audit writes
it (:class:`~dp_icl_plugin.audit.decoder_case.SharedBatchRows`) and through variants with one move undone:
each part in its own forward (2 off), each row's suffix in its own forward over its own keys (3 off), both.
It reports the cut on D and D′, the largest change of the zero-shot row and of the rows of the drawn records
that did not change. Then the width scan: the zero-shot row alone (completion prompt, its one-token part),
its keys padded to each width 1–64: which widths give the same bits.

    OMP_NUM_THREADS=1 python benchmarks/audit/shared_batch_ingredients.py   # ~3 min on one CPU core

Writes ``benchmarks/audit/results/shared_batch_ingredients.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin.audit import decoder_case as dc

RESULTS = Path(__file__).parent / "results"
COMPLETION = ("Is water wet?", "Do cats bark?", "Who wrote Hamlet?", "What does NASA stand for?")
CHAT = ({"role": "user", "content": "Is water wet?"},)


class PartsAlone(dc.SharedBatchRows):
    """Move 2 undone: each missing part in its own forward (no padding to the longest part)."""

    def _fill_parts(self, parts: list[tuple[int, ...]]) -> None:
        for part in dict.fromkeys(parts):
            super()._fill_parts([part])


class SuffixAlone(dc.SharedBatchRows):
    """Move 3 undone: the parts as before (together), then each row's suffix over its own keys only."""

    def _suffix_forward(self, prefixes: list[list[int]], suffix: list[int], width: int | None = None) -> np.ndarray:
        self._fill_parts([tuple(p) for p in prefixes])
        return np.vstack([super(SuffixAlone, self)._suffix_forward([p], suffix) for p in prefixes])


class BothAlone(PartsAlone, SuffixAlone):
    """Moves 2 and 3 undone: every part and every row on its own."""


VARIANTS: dict[str, type[dc.SharedBatchRows]] = {
    "old (all three)": dc.SharedBatchRows,
    "parts each alone": PartsAlone,
    "suffix rows each alone": SuffixAlone,
    "both alone": BothAlone,
}


def cut(prompts: list[list[int]]) -> int | None:
    return dc._old_split(prompts, None)


def ingredients(inner: Any, repeats: int, query: Any) -> dict[str, Any]:
    d, d_prime, _ = dc._datasets(repeats)
    row: dict[str, Any] = {
        "query": query if isinstance(query, str) else f"chat: {query[-1]['content']}",
        "long_record_words": 50 * repeats,
    }
    # the step's prompts as the shipped decoder builds them (seeded draw), sent in one call as before
    (_, prompts_d), (_, prompts_d_prime) = (dc.step_rows(dc.RecordingBackend(inner), ds, query) for ds in (d, d_prime))
    for name, kind in VARIANTS.items():
        rows_d, rows_d_prime = (
            kind(inner).next_token_logprobs_shared_suffix(prompts, []) for prompts in (prompts_d, prompts_d_prime)
        )
        others = [1, 3, 4]  # the drawn records that are the same on D and D′ (row 2 is the replaced one)
        row[name] = {
            "zero_shot_max_abs_diff": float(np.abs(rows_d[0] - rows_d_prime[0]).max()),
            "other_records_max_abs_diff": float(np.abs(rows_d[others] - rows_d_prime[others]).max()),
        }
        c, c_prime = cut(prompts_d), cut(prompts_d_prime)
        row["cut_tokens"] = [c, c_prime]
        row["zero_shot_part_tokens"] = len(prompts_d[0]) - (c or 0)
        row["longest_part_tokens"] = [
            max(len(p) for p in prompts_d) - (c or 0),
            max(len(p) for p in prompts_d_prime) - (c_prime or 0),
        ]
    return row


def width_scan(inner: Any, query: str, widths: range) -> dict[str, list[int]]:
    """Classes of widths that give the zero-shot row the same bits (its part padded to each width)."""
    import torch

    from dp_icl_plugin.templates.answer import AnswerTemplate

    zero = inner.encode(AnswerTemplate(stop=None).zero_shot_prompt(query), add_special_tokens=True)
    backend = dc.SharedBatchRows(inner)
    with torch.inference_mode():
        rows = {w: backend._suffix_forward([zero[:1]], zero[1:], width=w)[0] for w in widths}
    classes: dict[int, list[int]] = {}
    for w, r in rows.items():
        first = next((k for k in classes if np.array_equal(rows[k], r)), w)
        classes.setdefault(first, []).append(w)
    return {f"same as width {k}": v for k, v in classes.items()}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    import torch

    started = time.perf_counter()
    inner = dc._backend()
    table = [ingredients(inner, r, q) for r in (1, 6) for q in COMPLETION]
    table.append(ingredients(inner, 1, CHAT))
    scan = width_scan(inner, "Who wrote Hamlet?", range(1, 65))
    result = {
        "model": f"{dc.MODEL}, bfloat16, CPU",
        "machine": f"{platform.machine()}, torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s)",
        "ingredients": table,
        "width_scan (zero-shot row of 'Who wrote Hamlet?', its 1-token part padded to widths 1-64)": scan,
        "seconds": round(time.perf_counter() - started, 1),
    }
    lines = [
        "| query | long record (words) | cut D / D′ | longest part D / D′ | zero-shot part | "
        + " | ".join(f"zero-shot Δ, {v}" for v in VARIANTS)
        + " | other records Δ, old |",
        "|---|---:|---|---|---:|" + "---:|" * len(VARIANTS) + "---:|",
    ]
    for r in table:
        cells = " | ".join(f"{r[v]['zero_shot_max_abs_diff']:.3f}" for v in VARIANTS)
        lines.append(
            f"| {r['query']} | {r['long_record_words']} | {r['cut_tokens'][0]} / {r['cut_tokens'][1]} | "
            f"{r['longest_part_tokens'][0]} / {r['longest_part_tokens'][1]} | {r['zero_shot_part_tokens']} | "
            f"{cells} | {r['old (all three)']['other_records_max_abs_diff']:.3f} |"
        )
    lines.append("")
    lines.append("Width scan: " + "; ".join(f"{k}: {v}" for k, v in scan.items()))
    markdown = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shared_batch_ingredients.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "shared_batch_ingredients.md").write_text(
        f"Command: `python benchmarks/audit/shared_batch_ingredients.py` ({result['seconds']} s; {result['machine']})"
        f"\n\n{markdown}\n"
    )
    print(markdown)
    print(f"{result['seconds']} s")


if __name__ == "__main__":
    main()
