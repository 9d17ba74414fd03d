"""Time per token of the DP synthesizers on the pretrained SmolLM2-135M-Instruct, against the cost floor.

The floor is one batched forward per generated token of only the tokens that must be computed: a prompt's
tokens past the longest prefix it shares with any prompt computed before (an ideal prefix cache holding
everything ever computed: the instruction, the public prompt and the text generated so far, a record's part
that recurs), at least its last token. A :class:`Recorder` wraps the backend, lets the method run as it does,
and keeps each call's rows; a token's two calls (its public rows apart, then its records' rows) are one step
of the floor, which replays one forward of that many new tokens per row on a cache of that many cached
positions (built outside the timer). Both are printed, with their ratio, in one run: the ratio holds what row
isolation costs (filler rows, padding, the public rows' own forward). The time inside the model's forwards
(the shapes isolation gave them) is printed too, which splits the ratio into what those shapes cost against the
floor and what the code costs around its forwards.

Noise scales are given directly (not calibrated to a target ε) and the timer starts at the method's first model
call after its public probe, which is after its charge: it holds generation only, not the one-off calibration
and accounting. Setting: TREC training questions as the private records (the label sizes declared public as
observed), the ``trec`` template, one label, T = ``--tokens``; each method at its paper's prompt counts.

    python benchmarks/synthesis_floor.py            # about 10 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import time
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import (
    ANSWER_PRESETS,
    PRESETS,
    AdaDPSynSynthesizer,
    BudgetManager,
    ClipBlendSynthesizer,
    HFBackend,
    MozoOfflineSynthesizer,
    PrivacyBudget,
    PrivateDataset,
    PTASynthesizer,
    TangSynthesizer,
)

TREC = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec" / "train.txt"


class Recorder:
    """The backend without its prefix-cache methods (every prompt computed whole), plus what each call had to
    compute: (new tokens per row, cached positions per row). :class:`SharingRecorder` adds those methods
    (capabilities are protocols checked on the class, so a recorder that must not have them is another class)."""

    def __init__(self, backend: HFBackend) -> None:
        self._inner = backend
        self._trie: dict[int, Any] = {}
        self.calls: list[tuple[list[int], list[int]]] = []
        self.starts: list[float] = []  # when each call began; the charge comes after the public probe (call 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("next_token_logprobs_shared", "start_shared")):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def must_compute(self, rows: list[list[int]]) -> None:
        self.starts.append(time.perf_counter())
        new, cached = [], []
        for row in rows:
            node, k = self._trie, 0
            while k < len(row) and row[k] in node:
                node, k = node[row[k]], k + 1
            k = min(k, len(row) - 1)  # the last token's logits are what the call returns
            new.append(len(row) - k)
            cached.append(k)
            node = self._trie
            for t in row:
                node = node.setdefault(t, {})
        self.calls.append((new, cached))

    def next_token_logprobs(self, prompts):
        self.must_compute(self._inner._prompt_ids(prompts))  # texts encoded as the backend encodes them
        return self._inner.next_token_logprobs(prompts)

    def start(self, prompts):
        rows = [list(r) for r in self._inner._prompt_ids(prompts)]
        self.must_compute(rows)
        return RecordingSession(self, self._inner.start(prompts), rows)


class SharingRecorder(Recorder):
    """The recorder with the backend's prefix-cache methods."""

    def next_token_logprobs_shared_suffix(self, rows, suffix):
        self.must_compute([list(map(int, r)) for r in rows])
        return self._inner.next_token_logprobs_shared_suffix(rows, suffix)

    def next_token_logprobs_shared_prefix(self, prefix, rows):
        self.must_compute([list(map(int, r)) for r in rows])
        return self._inner.next_token_logprobs_shared_prefix(prefix, rows)

    def start_shared_suffix(self, prompts, suffix):
        rows = [list(map(int, r)) for r in prompts]
        self.must_compute(rows)
        return RecordingSession(self, self._inner.start_shared_suffix(prompts, suffix), rows)

    def start_shared_prefix(self, prefix, prompts):
        rows = [list(map(int, r)) for r in prompts]
        self.must_compute(rows)
        return RecordingSession(self, self._inner.start_shared_prefix(prefix, prompts), rows)


class RecordingSession:
    def __init__(self, recorder: Recorder, session: Any, rows: list[list[int]]) -> None:
        self._recorder, self._session, self._rows = recorder, session, rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def append(self, token_ids):
        tokens = np.broadcast_to(np.asarray(token_ids).reshape(-1), (len(self._rows),))
        for row, t in zip(self._rows, tokens, strict=True):
            row.append(int(t))
        self._recorder.must_compute(self._rows)
        return self._session.append(token_ids)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self._session.close()


