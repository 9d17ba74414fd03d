"""What an app waits for a token, side by side in one run, against transformers' own greedy loop.

On the pretrained SmolLM2-135M-Instruct, one chat question, answers of ``--tokens`` tokens (stop strings and EOS
off, so every path makes the same number of tokens), the median of ``--repeats`` answers each:

- raw greedy: ``model.generate(do_sample=False)`` of transformers on the same model object (the floor of a
  public answer; what an app has without this library);
- the backend's greedy zero-shot: :func:`~dp_icl_plugin.backends.generation.greedy_generate` on
  :class:`~dp_icl_plugin.backends.hf.HFBackend` (what ``ChatZeroShot`` runs);
- DPS-MOZO (n_shots = 4) over 100 TREC questions, its records' prefixes warm (the steady state);
- expert decoding (k = 40) over 2,000 TREC questions, the question's experts' prefixes warm.

Each DP answer is charged to an in-memory ledger with room for all of them. Prints a Markdown table: seconds a
token and the ratio to raw greedy.

    OMP_NUM_THREADS=2 python benchmarks/app_speed.py            # about 3 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, HFBackend, PrivacyBudget, PrivateDataset, build_expert_decoder
from dp_icl_plugin.backends.generation import greedy_generate
from dp_icl_plugin.decoding.decoders import MozoDecoder

TREC = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec" / "train.txt"
QUERY = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}]


def records(n: int) -> PrivateDataset:
    lines = TREC.read_text(encoding="latin-1").splitlines()[:n]
    return PrivateDataset.from_pairs([ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines])


def per_token(run: Callable[[int], int], repeats: int) -> float:
    """The median over ``repeats`` runs of seconds per generated token (``run(seed)`` returns the tokens made)."""
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        made = run(seed)
        times.append((time.perf_counter() - start) / max(1, made))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], help="rows to leave out: greedy, mozo, experts")
    args = parser.parse_args()
    import torch

    loaded = HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu")
    model, tokens = loaded.model, args.tokens
    prompt = loaded.apply_chat_template(QUERY)
    rows: list[tuple[str, float]] = []

    def raw(seed: int) -> int:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=loaded.eos_token_id,
            )
        return int(out.shape[1] - len(prompt))

    raw(0)  # warm-up: the first call pays one-off set-up
    rows.append(("transformers `model.generate` (greedy)", per_token(raw, args.repeats)))

    if "greedy" not in args.skip:
        greedy = HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu")

        def backend_greedy(seed: int) -> int:
            return len(greedy_generate(greedy, [prompt], max_new_tokens=tokens, stop=())[0])

        backend_greedy(0)
        rows.append(("backend greedy zero-shot (`greedy_generate`)", per_token(backend_greedy, args.repeats)))

    budget = BudgetManager(PrivacyBudget(1e6, 1e-4))
    if "mozo" not in args.skip:
        backend = HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu", micro_batch_size=4)
        mozo = MozoDecoder(records(100), backend=backend, budget=budget, n_queries=1000, epsilon=8.0, max_tokens=tokens)

        def mozo_answer(seed: int) -> int:
            return len(mozo.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[]).token_ids)

        for seed in range(8):  # every record's prefix cached: the steady state
            mozo_answer(100 + seed)
        rows.append(("DPS-MOZO (n_shots = 4), records warm", per_token(mozo_answer, args.repeats)))

    if "experts" not in args.skip:
        backend = HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu", micro_batch_size=40)
        experts = build_expert_decoder(
            backend,
            records(2000),
            budget=budget,
            epsilon=1e3,
            n_queries=1000,
            uses=1000,
            k=40,
            min_similarity=0.0,  # 40 experts on every answer: the cost of a full step
            max_tokens=tokens,
        )

        def expert_answer(seed: int) -> int:
            return len(experts.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[]).token_ids)

        expert_answer(99)  # the question's experts' prefixes cached
        rows.append(("expert decoding (k = 40), records warm", per_token(expert_answer, args.repeats)))

    floor = rows[0][1]
    print(
        f"SmolLM2-135M-Instruct, CPU, {torch.get_num_threads()} threads (OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), {tokens}-token answers, median of {args.repeats}"
    )
    print("| path | s/token | × raw greedy |")
    print("|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} | {seconds / floor:.2f}× |")


if __name__ == "__main__":
    main()
