"""Does computing more rows per forward pay on this machine? The question behind sharing token steps across the
answers of a batch.

A DP decoder's step computes a few rows (DPS-MOZO: ``n_shots`` one-shot prompts). Several answers of a batch
could put their rows into one forward instead of one forward each; that pays only where a forward of more rows
costs less per row. This measures the backend's cost per row for 4, 8 and 16 rows of 60 tokens (public made-up
token ids, no prefix cache) at micro-batch sizes 4, 8 and 16, side by side in one run, with one torch thread.

    OMP_NUM_THREADS=1 python benchmarks/rows_per_forward.py      # about a minute on SmolLM2-135M-Instruct (CPU)

On the 2-core CPU of the project's machine (2026-11-27) every cell cost 102 to 114 ms a row: a forward's cost is
linear in its rows, so batching answers' steps would not make a batch faster here; on a GPU, where a forward of
16 rows costs little more than one of 4, it would (not measured: no GPU was lent).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dp_icl_plugin.backends.hf import HFBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = [list(np.random.default_rng(i).integers(100, 20000, size=args.tokens)) for i in range(16)]
    print("| micro-batch | rows | ms per forward | ms per row |")
    print("|---:|---:|---:|---:|")
    for micro_batch in (4, 8, 16):
        backend = HFBackend.from_pretrained(
            args.model, device=args.device, dtype="float32", micro_batch_size=micro_batch
        )
        for n in (4, 8, 16):
            backend.next_token_logprobs(rows[:n])  # warm
            started = time.perf_counter()
            for _ in range(args.repeats):
                backend.next_token_logprobs(rows[:n])
            seconds = (time.perf_counter() - started) / args.repeats
            print(f"| {micro_batch} | {n} | {1000 * seconds:.0f} | {1000 * seconds / n:.1f} |")


if __name__ == "__main__":
    main()