def per_token(calls: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """Each generated token's two calls (its public rows alone, then the records' rows: public rows apart) as
    one: the floor is one forward a token, so the ratio includes what computing the public rows apart costs."""
    if len(calls) % 2:
        raise AssertionError(f"{len(calls)} calls: not two per generated token")
    return [(a[0] + b[0], a[1] + b[1]) for a, b in zip(calls[0::2], calls[1::2], strict=True)]


class ForwardTimer:
    """Times every model forward of one backend (its isolated shapes, as the code issued them)."""

    def __init__(self, backend: HFBackend) -> None:
        self.spans: list[tuple[float, float]] = []
        inner = backend._rows.forward

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.spans.append((start, time.perf_counter() - start))

        backend._rows.forward = timed  # type: ignore[method-assign]

    def seconds_since(self, start: float) -> float:
        """Seconds spent in forwards that began at or after ``start``."""
        return sum(took for began, took in self.spans if began >= start)


def floor_seconds(backend: HFBackend, calls: list[tuple[list[int], list[int]]]) -> float:
    """Replay each call as one forward of its new tokens (rows padded to the longest) on a cache of its cached
    positions (the longest), the cache built outside the timer."""
    import torch
    from transformers import DynamicCache

    model, total = backend.model, 0.0
    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        for new, cached in calls:
            rows, width, past = len(new), max(new), max(cached)
            cache = DynamicCache(config=model.config)
            if past:
                ids = torch.ones((rows, past), dtype=torch.long)
                model(input_ids=ids, use_cache=True, **{keyword: cache})
            ids = torch.ones((rows, width), dtype=torch.long)
            mask = torch.ones((rows, past + width), dtype=torch.long)
            positions = torch.arange(past, past + width).expand(rows, width)
            start = time.perf_counter()
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{keyword: cache},
            )  # only the next token's logits are needed
            total += time.perf_counter() - start
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help="the backend's rows per forward (default: each method's step_rows, as dp-icl synthesize builds its "
        "backend, else HFBackend's 8): a step's rows beyond it take more forwards",
    )
    parser.add_argument(
        "--tokens-per-forward", type=int, default=None, help="the shape policy's new tokens a forward (HFBackend's)"
    )
    parser.add_argument("--width-step", type=int, default=None, help="the shape policy's width step (HFBackend's)")
    parser.add_argument(
        "--only", nargs="*", default=[], help="run only the methods whose row name starts with one of these"
    )
    args = parser.parse_args()
    loaded = HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu")

    shape = {
        name: value
        for name, value in (("tokens_per_forward", args.tokens_per_forward), ("width_step", args.width_step))
        if value is not None
    }

    def backend_of(rows: int | None) -> HFBackend:
        return HFBackend(
            loaded.model, loaded.tokenizer, model_id=loaded.model_id, device="cpu", micro_batch_size=rows or 8, **shape
        )

    lines = TREC.read_text(encoding="latin-1").splitlines()
    data = PrivateDataset.from_pairs(
        [ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines], public_label_counts="observed"
    )
    label = ["HUM"]
    answers = PrivateDataset.from_pairs(
        [ln.split(" ", 1)[1] for ln in lines[:300]], [ln.split(":", 1)[0] for ln in lines[:300]]
    )
    public_inputs = [ln.split(" ", 1)[1] for ln in lines[-2:]]
    t = args.tokens
    trec = dataclasses.replace(PRESETS["trec"], stop=None, stop_at_eos=False)  # every demonstration T tokens long
    methods = [
        ("Tang et al. (M = 10, N = 2)", TangSynthesizer(noise_multiplier=1.0, max_tokens=t, template=trec), {}),
        ("PTA (M = 10, N = 2)", PTASynthesizer(noise_multiplier=1.0, max_tokens=t, template=trec), {}),
        ("AdaDPSyn (M = 10, N = 2)", AdaDPSynSynthesizer(sigma1=1.0, max_tokens=t, template=trec), {}),
        ("clip-blend (s = 32)", ClipBlendSynthesizer(temperature=1.0, max_tokens=t, subset_size=32, template=trec), {}),
        (
            "DPS-MOZO offline (n_shots = 4, 2 inputs)",
            MozoOfflineSynthesizer(beta=0.5, max_tokens=t, template=ANSWER_PRESETS["classification"]),
            {"public_inputs": public_inputs},
        ),
    ]
    print(
        "| synthesizer on SmolLM2-135M-Instruct | rows per forward | floor s/token | whole prompts | prefix cache "
        "| its forwards alone |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, method, extra in methods:
        if args.only and not name.startswith(tuple(args.only)):
            continue
        rows = args.micro_batch_size or method.step_rows or 8
        backend = backend_of(rows)
        timer = ForwardTimer(backend)
        dataset = answers if extra else data
        kwargs: dict[str, Any] = extra if extra else {"labels": label}
        seconds = {}
        for share in (False, True):  # the same seed: the same prompts, so one floor serves both
            backend.prefix_cache.clear()
            recorder = SharingRecorder(backend) if share else Recorder(backend)
            budget = BudgetManager(PrivacyBudget(1e6, 1e-3))
            method.synthesize(
                dataset, backend=recorder, budget=budget, rng=np.random.default_rng(0), progress=False, **kwargs
            )
            seconds[share] = time.perf_counter() - recorder.starts[1]  # generation only: from the first token's call
        forwards = timer.seconds_since(recorder.starts[1])  # the prefix-cache run's forwards (the last one)
        steps = per_token(recorder.calls[1:])  # model calls after the public probe: two per generated token
        floor = floor_seconds(backend, steps)
        n = len(steps)
        print(
            f"| {name} | {rows} | {floor / n:.3f} | {seconds[False] / n:.3f} s, {seconds[False] / floor:.1f}× | "
            f"{seconds[True] / n:.3f} s, {seconds[True] / floor:.1f}× | "
            f"{forwards / n:.3f} s, {forwards / floor:.1f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
