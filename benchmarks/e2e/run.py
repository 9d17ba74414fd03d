"""E2E data-to-text on a real pretrained chat model: the DP methods between zero-shot and few-shot.

DPS-MOZO's own task (Flemings et al., Table 1, E2E with LLaMA-3 3B: zero-shot 31.12, few-shot 43.23 ROUGE-L),
run on SmolLM2-135M-Instruct (``HFBackend.from_pretrained("smollm2-135m-instruct")``, float32 on CPU).

- Private records: the E2E dev split (4,672 pairs ``meaning representation → reference``).
- Queries: ``--n-test`` distinct test MRs per seed (a fresh sample each seed; every row of a seed answers the
  same queries), each scored against all its references: ROUGE-L F1 (``rouge-score``, stemming, best
  reference) and the cosine of all-MiniLM-L6-v2 embeddings (best reference), both ×100.
- Prompts: the paper's instruction (Figure 5) laid out in the model's chat template: the instruction as the
  system turn, each example as an earlier user/assistant exchange, the query as the last user turn. The
  template is checked against the tokenizer's own chat template at start.
- Every answer: at most 25 tokens (T_max), ended at the newline or EOS; n_shots = 4, top-k = 100 (Table 4).
- ``rows.json`` keeps every answer: fine for a public dataset standing in for private records, not for real
  private data (a non-private row's answers can repeat records; timings are measured without
  ``fixed_latency`` on a backend whose prefix cache holds records). One ledger per row here, to compare
  methods at each ε; an app releasing several of these from the same records puts them on one ledger.

Rows (per seed; each DP row on its own ledger ``PrivacyBudget(ε, δ = 1/|D|)``, replace-one, so the committed
spend of every row is checked against its ε):

- ``zero-shot`` (ε = 0): sampled from the zero-shot distribution on its top 100 (the paper's ε = 0 row), and
  ``zero-shot greedy`` for reference.
- ``few-shot`` (ε = ∞, NOT private): the paper's ensemble decoding, the product of 4 one-shot distributions
  with real records drawn afresh per token (``MozoOfflineSynthesizer.synthesize_nonprivate``).
- ``DPS-MOZO+On``: :class:`MozoDecoder`, the ledger's ε for the ``n_test`` answers (β calibrated; Rényi
  order 14, 8, 5 for ε = 1, 2, 4 as the paper).
- ``DPS-MOZO+Off``: :class:`MozoOfflineSynthesizer` answers ``--n-public`` other test MRs (public, unlabeled
  inputs, T̃_max = 20) at ε; the queries are then answered with 4 of those DP pairs as the examples of one
  prompt, greedy (post-processing: no further charge).
- ``clip-blend decoding``: :class:`ClipBlendDecoder` (c = 10, a fixed subset of s = ``--subset-size``
  records), ε for the ``n_test`` answers (τ calibrated).
- ``PTA demos``: :class:`PTASynthesizer` writes ``--pta-demos`` whole E2E pairs (M = ``--pta-prompts`` prompts
  of one record per token) ("MR" then "Answer: sentence") at ε from
  Poisson samples of the records (one label holding all |D| records, declared public: under replace-one |D|
  is); the pairs that parse are the examples of one prompt, greedy, as for DPS-MOZO+Off (a pair that does not
  parse is dropped; with none left the prompt has no examples; the count is in the results).
- ``few-shot greedy`` (ε = ∞, NOT private): 4 real records drawn once per seed as the examples of one prompt,
  greedy: the same decoding as the two demonstration rows, with real records.

    python benchmarks/e2e/run.py                  # the committed table: see RESULTS.md for time and machine
    python benchmarks/e2e/run.py --quick          # every row once, tiny: about 5 minutes
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1].parent / "shared" / "data" / "e2e"
INSTRUCTION = "Please convert the structured data into natural language."  # DPS-MOZO Figure 5
T_MAX, T_SYN, N_SHOTS, TOP_K, CLIP = 25, 20, 4, 100, 10.0
ORDERS = {1.0: 14.0, 2.0: 8.0, 4.0: 5.0}  # DPS-MOZO §5.1: α with ε(α) ≈ ε/2
PAPER = {"zero-shot": 31.12, "few-shot": 43.23}  # Table 1, E2E, LLaMA-3 3B, ROUGE-L F1


def load() -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(dev pairs, test MR → references)."""
    if not DATA.is_dir():
        sys.exit(f"E2E data not found at {DATA} (the shared data folder beside the project)")
    with open(DATA / "devset.csv", newline="", encoding="utf-8") as fh:
        dev = [(r["mr"], r["ref"]) for r in csv.DictReader(fh)]
    test: dict[str, list[str]] = {}
    with open(DATA / "testset_w_refs.csv", newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            test.setdefault(r["mr"], []).append(r["ref"])
    return dev, test


def chat_layout(backend):
    """The AnswerTemplate spelling out SmolLM2's chat template (ChatML), checked against the tokenizer's."""
    from dp_icl_plugin import AnswerTemplate, PrivateRecord

    template = AnswerTemplate(
        header=f"<|im_start|>system\n{INSTRUCTION}<|im_end|>\n",
        example="<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{label}<|im_end|>\n",
        query="<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n",
        stop="\n",
    )
    mr, ref, query = "name[A], food[B]", "A serves B.", "name[C]"
    ours = backend.encode(template.one_shot_prompt(PrivateRecord(mr, ref), query), add_special_tokens=True)
    chat = [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": mr},
        {"role": "assistant", "content": ref},
        {"role": "user", "content": query},
    ]
    theirs = backend.apply_chat_template(chat)
    if ours != theirs:
        sys.exit("the model's chat template is not ChatML: this benchmark's layout would not match it")
    return template


class Scorer:
    """ROUGE-L F1 and MiniLM cosine against the best reference, both ×100."""

    def __init__(self, test: dict[str, list[str]]) -> None:
        from rouge_score import rouge_scorer

        from dp_icl_plugin.retrieval import default_embedder
        from dp_icl_plugin.retrieval.embedding import embed_texts

        self.test = test
        self.rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        self.model = default_embedder()
        self.embed = lambda texts: embed_texts(self.model, texts, batch_size=64)
        self._refs: dict[str, np.ndarray] = {}

    def __call__(self, mrs: list[str], outputs: list[str]) -> tuple[float, float]:
        rouge = [
            max(self.rouge.score(ref, out)["rougeL"].fmeasure for ref in self.test[mr])
            for mr, out in zip(mrs, outputs, strict=True)
        ]
        vectors = self.embed([o if o.strip() else "." for o in outputs])
        cosine = []
        for mr, v in zip(mrs, vectors, strict=True):
            if mr not in self._refs:
                self._refs[mr] = self.embed(self.test[mr])
            cosine.append(float(np.max(self._refs[mr] @ v)))
        return 100 * float(np.mean(rouge)), 100 * float(np.mean(cosine))


def zero_shot(backend, template, mrs: list[str], rng: np.random.Generator, *, greedy: bool) -> list[str]:
    """Public decoding of the zero-shot prompts: greedy, or sampled from the top-k renormalised."""
    from dp_icl_plugin.backends.generation import greedy_generate

    prompts = [backend.encode(template.zero_shot_prompt(m), add_special_tokens=True) for m in mrs]
    if greedy:
        return [backend.decode(o).strip() for o in greedy_generate(backend, prompts, max_new_tokens=T_MAX)]
    return sample_top_k(backend, prompts, T_MAX, rng)


def sample_top_k(
    backend, prompts: list[list[int]], tokens: int, rng: np.random.Generator, *, scale: float = 1.0
) -> list[str]:
    """Each prompt's continuation sampled from its top-``TOP_K`` distribution, renormalised, its log-probabilities
    times ``scale`` (1: the model's own), ended at EOS or a newline, at most ``tokens`` tokens."""
    outputs: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), dtype=bool)
    with backend.start(prompts) as session:
        logprobs = session.logprobs
        for step in range(tokens):
            chosen = []
            for i, row in enumerate(logprobs):
                top = np.argpartition(row, -TOP_K)[-TOP_K:]
                p = np.exp(scale * (row[top] - row[top].max()))
                token = int(top[rng.choice(TOP_K, p=p / p.sum())])
                chosen.append(token)
                if not done[i]:
                    if token == backend.eos_token_id or "\n" in backend.decode([token]):
                        done[i] = True
                    else:
                        outputs[i].append(token)
            if done.all() or step == tokens - 1:
                break
            logprobs = session.append(chosen)
    return [backend.decode(o).strip() for o in outputs]


