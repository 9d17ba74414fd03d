"""GINC privacy–accuracy benchmark: 4-shot DP-ICL accuracy of every synthesis method against ε (PTA Tables 2, 8).

Setting (PTA App. D.3, F): the committed GINC model; per concept 1,600 private training examples and 400 test
queries (k = 10); 4 synthetic demonstrations of T = 10 tokens per concept, M = 5 prompts of N = 4 records,
top-k = 10, δ = 1/1,600; accuracy of ``demo / demo / demo / demo / query`` over the full vocabulary (greedy),
averaged over seeds (synthesis randomness) with standard deviations. Concepts are disjoint private datasets, so
every ε is per concept and for the whole run (parallel composition).

Rows: R0 (4 real private demonstrations, not private), ε = 0 (0-shot: no demonstrations, no private data),
B1/BA2 (Tang et al.), P1/PA2/PA3 (PTA), AdaDPSyn, clip-blend and MOZO-offline at ε ∈ {1, 2, 4, 8, ∞}
(∞ = the same algorithm with the noise switched off). Hyperparameters (α ∈ {1, 1.5, 2, 5}, p ∈ {0.7, 0.8,
0.9}) are chosen as the paper does, by the best mean accuracy over ε ∈ {1, 2, 4, 8}, but on separate
validation queries freshly drawn from the GINC generator (not the test queries, not private data).

MOZO-offline answers public unlabeled inputs (the PATE setup of its paper): here 4 fresh GINC queries per
concept from the generator; since those inputs are themselves concept-specific, the table also shows what
they give with zero-shot outputs (no private data).

    python benchmarks/ginc/dp_icl.py                # the full table (≈ 40 minutes on 2 CPU cores)
    python benchmarks/ginc/dp_icl.py --quick        # paper hyperparameters, 1 seed, 100 queries per concept
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import (
    ANSWER_PRESETS,
    PRESETS,
    AdaDPSynSynthesizer,
    BudgetManager,
    ClipBlendSynthesizer,
    MozoOfflineSynthesizer,
    PrivacyBudget,
    PTASynthesizer,
    SynthesisMethod,
    TangSynthesizer,
)
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import (
    accuracy_with_demonstrations,
    concept_label,
    private_dataset,
    query_answer_dataset,
)
from dp_icl_plugin.ginc.prompts import GincExample, pta_split, sample_icl_prompts
from dp_icl_plugin.synthesis.clip_blend import measure_decoding_speedup

HERE = Path(__file__).resolve().parent
EPSILONS = (1.0, 2.0, 4.0, 8.0, math.inf)
DELTA = 1 / 1600
GINC = {
    "n_prompts": 5,
    "records_per_prompt": 4,
    "max_tokens": 10,
    "shots_per_label": 4,
    "top_k": 10,
    "template": PRESETS["ginc"],
}
ALPHAS = (1.0, 1.5, 2.0, 5.0)
TOP_PS = (0.7, 0.8, 0.9)
# PTA Table 7, 4-layer model (MA1): the --quick run uses these instead of searching.
PAPER_CHOICE = {
    "BA2": {"top_p": 0.9},
    "P1": {"alpha": 5.0},
    "PA2": {"alpha": 5.0, "top_p": 0.9},
    "PA3": {"alpha": 2.0, "top_p": 0.9},
    "AdaDPSyn": {"lam": 0.2},
}


@dataclass(frozen=True)
class Spec:
    """A method row: how to build it for a target ε (``None`` = ε = ∞) and its hyperparameter grid.

    ``answers_inputs``: the method answers public inputs (MOZO offline) instead of generating from labels.
    """

    name: str
    build: Callable[[float | None, dict[str, Any]], SynthesisMethod]
    grid: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    answers_inputs: bool = False


def _tang(epsilon: float | None, hp: dict[str, Any]) -> SynthesisMethod:
    privacy = {"epsilon": epsilon, "delta": DELTA} if epsilon is not None else {"noise_multiplier": 1.0}
    return TangSynthesizer(**GINC, **privacy, **hp)


def _pta(epsilon: float | None, hp: dict[str, Any]) -> SynthesisMethod:
    privacy = {"epsilon": epsilon, "delta": DELTA} if epsilon is not None else {"noise_multiplier": 1.0}
    return PTASynthesizer(**GINC, **privacy, **hp)


def _adadpsyn(epsilon: float | None, hp: dict[str, Any]) -> SynthesisMethod:
    # AdaDPSyn's AG News setting (Table 13: T̂ = 1, σ0 = 10, σ2 = 3) on PTA's GINC sampling (M = 5, N = 4).
    privacy = {"epsilon": epsilon, "delta": DELTA} if epsilon is not None else {"sigma1": 1.0}
    return AdaDPSynSynthesizer(**GINC, t_hat=1, sigma0=10.0, sigma2=3.0, **privacy, **hp)


def _clip_blend(epsilon: float | None, hp: dict[str, Any]) -> SynthesisMethod:
    # The paper's clip c = 10; s = 1,600/4 = 400 records per demonstration (one per prompt, disjoint groups).
    privacy = {"epsilon": epsilon, "delta": DELTA} if epsilon is not None else {"temperature": 1.0}
    return ClipBlendSynthesizer(
        clip=10.0,
        max_tokens=GINC["max_tokens"],
        shots_per_label=GINC["shots_per_label"],
        template=GINC["template"],
        **privacy,
        **hp,
    )


MOZO_ORDER = {1.0: 14.0, 2.0: 8.0, 4.0: 5.0, 8.0: 4.0}  # the paper's α for ε = 1, 2, 4 (Table 4); 4 for ε = 8


def _mozo(epsilon: float | None, hp: dict[str, Any]) -> SynthesisMethod:
    # One DP output token per public input (the label of a GINC example), 4 shots per token, top-k = 10.
    privacy = (
        {"epsilon": epsilon, "delta": DELTA, "order": MOZO_ORDER[epsilon]} if epsilon is not None else {"beta": 1.0}
    )
    return MozoOfflineSynthesizer(
        n_shots=4, max_tokens=1, top_k=GINC["top_k"], template=ANSWER_PRESETS["ginc"], **privacy, **hp
    )


def specs() -> list[Spec]:
    alpha_p = [{"alpha": a, "top_p": p} for a in ALPHAS for p in TOP_PS]
    return [
        Spec("B1", _tang),
        Spec("BA2", _tang, [{"top_p": p} for p in TOP_PS]),
        Spec("P1", _pta, [{"alpha": a} for a in ALPHAS]),
        Spec("PA2", _pta, alpha_p),
        Spec("PA3", lambda e, hp: _pta(e, {"use_base": False, **hp}), alpha_p),
        Spec("AdaDPSyn", _adadpsyn, [{"lam": lam} for lam in (0.15, 0.2, 0.25)]),
        Spec("clip-blend", _clip_blend),
        Spec("MOZO-offline", _mozo, answers_inputs=True),
    ]


class TimedBackend:
    """Delegates to a backend and adds up the seconds spent in its forward passes (the cost floor)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.forward_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def model_id(self) -> str:
        return str(self._inner.model_id)

    @property
    def vocab_size(self) -> int:
        return int(self._inner.vocab_size)

    @property
    def eos_token_id(self) -> int | None:
        return self._inner.eos_token_id  # type: ignore[no-any-return]

    @property
    def has_chat_template(self) -> bool:
        return bool(self._inner.has_chat_template)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self._inner.encode(text, add_special_tokens=add_special_tokens)  # type: ignore[no-any-return]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._inner.decode(ids))

    def apply_chat_template(self, messages: Any, *, add_generation_prompt: bool = True) -> list[int]:
        return self._inner.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)  # type: ignore[no-any-return]

    def next_token_logprobs(self, prompts: Any) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self._inner.next_token_logprobs(prompts)  # type: ignore[no-any-return]
        finally:
            self.forward_seconds += time.perf_counter() - started

    def start(self, prompts: Any) -> Any:
        started = time.perf_counter()
        session = self._inner.start(prompts)
        self.forward_seconds += time.perf_counter() - started
        outer = self

        class _TimedSession:
            def __getattr__(self, name: str) -> Any:
                return getattr(session, name)

            def append(self, token_ids: Any) -> np.ndarray:
                t0 = time.perf_counter()
                try:
                    return session.append(token_ids)  # type: ignore[no-any-return]
                finally:
                    outer.forward_seconds += time.perf_counter() - t0

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                session.close()

        return _TimedSession()


