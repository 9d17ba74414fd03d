"""The full pipeline (``make demo``): DP demonstrations by PTA, served to a LangChain few-shot chain.

Offline, on the committed GINC model (59 s at the first start, 46 s at the second; ``make demo``, 2 cores):
1. 1,600 private GINC examples per concept; PTA synthesizes 4 demonstrations per concept at ε = 1
   (δ = 1/1,600), charged once to a ledger file.
2. ``DPICLExampleSelector`` serves them (free: post-processing) to a ``FewShotPromptTemplate``, and an
   LCEL chain answers GINC test queries with the model's next token.
3. Accuracy with the DP demonstrations against 0-shot (the same chain, no demonstrations), then the ledger.
4. A real DP answer: the pretrained SmolLM2-135M-Instruct chat model (installed by the set-up) answers a
   question with DPS-MOZO over 500 private TREC questions (another dataset, so another budget).

    python examples/few_shot_chain.py [LEDGER] [--queries N]

LEDGER defaults to ``examples-ledgers/few_shot_chain.db``; the demonstrations are kept beside it
(``few_shot_chain.db.demos.jsonl``), so a second run serves them without a charge. The accuracies come with 95 %
Wilson intervals: the synthesis's noise is fresh at each first run (OS-seeded), and one run's figure swings with it.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from langchain_core.prompts import FewShotPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_dp_icl import DPICLExampleSelector

from dp_icl_plugin import PRESETS, BudgetManager, PrivacyBudget, PTASynthesizer
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import concept_label, private_dataset
from dp_icl_plugin.ginc.prompts import pta_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledger", nargs="?", type=Path, default=Path("examples-ledgers") / "few_shot_chain.db")
    parser.add_argument("--queries", type=int, default=100, help="test queries per concept (default 100)")
    args = parser.parse_args()
    args.ledger.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    backend, language = load_model(device="cpu")
    split = pta_split(language, n_train=1600, n_test=args.queries, rng=np.random.default_rng(0))
    private = private_dataset(language, {c: train for c, (train, _) in split.items()})
    tests = [(concept_label(c), ex) for c, (_, test) in split.items() for ex in test]

    # --8<-- [start:few_shot]
    budget = BudgetManager(PrivacyBudget(epsilon=2.0, delta=1 / 1600), ledger=args.ledger)
    pta = PTASynthesizer(
        epsilon=1.0,
        delta=1 / 1600,
        alpha=2.0,
        n_prompts=5,
        records_per_prompt=4,
        max_tokens=10,
        shots_per_label=4,
        top_k=10,
        template=PRESETS["ginc"],
    )
    demos = pta.synthesize(  # charged once, before the chain runs (a progress bar on a terminal)
        private,
        backend=backend,
        budget=budget,
        rng=np.random.default_rng(),
        save_to=f"{args.ledger}.demos.jsonl",  # kept: a later start serves them without a charge
    )
    selector = DPICLExampleSelector.from_demos(demos, fields={"text": "text"}, label_key="concept")
    prompt = FewShotPromptTemplate(
        example_selector=selector,
        example_prompt=PromptTemplate.from_template("{text}"),
        example_separator=" / ",
        suffix="{query}",
        input_variables=["query", "concept"],
    )
    chain = prompt | RunnableLambda(next_symbol(backend, language))
    answers = chain.batch([{"query": language.render(ex.tokens), "concept": c} for c, ex in tests])
    # --8<-- [end:few_shot]

    zero_shot = PromptTemplate.from_template("{query}") | RunnableLambda(next_symbol(backend, language))
    baseline = zero_shot.batch([{"query": language.render(ex.tokens)} for _, ex in tests])
    truth = [language.vocab[ex.label] for _, ex in tests]
    dp_acc = np.mean([a == t for a, t in zip(answers, truth, strict=True)])
    zero_acc = np.mean([a == t for a, t in zip(baseline, truth, strict=True)])
    print(
        f"GINC, {len(tests)} test queries (k = 10): 4 DP demonstrations (PTA, ε = 1) {100 * dp_acc:.1f}% "
        f"{wilson(dp_acc, len(tests))} vs 0-shot {100 * zero_acc:.1f}% {wilson(zero_acc, len(tests))}"
    )
    print(f"demonstrations served: {len(selector.demos)} (synthesized once; every prompt after that is free)")
    print(
        f"ledger {args.ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
        f"(δ = {budget.budget.delta:.3g}); charges: {budget.label_counts()}"
    )
    budget.close()
    real_model_answer()
    print(f"({time.monotonic() - started:.0f} s)")


def wilson(rate: float, n: int) -> str:
    """The 95 % Wilson interval of an accuracy over ``n`` queries, in percent."""
    z = 1.96
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"[{100 * (centre - half):.1f}, {100 * (centre + half):.1f}]"


def real_model_answer() -> None:
    """One DPS-MOZO chat answer from the pretrained model over private TREC questions (ε = 1 for 10 answers)."""
    from langchain_dp_icl import ChatDPICL, ChatZeroShot

    from dp_icl_plugin import PrivateDataset

    trec = Path(__file__).resolve().parent / "data" / "trec" / "train.txt"  # shipped (examples/data/README.md)
    lines = trec.read_text(encoding="latin-1").splitlines()[:500]
    private = PrivateDataset.from_pairs([ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines])
    budget = BudgetManager(PrivacyBudget(epsilon=1.0, delta=1e-4))  # TREC's own budget (in memory here)
    chat = ChatDPICL.from_model_id(
        "smollm2-135m-instruct",
        private,
        budget=budget,
        rng=np.random.default_rng(),
        n_queries=10,
        epsilon=1.0,
        max_tokens=12,
    )
    question = "Who wrote Hamlet?"
    answer = chat.invoke(question).content
    greedy = ChatZeroShot(backend=chat.decoder.backend, max_tokens=12).invoke(question).content  # no records
    print(
        f"SmolLM2-135M-Instruct with DPS-MOZO over 500 private TREC questions: {question!r} -> {answer!r} "
        f"(greedy zero-shot, without the records: {greedy!r}). The share covers 10 such answers at ε = 1.0 "
        f"together; this first one alone shows ε = {budget.spent().epsilon:.3f} on the ledger because ε grows "
        "far slower than the number of answers (Rényi composition): all 10 together stay within 1.0"
    )


def next_symbol(backend, language):
    """The model's most likely next GINC symbol after a rendered prompt (public post-processing)."""

    def predict(prompt_value) -> str:
        ids = backend.encode(prompt_value.to_string())
        return language.vocab[int(np.argmax(backend.next_token_logprobs([ids])[0]))]

    return predict


if __name__ == "__main__":
    main()