def ensemble(backend, template, dataset, mrs: list[str], rng: np.random.Generator) -> list[str]:
    """The ε = ∞ ensemble decoding over ``dataset`` (private records, or DP pairs: then post-processing)."""
    from dp_icl_plugin import MozoOfflineSynthesizer

    method = MozoOfflineSynthesizer(
        beta=1.0, n_shots=min(N_SHOTS, len(dataset)), max_tokens=T_MAX, top_k=TOP_K, template=template
    )
    demos = method.synthesize_nonprivate(dataset, public_inputs=mrs, backend=backend, rng=rng, progress=False)
    return [d.text.strip() for d in demos]


def few_shot_greedy(backend, template, pairs: list[tuple[str, str]], mrs: list[str]) -> list[str]:
    """Greedy answers with ``pairs`` as the examples of one prompt (public pairs: DP demonstrations, or real
    records in the ε = ∞ reference), all queries in one batched session."""
    from dp_icl_plugin.backends.generation import greedy_generate

    examples = "".join(template.example.format(text=x, label=y) for x, y in pairs)
    prompts = [
        backend.encode(template.header + examples + template.query.format(input=m), add_special_tokens=True)
        for m in mrs
    ]
    return [backend.decode(o).strip() for o in greedy_generate(backend, prompts, max_new_tokens=T_MAX)]


