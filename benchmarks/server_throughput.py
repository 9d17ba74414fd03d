"""Tokens per second of DPS-MOZO decoding and PTA synthesis through vLLM (ServerBackend) against HFBackend, on
the same machine and the same SmolLM2-135M-Instruct float32 weights, and ServerBackend's overhead over raw
requests. Everything in one run, printed as ratios.

    python benchmarks/server_throughput.py                  # starts vLLM (.venv-vllm, about 4 min), ~10 min
    python benchmarks/server_throughput.py --url http://127.0.0.1:8765   # a vLLM already serving the model

vLLM's rows are read in full-vocabulary mode (49,152 log-probabilities per prompt, as JSON) and with
``top_k=100`` (the methods' own public top-k; rows completed as ``backends/server_rows.py`` says).

Overhead: one MOZO step's prompts (the zero-shot prompt and n_shots one-shot prompts) sent by
``ServerBackend.next_token_logprobs`` against the same requests sent raw (concurrently, the JSON answer
read but not turned into rows); the difference is tokenising, building full rows and checking them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dp_icl_plugin import PRESETS, BudgetManager, HFBackend, PrivacyBudget, PrivateDataset, PTASynthesizer
from dp_icl_plugin.backends.server import ServerBackend
from dp_icl_plugin.decoding.decoders import MozoDecoder

ROOT = Path(__file__).resolve().parents[1]
TREC = ROOT.parent / "shared" / "data" / "trec" / "train.txt"
QUERY = [{"role": "user", "content": "Who wrote the play Hamlet?"}]


def _records() -> PrivateDataset:
    lines = TREC.read_text(encoding="latin-1").splitlines()[:300]
    return PrivateDataset.from_pairs(
        [ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines], public_label_counts="observed"
    )


def mozo_tokens_per_s(backend, data: PrivateDataset, tokens: int, answers: int) -> float:
    decoder = MozoDecoder(
        data,
        backend=backend,
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3)),
        n_queries=answers + 1,
        beta=0.5,
        max_tokens=tokens,
    )
    decoder.generate(QUERY, rng=np.random.default_rng(99), max_tokens=2, stop=[])  # warm-up (caches, threads)
    start, made = time.perf_counter(), 0
    for seed in range(answers):
        made += len(decoder.generate(QUERY, rng=np.random.default_rng(seed), max_tokens=tokens, stop=[]).token_ids)
    return made / (time.perf_counter() - start)


def pta_tokens_per_s(backend, data: PrivateDataset, tokens: int) -> float:
    template = dataclasses.replace(PRESETS["trec"], stop=None, stop_at_eos=False)  # every demonstration T tokens
    method = PTASynthesizer(noise_multiplier=1.0, max_tokens=tokens, n_prompts=10, template=template)
    start = time.perf_counter()
    demos = method.synthesize(
        data,
        labels=["HUM"],
        backend=backend,
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3)),
        rng=np.random.default_rng(0),
        progress=False,
    )
    return sum(len(d.token_ids) for d in demos) / (time.perf_counter() - start)


def overhead(server: ServerBackend, data: PrivateDataset, repeats: int) -> tuple[float, float]:
    """(seconds per step through ServerBackend, seconds per step of the same requests sent raw)."""
    import httpx

    prompts = [server.apply_chat_template(QUERY)] + [
        server.apply_chat_template([{"role": "user", "content": f"Q: {r.text}\nA: {r.label}"}, *QUERY])
        for r in data.records("HUM")[:4]
    ]
    payloads = [
        {
            "model": server.model,
            "prompt": p,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": -1,
            "return_tokens_as_token_ids": True,
        }
        for p in prompts
    ]
    with httpx.Client(base_url=server.base_url, timeout=120) as client, ThreadPoolExecutor(len(prompts)) as pool:

        def raw() -> None:
            list(pool.map(lambda body: client.post("/v1/completions", json=body).json(), payloads))

        timings = {"backend": [], "raw": []}
        for _ in range(repeats):  # interleaved, so both see the same server state
            for name, call in (("backend", lambda: server.next_token_logprobs(prompts)), ("raw", raw)):
                start = time.perf_counter()
                call()
                timings[name].append(time.perf_counter() - start)
    return float(np.median(timings["backend"])), float(np.median(timings["raw"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a vLLM already serving smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--answers", type=int, default=3)
    args = parser.parse_args()
    from dp_icl_plugin.backends import gguf

    folder = gguf.converted_folder("smollm2-135m-instruct")
    data = _records()
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            sys.path.insert(0, str(ROOT / "tests"))
            from vllm_server import running  # the test suite's launcher: loopback, --max-logprobs -1, float32

            log_dir = Path(stack.enter_context(__import__("tempfile").TemporaryDirectory()))
            started = time.perf_counter()
            url = stack.enter_context(running(log_dir)).url
            print(f"vLLM ready in {time.perf_counter() - started:.0f} s")
        server = stack.enter_context(ServerBackend.from_url(url, folder))
        local = HFBackend.from_pretrained(folder, device="cpu", dtype="float32")
        rows = []
        workloads = {
            "DPS-MOZO decoding (n_shots = 4)": lambda b: mozo_tokens_per_s(b, data, args.tokens, args.answers),
            "PTA synthesis (M = 10, N = 2)": lambda b: pta_tokens_per_s(b, data, args.tokens),
        }
        top = stack.enter_context(ServerBackend.from_url(url, folder, top_k=100))  # the methods' public top-k
        for name, run in workloads.items():
            rows.append((name, run(local), run(server), run(top)))
        backend_s, raw_s = overhead(server, data, repeats=5)
    print(
        "\n| workload (SmolLM2-135M-Instruct, float32) | HFBackend tokens/s | vLLM, full vocabulary | "
        "vLLM, top_k = 100 |"
    )
    print("|---|---:|---:|---:|")
    for name, hf_rate, full_rate, top_rate in rows:
        print(
            f"| {name} | {hf_rate:.2f} | {full_rate:.2f} ({full_rate / hf_rate:.2f}×) | "
            f"{top_rate:.2f} ({top_rate / hf_rate:.2f}×) |"
        )
    print(
        f"\nOne MOZO step (5 prompts, full vocabulary): ServerBackend {backend_s:.3f} s, raw requests {raw_s:.3f} s: "
        f"overhead {backend_s / raw_s:.2f}×"
    )


if __name__ == "__main__":
    main()
