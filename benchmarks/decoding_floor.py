"""Time per token of the DP decoders on the pretrained SmolLM2-135M-Instruct, against the cost floor.

The floor is one batched forward of only the tokens that must be computed, with every reusable prefix already
in a KV cache (built outside the timer):
- DPS-MOZO online: per token, n_shots one-shot prompts whose record part (system turn + the record's exchange)
  is a cached prefix, so only the query and the answer so far are new, plus one new token of the zero-shot
  prompt (its cache persists across tokens).
- Clip-blend decoding: the prompts are fixed, so per token one new token per prompt on each prompt's cache.

What the decoders cost is measured by ``generate`` (charge, mechanism and forward passes). Both are printed, with
their ratio, in one run. Setting: 100 TREC questions as the private records (their parts fit the default prefix
cache), chat queries, T = 12; DPS-MOZO measured before and after its records' parts are cached (records recur
across tokens and answers: the steady state of a deployment).

    python benchmarks/decoding_floor.py            # about 3 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, HFBackend, PrivacyBudget, PrivateDataset
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.decoding.factory import step_rows

TREC = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec" / "train.txt"
QUERY = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}]


def records(n: int) -> PrivateDataset:
    lines = TREC.read_text(encoding="latin-1").splitlines()[:n]
    return PrivateDataset.from_pairs([ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines])


def decoder_seconds_per_token(decoder: MozoDecoder | ClipBlendDecoder, tokens: int, repeats: int) -> float:
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        out = decoder.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[])
        times.append((time.perf_counter() - start) / max(1, len(out.token_ids)))
    return float(np.median(times))


def _forward(model, ids, cache, past: int):  # one batched forward of ``ids`` after ``past`` cached positions
    import torch

    batch, width = ids.shape
    mask = torch.ones((batch, past + width), dtype=torch.long)
    positions = torch.arange(past, past + width).expand(batch, width)
    return model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
    )  # only the next token's logits are needed


def _cached_prefix(model, prefix: list[int], rows: int):
    import torch

    return _forward(model, torch.tensor([prefix] * rows), None, 0).cache


def _split(backend: HFBackend, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """A chat prompt's ids cut into the reusable prefix and the query part: what it shares at its end with the
    zero-shot prompt (the query turn and the generation prompt), as the decoder cuts it."""
    from dp_icl_plugin.backends.shared_rows import common_suffix_length

    full = backend.apply_chat_template(messages)
    zero = backend.apply_chat_template(QUERY)
    query_part = min(common_suffix_length(full, zero), len(full) - 1, len(zero) - 1)
    return full[: len(full) - query_part], full[len(full) - query_part :]


def mozo_floor_seconds_per_token(backend: HFBackend, data: PrivateDataset, n_shots: int, tokens: int) -> float:
    """Per token t: the n_shots one-shot prompts' new part (query + t answer tokens) in one batched forward on
    cached record prefixes (a lower bound: the zero-shot prompt's one new token rides in that batch for free),
    plus the zero-shot prompt's query once per answer. Caches are rebuilt outside the timer."""
    import torch

    model = backend.model
    rec = data.records(data.labels[0])[0]
    prefix, query = _split(
        backend,
        [QUERY[0], {"role": "user", "content": rec.text}, {"role": "assistant", "content": rec.label}, QUERY[1]],
    )
    zero_prefix, zero_query = _split(backend, QUERY)
    answer = backend.encode(" William Shakespeare wrote Hamlet around 1600, in London, England, for his company.")
    answer = answer[:tokens]
    with torch.inference_mode():
        cache = _cached_prefix(model, zero_prefix, 1)
        start = time.perf_counter()
        _forward(model, torch.tensor([zero_query]), cache, len(zero_prefix))  # once per answer
        total = time.perf_counter() - start
        for t in range(len(answer)):
            cache = _cached_prefix(model, prefix, n_shots)
            start = time.perf_counter()
            _forward(model, torch.tensor([query + answer[:t]] * n_shots), cache, len(prefix))
            total += time.perf_counter() - start
    return total / len(answer)


def clip_floor_seconds_per_token(backend: HFBackend, decoder: ClipBlendDecoder, tokens: int) -> float:
    """Per answer: the query part of every prompt on cached record prefixes (the records recur across answers),
    then one new token per prompt per step; prompts of one length (a record exchange is about 30 tokens)."""
    import torch

    model = backend.model
    n_prompts = 1 + len(decoder._subset)  # the public prompt and one per subset record
    prefix, query = _split(
        backend, [QUERY[0], {"role": "user", "content": "x " * 25}, {"role": "assistant", "content": "HUM"}, QUERY[1]]
    )
    total = 0.0
    with torch.inference_mode():
        cache = _cached_prefix(model, prefix, n_prompts)
        start = time.perf_counter()
        _forward(model, torch.tensor([query] * n_prompts), cache, len(prefix))
        total += time.perf_counter() - start
        past = len(prefix) + len(query)
        for t in range(tokens):
            start = time.perf_counter()
            _forward(model, torch.ones((n_prompts, 1), dtype=torch.long), cache, past + t)
            total += time.perf_counter() - start
    return total / tokens


class WholePrompts:
    """The backend without its prefix cache: every prompt of a step computed whole (what "re-encoded" measures)."""

    def __init__(self, inner: HFBackend) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        if name.startswith(("next_token_logprobs_shared", "start_shared")):
            raise AttributeError(name)
        return getattr(self._inner, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=100, help="private records (default 100: all fit the cache)")
    parser.add_argument("--warm-answers", type=int, default=8, help="answers run to fill the prefix cache")
    parser.add_argument(
        "--micro-batch-sizes",
        type=int,
        nargs="*",
        default=[8],
        help="rows per forward to measure besides each decoder's own (decoder_factory.step_rows)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    loaded = HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu")
    print(f"model loaded in {time.perf_counter() - started:.1f} s (converted and cached on first use)")
    data = records(args.records)
    subset = 32
    mozo_rows, clip_rows = step_rows("mozo", {"n_shots": 4}), step_rows("clip-blend", {"subset_size": subset})
    rows = []
    for mozo_b, clip_b in [(mozo_rows, clip_rows), *((b, b) for b in args.micro_batch_sizes)]:
        budget = BudgetManager(PrivacyBudget(1e6, 1e-4))

        def backend_of(b: int) -> HFBackend:
            return HFBackend(loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu", micro_batch_size=b)

        backend = backend_of(mozo_b)

        def mozo_on(model: HFBackend | WholePrompts, budget: BudgetManager = budget) -> MozoDecoder:
            return MozoDecoder(
                data,
                backend=model,
                budget=budget,
                n_queries=100,
                epsilon=8.0,  # type: ignore[arg-type]
                max_tokens=args.tokens,
            )

        clip_backend = backend_of(clip_b)
        clip = ClipBlendDecoder(
            data,
            backend=clip_backend,
            budget=budget,
            n_queries=100,
            subset_size=subset,
            epsilon=8.0,
            max_tokens=args.tokens,
            rng_subset=np.random.default_rng(0),
        )
        mozo_floor = mozo_floor_seconds_per_token(backend, data, 4, args.tokens)
        b = f"B = {mozo_b}"
        rows.append(
            (
                f"MozoDecoder (n_shots = 4), every prompt computed whole, {b}",
                decoder_seconds_per_token(mozo_on(WholePrompts(backend)), args.tokens, args.repeats),
                mozo_floor,
            )
        )
        mozo = mozo_on(backend)
        backend.prefix_cache.clear()
        rows.append(
            (
                f"MozoDecoder (n_shots = 4), records not yet cached, {b}",
                decoder_seconds_per_token(mozo, args.tokens, args.repeats),
                mozo_floor,
            )
        )
        for seed in range(args.warm_answers):  # every record's part in the prefix cache (steady state)
            mozo.generate(QUERY, rng=np.random.default_rng(100 + seed), max_tokens=args.tokens, stop=[])
        cache = backend.prefix_cache
        print(
            f"{b}: prefix cache: {len(cache)} prefixes, {cache.cached_tokens} tokens, "
            f"{cache.cached_bytes / max(1, cache.cached_tokens) / 1024:.0f} KiB a token"
        )
        rows.append(
            (
                f"MozoDecoder (n_shots = 4), records cached ({len(cache)} prefixes), {b}",
                decoder_seconds_per_token(mozo, args.tokens, args.repeats),
                mozo_floor,
            )
        )
        clip_floor = clip_floor_seconds_per_token(clip_backend, clip, args.tokens)
        rows.append(
            (
                f"ClipBlendDecoder (s = {subset}), B = {clip_b}",
                decoder_seconds_per_token(clip, args.tokens, args.repeats),
                clip_floor,
            )
        )
    print("| decoder on SmolLM2-135M-Instruct | s/token | floor s/token | ratio |")
    print("|---|---:|---:|---:|")
    for name, spent, bound in rows:
        print(f"| {name} | {spent:.3f} | {bound:.3f} | {spent / bound:.1f}× |")


if __name__ == "__main__":
    main()