def pta_pairs(demos) -> list[tuple[str, str]]:
    """The (MR, sentence) pairs that parse out of PTA's generated texts."""
    pairs = []
    for d in demos:
        mr, sep, sentence = d.text.partition("\nAnswer:")
        mr, sentence = mr.strip(), sentence.strip().split("\n")[0].strip()
        if sep and mr and sentence:
            pairs.append((mr, sentence))
    return pairs


def run_seed(seed: int, args, backend, template, dev, test, scorer, log: Callable[[str], None]) -> list[dict]:
    from dp_icl_plugin import (
        BudgetManager,
        MozoOfflineSynthesizer,
        PrivacyBudget,
        PrivateDataset,
        PrivateRecord,
        PromptTemplate,
        PTASynthesizer,
    )
    from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder

    mrs_all = list(test)
    order = np.random.default_rng(1000 + seed).permutation(len(mrs_all))
    queries = [mrs_all[i] for i in order[: args.n_test]]
    public = [mrs_all[i] for i in order[args.n_test : args.n_test + args.n_public]]
    dataset = PrivateDataset([PrivateRecord(mr, ref) for mr, ref in dev])
    delta = 1.0 / len(dev)
    rows: list[dict] = []

    def row(method: str, epsilon: float | None, outputs: list[str], start: float, ledger=None, **extra) -> None:
        rouge, cosine = scorer(queries, outputs)
        spent = None if ledger is None else ledger.spent()
        if ledger is not None and spent.epsilon > ledger.budget.epsilon + 1e-9:
            raise AssertionError(f"{method} spent {spent.epsilon} > {ledger.budget.epsilon}")
        rows.append(
            {
                "seed": seed,
                "method": method,
                "epsilon": epsilon,
                "rouge_l": rouge,
                "cosine": cosine,
                "seconds": time.perf_counter() - start,
                "spent_epsilon": None if spent is None else spent.epsilon,
                "outputs": outputs,
                **extra,
            }
        )
        log(
            f"  seed {seed} {method:22s} ε={epsilon!s:5s} ROUGE-L {rouge:5.1f} cos {cosine:5.1f} "
            f"{rows[-1]['seconds']:6.0f}s  e.g. {outputs[0][:70]!r}"
        )

    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    row("zero-shot greedy", 0.0, zero_shot(backend, template, queries, rng, greedy=True), t)
    t = time.perf_counter()
    row("zero-shot", 0.0, zero_shot(backend, template, queries, rng, greedy=False), t)
    t = time.perf_counter()
    row("few-shot (not private)", math.inf, ensemble(backend, template, dataset, queries, rng), t)
    t = time.perf_counter()
    real = [dev[int(i)] for i in rng.choice(len(dev), size=N_SHOTS, replace=False)]
    row("few-shot greedy (not private)", math.inf, few_shot_greedy(backend, template, real, queries), t)

    # PTA writes whole pairs: one label holding every record (|D| public under replace-one)
    pta_data = PrivateDataset(
        [PrivateRecord(f"{mr}\nAnswer: {ref}", "restaurant") for mr, ref in dev],
        public_label_counts={"restaurant": len(dev)},
    )  # |D|: public under replace-one
    pta_template = PromptTemplate(
        header="Restaurant data and a sentence that says it.\n\n",
        example="Input: {text}\n\n",
        query="Input:",
        base="Input:",
        stop="\n\n",
    )
    for eps in args.epsilons:
        order_ = ORDERS.get(eps, 8.0)

        def budget(eps: float = eps) -> BudgetManager:  # one ledger per row
            return BudgetManager(PrivacyBudget(eps, delta))

        ledger = budget()
        t = time.perf_counter()
        decoder = MozoDecoder(
            dataset,
            backend=backend,
            budget=ledger,
            n_queries=args.n_test,
            max_tokens=T_MAX,
            epsilon=eps,
            delta=delta,
            n_shots=N_SHOTS,
            top_k=TOP_K,
            order=order_,
            template=template,
        )
        outs = [decoder.generate(q, rng=rng, stop=["\n"]).text.strip() for q in queries]
        row("DPS-MOZO+On", eps, outs, t, ledger, beta=decoder.beta)

        ledger = budget()
        t = time.perf_counter()
        method = MozoOfflineSynthesizer(
            epsilon=eps, delta=delta, n_shots=N_SHOTS, max_tokens=T_SYN, top_k=TOP_K, order=order_, template=template
        )
        demos = method.synthesize(
            dataset, public_inputs=public, backend=backend, budget=ledger, rng=rng, progress=False
        )
        pairs = [(d.input, d.text.strip()) for d in demos if d.text.strip()]
        outs = few_shot_greedy(backend, template, pairs[:N_SHOTS], queries)
        row("DPS-MOZO+Off", eps, outs, t, ledger, demos=len(pairs), demo_example=pairs[0] if pairs else None)

        ledger = budget()
        t = time.perf_counter()
        clip = ClipBlendDecoder(
            dataset,
            backend=backend,
            budget=ledger,
            n_queries=args.n_test,
            max_tokens=T_MAX,
            subset_size=args.subset_size,
            rng_subset=rng,
            epsilon=eps,
            delta=delta,
            clip=CLIP,
            template=template,
        )
        outs = [clip.generate(q, rng=rng, stop=["\n"]).text.strip() for q in queries]
        row("clip-blend decoding", eps, outs, t, ledger, temperature=clip.temperature)

        ledger = budget()
        t = time.perf_counter()
        pta = PTASynthesizer(
            epsilon=eps,
            delta=delta,
            n_prompts=args.pta_prompts,
            records_per_prompt=1,
            max_tokens=args.pta_tokens,
            shots_per_label=args.pta_demos,
            top_k=TOP_K,
            template=pta_template,
        )
        demos = pta.synthesize(pta_data, backend=backend, budget=ledger, rng=rng, progress=False)
        pairs = pta_pairs(demos)
        outs = few_shot_greedy(backend, template, pairs[:N_SHOTS], queries)
        row(
            "PTA demos",
            eps,
            outs,
            t,
            ledger,
            demos=len(pairs),
            demo_example=pairs[0] if pairs else None,
            raw_example=demos[0].text[:200],
        )
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Mean and standard error over seeds per (method, ε)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        entry = {
            "method": method,
            "epsilon": eps,
            "seeds": len(rs),
            "seconds": float(np.mean([r["seconds"] for r in rs])),
        }
        for key in ("rouge_l", "cosine"):
            values = np.array([r[key] for r in rs])
            entry[key] = float(values.mean())
            entry[key + "_se"] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")
        out.append(entry)
    return out


