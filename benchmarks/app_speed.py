"""What an app waits for a token, side by side in one run, against transformers' own greedy loop.

On the pretrained SmolLM2-135M-Instruct, one chat question, answers of ``--tokens`` tokens (stop strings and EOS
off, so every path makes the same number of tokens), the median of ``--repeats`` answers each:

- raw greedy: ``model.generate(do_sample=False)`` of transformers on the same model object (the floor of a
  public answer; what an app has without this library);
- the backend's greedy zero-shot: :func:`~dp_icl_plugin.backends.generation.greedy_generate` on
  :class:`~dp_icl_plugin.backends.hf.HFBackend` (what ``ChatZeroShot`` runs);
- DPS-MOZO (n_shots = 4) over 100 TREC questions, its records' prefixes warm (the steady state), and its floor
  (``decoding_floor.py``'s: per token one forward of the 4 drawn records' query parts and answer so far on
  their cached record prefixes, the zero-shot row counted free);
- expert decoding (k = 40) over 2,000 TREC questions, the question's experts' prefixes warm;
- the floor of expert decoding on the raw model: per answer one forward of the k experts' query parts on cached
  record prefixes, then per token one forward of k + 1 one-token rows (what the mechanism needs, with no public
  shapes and the public row not apart).

Rows marked "before" rerun the code's earlier setting in the same run: greedy in a micro-batch of 8 rows (filler
rows around the lone prompt), expert decoding with 256 new tokens a forward (its k query parts in three forwards),
DPS-MOZO with its zero-shot row computed whole at every token (its query part again, not one new position).

Each DP answer is charged to an in-memory ledger with room for all of them. Prints a Markdown table: seconds a
token and the ratio to raw greedy.

    OMP_NUM_THREADS=2 python benchmarks/app_speed.py            # about 6 minutes on 2 CPU cores
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
from dp_icl_plugin.decoding import decoders
from dp_icl_plugin.decoding.decoders import MozoDecoder
from dp_icl_plugin.decoding.factory import step_tokens
from dp_icl_plugin.steps import mozo_step

TREC = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec" / "train.txt"
QUERY = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}]


def records(n: int) -> PrivateDataset:
    lines = TREC.read_text(encoding="latin-1").splitlines()[:n]
    return PrivateDataset.from_pairs([ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines])


def per_token(runs: list[tuple[str, Callable[[int], int]]], repeats: int) -> list[tuple[str, float]]:
    """Each run's median seconds per generated token over ``repeats`` rounds (``run(seed)`` returns the tokens made).
    The runs take turns within each round, so a load on the machine that comes and goes touches all of them."""
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    for seed in range(repeats):
        for name, run in runs:
            start = time.perf_counter()
            made = run(seed)
            times[name].append((time.perf_counter() - start) / max(1, made))
    return [(name, float(np.median(times[name]))) for name, _ in runs]


def expert_floor(model, tokens: int, k: int, prefix: int = 40, query: int = 16) -> float:  # type: ignore[no-untyped-def]
    """Seconds a token of the floor: k rows' ``query`` new tokens on cached ``prefix`` positions once, then
    ``tokens - 1`` forwards of k + 1 one-token rows (caches built outside the timer)."""
    import torch

    def forward(ids, cache, past):  # type: ignore[no-untyped-def]
        rows, width = ids.shape
        return model(
            input_ids=ids,
            attention_mask=torch.ones((rows, past + width), dtype=torch.long),
            position_ids=torch.arange(past, past + width).expand(rows, width),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )

    with torch.inference_mode():
        cache = forward(torch.ones((k + 1, prefix), dtype=torch.long), None, 0).cache
        start = time.perf_counter()
        cache = forward(torch.ones((k + 1, query), dtype=torch.long), cache, prefix).cache
        for t in range(tokens - 1):
            cache = forward(torch.ones((k + 1, 1), dtype=torch.long), cache, prefix + query + t).cache
        return (time.perf_counter() - start) / tokens


class ZeroShotWhole(mozo_step.MozoStep):
    """The earlier DPS-MOZO step: its zero-shot row computed whole at every token, in a call of its own."""

    def _zero_shot_row(self, generated: list[int]) -> np.ndarray:
        return mozo_step.rows_logprobs(self.backend, [self.zero_shot], generated, suffix=self.suffix, public=1)


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
    runs: list[tuple[str, Callable[[int], int]]] = []

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
    runs.append(("transformers `model.generate` (greedy)", raw))

    if "greedy" not in args.skip:
        greedy = HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu")

        def backend_greedy(seed: int) -> int:
            return len(greedy_generate(greedy, [prompt], max_new_tokens=tokens, stop=())[0])

        backend_greedy(0)
        runs.append(("backend greedy zero-shot (`greedy_generate`)", backend_greedy))

        def backend_greedy_before(seed: int) -> int:  # outside the public-rows scope: a micro-batch of 8 rows
            return len(greedy_generate(greedy, [prompt], max_new_tokens=tokens, stop=(), public=False)[0])

        runs.append(("before: backend greedy, 8-row micro-batches", backend_greedy_before))

    budget = BudgetManager(PrivacyBudget(1e6, 1e-4))
    if "mozo" not in args.skip:
        backend = HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu", micro_batch_size=4)
        mozo = MozoDecoder(records(100), backend=backend, budget=budget, n_queries=1000, epsilon=8.0, max_tokens=tokens)

        def mozo_answer(seed: int) -> int:
            return len(mozo.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[]).token_ids)

        def mozo_answer_before(seed: int) -> int:
            shipped, decoders.MozoStep = decoders.MozoStep, ZeroShotWhole  # type: ignore[misc]
            try:
                return mozo_answer(seed)
            finally:
                decoders.MozoStep = shipped  # type: ignore[misc]

        for seed in range(8):  # every record's prefix cached: the steady state
            mozo_answer(100 + seed)
        runs.append(("DPS-MOZO (n_shots = 4), records warm", mozo_answer))
        runs.append(("before: DPS-MOZO, its zero-shot row computed whole at every token", mozo_answer_before))

    if "experts" not in args.skip:
        for label, per_forward in (("", step_tokens("knn-experts", 40) or 256), ("before: ", 256)):
            backend = HFBackend(
                loaded.model,
                loaded.tokenizer,
                model_id=loaded.model_id,
                device="cpu",
                micro_batch_size=40,
                tokens_per_forward=per_forward,
            )
            experts = build_expert_decoder(
                backend,
                records(2000),
                budget=BudgetManager(PrivacyBudget(1e6, 1e-4)),  # one cover each (ε = 1e3 per record)
                epsilon=1e3,
                n_queries=1000,
                uses=1000,
                k=40,
                min_similarity=0.0,  # 40 experts on every answer: the cost of a full step
                max_tokens=tokens,
            )

            def expert_answer(seed: int, experts=experts) -> int:  # type: ignore[no-untyped-def]
                return len(
                    experts.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[]).token_ids
                )

            expert_answer(99)  # the question's experts' prefixes cached
            name = f"{label}expert decoding (k = 40), records warm, {per_forward} new tokens a forward"
            runs.append((name, expert_answer))

    rows = per_token(runs, args.repeats)
    if "experts" not in args.skip:
        floors = [expert_floor(model, tokens, 40) for _ in range(args.repeats)]
        rows.append(("floor of expert decoding (k = 40, raw model)", float(np.median(floors))))

    if "mozo" not in args.skip:
        from decoding_floor import mozo_floor_seconds_per_token

        floors = [mozo_floor_seconds_per_token(backend, records(100), 4, tokens) for _ in range(args.repeats)]
        rows.append(("floor of DPS-MOZO (n_shots = 4, raw model, zero-shot row free)", float(np.median(floors))))
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