@dataclass
class Harness:
    backend: Any
    language: Any
    data: Any
    test: list[GincExample]
    validation: list[GincExample]
    train: dict[int, list[GincExample]]
    public_inputs: dict[int, list[GincExample]]
    test_short: list[GincExample]
    _qa_data: dict[int, Any] = field(default_factory=dict)

    def demonstrations(
        self, spec: Spec, epsilon: float, hp: dict[str, Any], seed: int
    ) -> tuple[dict[int, list[list[int]]], dict[str, Any]]:
        rng = np.random.default_rng([seed, int(min(epsilon, 1e6) * 100)])
        if spec.answers_inputs:
            return self._answers(spec, epsilon, hp, seed, rng)
        if math.isinf(epsilon):
            demos = spec.build(None, hp).synthesize_nonprivate(self.data, backend=self.backend, rng=rng)
            info: dict[str, Any] = {"epsilon": math.inf}
        else:
            method = spec.build(epsilon, hp)
            budget = BudgetManager(PrivacyBudget(epsilon=epsilon, delta=DELTA))
            demos = method.synthesize(self.data, backend=self.backend, budget=budget, rng=rng)
            info = {
                "epsilon": demos.provenance.epsilon,
                **{k: v for k, v in demos.provenance.extra.items() if isinstance(v, (int, float, str))},
            }
        by_concept = {c: [list(d.token_ids) for d in demos.for_label(concept_label(c))] for c in self.train}
        return by_concept, info

    def inputs_for(self, concept: int, seed: int) -> list[GincExample]:
        pool = self.public_inputs[concept]
        shots = GINC["shots_per_label"]
        return pool[(seed % (len(pool) // shots)) * shots :][:shots]

    def _answers(
        self, spec: Spec, epsilon: float, hp: dict[str, Any], seed: int, rng: np.random.Generator
    ) -> tuple[dict[int, list[list[int]]], dict[str, Any]]:
        """MOZO offline, one run per concept (its own private dataset and budget: parallel composition)."""
        by_concept: dict[int, list[list[int]]] = {}
        info: dict[str, Any] = {}
        for c, examples in self.train.items():
            data = self._qa_data.get(c) or self._qa_data.setdefault(c, query_answer_dataset(self.language, examples))
            inputs = [self.language.render(ex.tokens) for ex in self.inputs_for(c, seed)]
            if math.isinf(epsilon):
                demos = spec.build(None, hp).synthesize_nonprivate(
                    data, public_inputs=inputs, backend=self.backend, rng=rng
                )
                info = {"epsilon": math.inf}
            else:
                budget = BudgetManager(PrivacyBudget(epsilon=epsilon, delta=DELTA))
                demos = spec.build(epsilon, hp).synthesize(
                    data, public_inputs=inputs, backend=self.backend, budget=budget, rng=rng
                )
                info = {
                    "epsilon": demos.provenance.epsilon,
                    **{k: v for k, v in demos.provenance.extra.items() if isinstance(v, (int, float, str))},
                }
            by_concept[c] = [self.language.parse(d.input or "") + list(d.token_ids) for d in demos]
        return by_concept, info

    def zero_shot_answers(self, seed: int) -> dict[int, list[list[int]]]:
        """MOZO's public inputs with the model's own zero-shot outputs: what the inputs give without private data."""
        out = {}
        for c in self.train:
            queries = [list(ex.tokens) for ex in self.inputs_for(c, seed)]
            answers = self.backend.next_token_logprobs([[0, *q] for q in queries]).argmax(axis=1)
            out[c] = [[*q, int(a)] for q, a in zip(queries, answers, strict=True)]
        return out

    def accuracy(self, demos: dict[int, list[list[int]]] | None, queries: Sequence[GincExample]) -> float:
        return accuracy_with_demonstrations(self.backend, queries, demos).accuracy

    def evaluate(self, demos: dict[int, list[list[int]]] | None) -> dict[str, float]:
        """Accuracy on the k = 10 test queries (PTA's split) and on shorter k = 5 queries (more sensitive)."""
        return {"k10": self.accuracy(demos, self.test), "k5": self.accuracy(demos, self.test_short)}

    def real_demonstrations(self, seed: int) -> dict[int, list[list[int]]]:
        rng = np.random.default_rng([seed, 7])
        out = {}
        for c, examples in self.train.items():
            picked = rng.choice(len(examples), size=GINC["shots_per_label"], replace=False)
            out[c] = [[*examples[i].tokens, examples[i].label] for i in picked]
        return out


def _public_input_pool(language: Any, split: Any, *, per_concept: int) -> dict[int, list[GincExample]]:
    """Fresh GINC queries per concept from the generator (public), none equal to a private or test query."""
    taken = {ex.tokens for train, test in split.values() for ex in (*train, *test)}
    fresh = pta_split(language, k=10, n_train=per_concept + 50, n_test=1, rng=np.random.default_rng(4242))
    return {c: [ex for ex in train if ex.tokens not in taken][:per_concept] for c, (train, _) in fresh.items()}


def _short_queries(language: Any, per_concept: int) -> list[GincExample]:
    """Test queries of k = 5 (4 tokens): at k = 10 the query alone nearly reveals its concept (0-shot ≈ 92%)."""
    short = pta_split(language, k=5, n_train=1, n_test=per_concept, rng=np.random.default_rng(5555))
    return [ex for _, test in short.values() for ex in test]


def _validation_queries(language: Any, n: int, seed: int) -> list[GincExample]:
    prompts = sample_icl_prompts(language, n_prompts=n, n_shots=0, k=10, rng=np.random.default_rng([seed, 99]))
    return [
        GincExample(int(c), int(s), tuple(int(t) for t in q), int(y))
        for c, s, q, y in zip(prompts.concepts, prompts.start_properties, prompts.queries, prompts.labels, strict=True)
    ]


def choose_hyperparameters(
    h: Harness, spec: Spec, log: Callable[[str], None]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The grid point with the best mean validation accuracy over ε ∈ {1, 2, 4, 8} (one seed), as PTA App. F.5."""
    if len(spec.grid) == 1:
        return spec.grid[0], []
    scores = []
    for hp in spec.grid:
        accs = [h.accuracy(h.demonstrations(spec, e, hp, seed=1000)[0], h.validation) for e in EPSILONS[:4]]
        scores.append({"hyperparameters": hp, "validation_accuracy": float(np.mean(accs))})
        log(f"  {spec.name} {hp}: validation {100 * np.mean(accs):.1f}")
    best = max(scores, key=lambda s: s["validation_accuracy"])
    return best["hyperparameters"], scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="paper hyperparameters, 1 seed, 100 queries/concept")
    parser.add_argument("--seeds", type=int, default=None, help="synthesis seeds per cell (default 5; quick 1)")
    parser.add_argument("--test-per-concept", type=int, default=None, help="test queries per concept (400; quick 100)")
    parser.add_argument("--methods", default=None, help="comma-separated subset of the method rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="JSON, Markdown and PNG go here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    n_seeds = args.seeds or (1 if args.quick else 5)
    per_concept = args.test_per_concept or (100 if args.quick else 400)

    import torch

    torch.set_num_threads(args.threads)
    backend, language = load_model(device="cpu")
    split = pta_split(language, k=10, n_train=1600, n_test=400, rng=np.random.default_rng(2025))
    train = {c: tr for c, (tr, _) in split.items()}
    test = [ex for _, te in split.values() for ex in te[:per_concept]]
    timed = TimedBackend(backend)
    h = Harness(
        timed,
        language,
        private_dataset(language, train),
        test,
        _validation_queries(language, 500 if not args.quick else 100, seed=1),
        train,
        _public_input_pool(language, split, per_concept=4 * n_seeds),
        _short_queries(language, per_concept // 2),
    )

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []

    def add(method: str, epsilon: float, results: list[dict[str, float]], **extra: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"method": method, "epsilon": epsilon, **extra}
        for key in ("k10", "k5"):
            runs = [r[key] for r in results]
            prefix = "" if key == "k10" else "k5_"
            row.update(
                {f"{prefix}mean": float(np.mean(runs)), f"{prefix}std": float(np.std(runs)), f"{prefix}runs": runs}
            )
        rows.append(row)
        return row

    r = add("0-shot (ε = 0)", 0.0, [h.evaluate(None)])
    log(f"0-shot {100 * r['mean']:.1f} (k = 5: {100 * r['k5_mean']:.1f})")
    r = add("R0 (real, not private)", math.inf, [h.evaluate(h.real_demonstrations(s)) for s in range(n_seeds)])
    log(f"R0 {100 * r['mean']:.1f} ± {100 * r['std']:.1f} (k = 5: {100 * r['k5_mean']:.1f})")
    add(
        "MOZO inputs, 0-shot outputs (no private data)",
        0.0,
        [h.evaluate(h.zero_shot_answers(s)) for s in range(n_seeds)],
    )

    chosen_specs = specs()
    if args.methods:
        wanted = {m.strip() for m in args.methods.split(",")}
        chosen_specs = [s for s in chosen_specs if s.name in wanted]
    selection: dict[str, Any] = {}
    speed: dict[str, Any] = {}
    for spec in chosen_specs:
        if args.quick:
            hp = PAPER_CHOICE.get(spec.name, spec.grid[0])
        else:
            hp, scores = choose_hyperparameters(h, spec, log)
            selection[spec.name] = {"chosen": hp, "grid": scores}
        for epsilon in EPSILONS:
            results, info = [], {}
            for seed in range(n_seeds):
                measure = seed == 0 and epsilon == 1.0
                calibration = 0.0
                if measure and not spec.answers_inputs:  # calibrate once, outside the timed synthesis
                    t0 = time.perf_counter()
                    spec.build(epsilon, hp).plan(h.data)
                    calibration = time.perf_counter() - t0
                timed.forward_seconds = 0.0
                t0 = time.perf_counter()
                demos, info = h.demonstrations(spec, epsilon, hp, seed)
                wall = time.perf_counter() - t0
                if measure:
                    tokens = sum(len(d) for ds in demos.values() for d in ds)
                    speed[spec.name] = {
                        "tokens_per_second": tokens / wall,
                        "seconds": wall,
                        "forward_share": timed.forward_seconds / wall,
                        "calibration_seconds": calibration,
                    }
                results.append(h.evaluate(demos))
            r = add(spec.name, epsilon, results, hyperparameters=hp, info=info)
            log(
                f"{spec.name} ε = {epsilon:g}: {100 * r['mean']:.1f} ± {100 * r['std']:.1f} "
                f"(k = 5: {100 * r['k5_mean']:.1f} ± {100 * r['k5_std']:.1f})"
            )

    if not args.methods or "clip-blend" in args.methods:
        speed["clip-blend cached vs re-encoded (T = 100)"] = clip_blend_speedup(h, n_prompts=32 if args.quick else 128)
        log(f"clip-blend cache speed-up at T = 100: {speed['clip-blend cached vs re-encoded (T = 100)']}")
    total = time.monotonic() - started
    meta = {
        "command": "python benchmarks/ginc/dp_icl.py" + (" --quick" if args.quick else ""),
        "seeds": n_seeds,
        "test_queries": len(test),
        "short_queries": len(h.test_short),
        "delta": DELTA,
        "setting": {k: v for k, v in GINC.items() if k != "template"},
        "seconds": round(total, 1),
        "model": "committed GINC model (dp_icl_plugin/ginc/model)",
    }
    write_outputs(args.out, rows, selection, speed, meta)
    print(to_markdown(rows, speed, meta))
    print(f"\ntotal time: {total / 60:.1f} min")
    return 0


REFERENCE_ROWS = ("0-shot", "R0", "MOZO inputs")


def clip_blend_speedup(h: Harness, *, n_prompts: int) -> dict[str, float]:
    """Decode 100 tokens for one clip-blend group (the public prompt + ``n_prompts`` one-record prompts) with the
    KV cache and by re-encoding every prompt at every step; the same prompts and tokens both ways."""
    template = GINC["template"]
    label = concept_label(0)
    records = h.data.records(label)[:n_prompts]
    prompts = [template.public_prompt(label)] + [template.private_prompt(label, [r]) for r in records]
    tokens = np.random.default_rng(0).integers(1, h.backend.vocab_size, size=100).tolist()
    result = measure_decoding_speedup(h.backend._inner, prompts, tokens=tokens)
    return {
        "cached_seconds": result.cached_seconds,
        "reencode_seconds": result.reencode_seconds,
        "speedup": result.speedup,
        "max_logprob_difference": result.max_logprob_difference,
        "prompts": len(prompts),
    }


def _table(rows: list[dict[str, Any]], prefix: str) -> list[str]:
    def cell(row: dict[str, Any] | None) -> str:
        return "" if row is None else f"{100 * row[prefix + 'mean']:.1f} ± {100 * row[prefix + 'std']:.1f}"

    methods = list(dict.fromkeys(r["method"] for r in rows if not r["method"].startswith(REFERENCE_ROWS)))
    lines = [
        "| method | " + " | ".join("ε = ∞" if math.isinf(e) else f"ε = {e:g}" for e in EPSILONS) + " |",
        "|---" * (len(EPSILONS) + 1) + "|",
    ]
    for m in methods:
        cells = [cell(next((r for r in rows if r["method"] == m and r["epsilon"] == e), None)) for e in EPSILONS]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["method"].startswith(REFERENCE_ROWS):
            lines.append(f"| {r['method']} | {cell(r)} (any ε) |" + " |" * (len(EPSILONS) - 1))
    return lines


def to_markdown(rows: list[dict[str, Any]], speed: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"4-shot accuracy (%) on the {meta['test_queries']} k = 10 test queries (PTA's split), mean ± std over "
        f"{meta['seeds']} seeds, δ = 1/1600 per concept:",
        "",
    ]
    lines += _table(rows, "")
    lines += [
        "",
        f"The same demonstrations on {meta['short_queries']} shorter queries (k = 5), where demonstrations "
        "matter more:",
        "",
    ]
    lines += _table(rows, "k5_")
    hyper = {r["method"]: r.get("hyperparameters") for r in rows if r.get("hyperparameters")}
    if hyper:
        lines += ["", "Hyperparameters: " + "; ".join(f"{m} {hp}" for m, hp in hyper.items()) + "."]
    methods_speed = {m: v for m, v in speed.items() if "tokens_per_second" in v}
    if methods_speed:
        lines += [
            "",
            "| method (ε = 1, seed 0) | synthesis tokens/s | forward passes' share | mechanism + "
            "accounting | calibration (once) |",
            "|---|---|---|---|---|",
        ]
        for m, v in methods_speed.items():
            lines.append(
                f"| {m} | {v['tokens_per_second']:.1f} | {100 * v['forward_share']:.0f}% | "
                f"{100 * (1 - v['forward_share']):.0f}% | {v['calibration_seconds']:.2f} s |"
            )
    for m, v in speed.items():
        if "speedup" in v:
            lines.append(
                f"\n{m}: {v['speedup']:.1f}× ({v['reencode_seconds']:.1f} s re-encoded vs "
                f"{v['cached_seconds']:.1f} s cached, {v['prompts']} prompts, max |Δ log p| = "
                f"{v['max_logprob_difference']:.1e})"
            )
    return "\n".join(lines)


def write_outputs(
    out: Path, rows: list[dict[str, Any]], selection: dict[str, Any], speed: dict[str, Any], meta: dict[str, Any]
) -> None:
    out.mkdir(parents=True, exist_ok=True)

    def clean(x: Any) -> Any:
        if isinstance(x, float) and math.isinf(x):
            return "inf"
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    (out / "dp_icl.json").write_text(
        json.dumps(clean({"meta": meta, "rows": rows, "selection": selection, "speed": speed}), indent=2) + "\n"
    )
    (out / "dp_icl.md").write_text(to_markdown(rows, speed, meta) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(len(EPSILONS)))
    for m in dict.fromkeys(r["method"] for r in rows):
        if m.startswith(REFERENCE_ROWS):
            r = next(r for r in rows if r["method"] == m)
            style = {"R0": ("--", "grey"), "0-": (":", "black"), "MO": ("-.", "tab:brown")}[m[:2]]
            ax.axhline(100 * r["mean"], linestyle=style[0], color=style[1], label=m)
            continue
        pts = [next((r for r in rows if r["method"] == m and r["epsilon"] == e), None) for e in EPSILONS]
        ax.errorbar(
            [x for x, p in zip(xs, pts, strict=True) if p],
            [100 * p["mean"] for p in pts if p],
            yerr=[100 * p["std"] for p in pts if p],
            marker="o",
            capsize=3,
            label=m,
        )
    ax.set_xticks(xs, ["∞" if math.isinf(e) else f"{e:g}" for e in EPSILONS])
    ax.set_xlabel("ε (per concept, δ = 1/1600)")
    ax.set_ylabel("4-shot accuracy (%)")
    ax.set_title("GINC: DP-ICL accuracy against ε")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "dp_icl.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