def table(summary: list[dict]) -> str:
    def eps_text(e: float) -> str:
        return "∞" if math.isinf(e) else f"{e:g}"

    lines = ["| ε | method | ROUGE-L F1 | MiniLM cosine | s per seed |", "|---|---|---:|---:|---:|"]
    for s in sorted(summary, key=lambda s: (s["epsilon"] if not math.isinf(s["epsilon"]) else 1e9, s["method"])):
        lines.append(
            f"| {eps_text(s['epsilon'])} | {s['method']} | {s['rouge_l']:.1f} ± {s['rouge_l_se']:.1f} | "
            f"{s['cosine']:.1f} ± {s['cosine_se']:.1f} | {s['seconds']:.0f} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    by = {s["method"]: s for s in summary if s["epsilon"] in (0.0, math.inf)}
    for name, style in (("zero-shot", ":"), ("few-shot (not private)", "--")):
        if name in by:
            ax.axhline(by[name]["rouge_l"], ls=style, color="grey", label=f"{name} ({by[name]['rouge_l']:.1f})")
    for method in ("DPS-MOZO+On", "DPS-MOZO+Off", "clip-blend decoding", "PTA demos"):
        pts = sorted((s["epsilon"], s["rouge_l"], s["rouge_l_se"]) for s in summary if s["method"] == method)
        if pts:
            e, m, se = zip(*pts, strict=True)
            ax.errorbar(e, m, yerr=np.nan_to_num(se), marker="o", capsize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ε (δ = 1/|D|, replace-one)")
    ax.set_ylabel("ROUGE-L F1")
    ax.set_title("E2E on SmolLM2-135M-Instruct (mean ± s.e. over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 seed, 2 queries, ε = 2, short PTA pairs: a check that every row runs"
    )
    parser.add_argument("--n-test", type=int, default=8, help="test MRs per seed")
    parser.add_argument("--n-public", type=int, default=4, help="public inputs DPS-MOZO+Off answers")
    parser.add_argument("--pta-demos", type=int, default=2, help="pairs PTA writes")
    parser.add_argument("--pta-tokens", type=int, default=48, help="tokens of each PTA pair (MR and sentence)")
    parser.add_argument("--pta-prompts", type=int, default=5, help="PTA's M (one record per prompt)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--subset-size", type=int, default=32, help="clip-blend's s")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.quick:
        args.n_test, args.seeds, args.epsilons, args.n_public, args.pta_tokens = 2, 1, [2.0], 2, 16
        args.out = args.out.with_name(args.out.name + "-quick")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dp_icl_plugin.backends.hf import HFBackend

    def log(msg: str) -> None:
        print(msg, flush=True)

    start = time.perf_counter()
    dev, test = load()
    backend = HFBackend.from_pretrained("smollm2-135m-instruct")
    template = chat_layout(backend)
    scorer = Scorer(test)
    log(
        f"{len(dev)} private records, {len(test)} test MRs; {args.n_test} queries × {args.seeds} seeds, "
        f"ε ∈ {args.epsilons}; model loaded in {time.perf_counter() - start:.0f}s"
    )
    rows: list[dict] = []
    for seed in range(args.seeds):
        rows += run_seed(seed, args, backend, template, dev, test, scorer, log)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    summary = summarise(rows)
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU"
    meta = {
        "n_test": args.n_test,
        "seeds": args.seeds,
        "epsilons": args.epsilons,
        "n_public": args.n_public,
        "subset_size": args.subset_size,
        "pta": [args.pta_demos, args.pta_tokens, args.pta_prompts],
        "machine": machine,
        "minutes": (time.perf_counter() - start) / 60,
    }
    (args.out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    plot(summary, args.out / "e2e.png")
    log("\n" + table(summary))
    log(
        f"\n{meta['minutes']:.0f} min on {machine}; paper (LLaMA-3 3B): zero-shot {PAPER['zero-shot']}, "
        f"few-shot {PAPER['few-shot']}"
    )


if __name__ == "__main__":
    main()
