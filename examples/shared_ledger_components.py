"""Three methods, one ledger: a DP few-shot selector and two DP LLMs charge the same budget file.

Offline, under a minute on the committed GINC model. Concept 0's 1,600 private examples feed all three: PTA
synthesizes demonstrations for a ``DPICLExampleSelector`` (charged once); one ``DPICLLLM`` answers GINC
queries by clip-blend decoding over a private subset and another by DPS-MOZO (each answer charged before it
is computed). The ledger is under replace-one neighbours (the default): PTA's Poisson sampling is analysed
for it directly, clip-blend's ε0 is 2c/(sτ), and DPS-MOZO has no other analysis; it composes them into one
guarantee, printed at the end.

    python examples/shared_ledger_components.py [LEDGER]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from langchain_core.prompts import FewShotPromptTemplate, PromptTemplate
from langchain_dp_icl import DPICLLLM, DPICLExampleSelector

from dp_icl_plugin import ANSWER_PRESETS, PRESETS, BudgetManager, PrivacyBudget, PTASynthesizer
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.ginc import load_model
from dp_icl_plugin.ginc.dp_icl import private_dataset, query_answer_dataset
from dp_icl_plugin.ginc.prompts import pta_split


def main() -> None:
    scratch = None if len(sys.argv) > 1 else tempfile.TemporaryDirectory()  # removed at exit
    ledger = Path(sys.argv[1]) if scratch is None else Path(scratch.name) / "ledger.db"
    backend, language = load_model(device="cpu")
    split = pta_split(language, n_train=1600, n_test=20, rng=np.random.default_rng(0))
    train, test = split[0]

    # --8<-- [start:shared]
    budget = BudgetManager(PrivacyBudget(epsilon=5.0, delta=1 / 1600), ledger=ledger)  # one ledger for all three
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
    selector = DPICLExampleSelector(
        synthesizer=pta,
        dataset=private_dataset(language, {0: train}),
        backend=backend,
        budget=budget,
        rng=np.random.default_rng(),
        fields={"text": "text"},
    )
    pairs = query_answer_dataset(language, train)  # the same records as input → answer pairs
    common = {
        "backend": backend,
        "budget": budget,
        "n_queries": 20,
        "max_tokens": 1,
        "template": ANSWER_PRESETS["ginc"],
    }
    decoder = ClipBlendDecoder(pairs, subset_size=100, rng_subset=np.random.default_rng(), epsilon=2.0, **common)
    llm = DPICLLLM(decoder=decoder, rng=np.random.default_rng())
    mozo = DPICLLLM(
        decoder=MozoDecoder(pairs, epsilon=1.0, **common),
        rng=np.random.default_rng(),
    )
    prompt = FewShotPromptTemplate(
        example_selector=selector,
        example_prompt=PromptTemplate.from_template("{text}"),
        example_separator=" / ",
        suffix="{query}",
        input_variables=["query"],
    )
    queries = [prompt.format(query=language.render(ex.tokens)) for ex in test]
    answers = {"clip-blend": [llm.invoke(q) for q in queries], "DPS-MOZO": [mozo.invoke(q) for q in queries]}
    # --8<-- [end:shared]

    for name, got in answers.items():
        accuracy = np.mean([a.strip() == language.vocab[ex.label] for a, ex in zip(got, test, strict=True)])
        print(
            f"GINC concept 0, {len(test)} queries: DP demonstrations + {name} answers, accuracy {100 * accuracy:.0f}%"
        )
    reopened = BudgetManager.open(ledger)  # what any other process sees
    print(
        f"ledger {ledger}: spent ε = {reopened.spent().epsilon:.3f} of {reopened.budget.epsilon} "
        f"(δ = {reopened.budget.delta:.3g}, {reopened.neighbouring})"
    )
    for label, count in sorted(reopened.label_counts().items()):
        print(f"  {count:>3} × {label}")
    budget.close()
    reopened.close()


if __name__ == "__main__":
    main()
