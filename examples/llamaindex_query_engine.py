"""A LlamaIndex query engine over private records: DP demonstrations, DP retrieval and a DP LLM on one ledger.

Offline, 171 s at the first start and 51 s at the second, which reuses the demonstrations and the index
(``OMP_NUM_THREADS=1``, 2 cores, ``/usr/bin/time``): 1,000 TREC questions are the private records. Three methods
charge one replace-one ledger, whose total is printed at the end:

- PTA synthesizes one demonstration per large question class (label sizes declared public), shown to the LLM in
  the query engine's prompt (free to reuse: post-processing);
- the private retriever releases a DP answer decoded by the nearest records as experts (expert decoding; each
  record may lose ε = 2, δ = 1e-6 under add/remove; the ledger holds its group-privacy conversion);
- the LLM decodes with DPS-MOZO over the same records.

The model is the pretrained SmolLM2-135M-Instruct that the set-up installs. What it prints is honest rather than
pretty: at ε = 1 with each label declared at |D| = 1,000 (q = 0.01), PTA's noise outweighs the private prompts
and the 135M model's plain-text demonstrations drift off topic; the DPS-MOZO answer follows the records, which
pair a question with its answer type. The chat and RAG examples show what this model does well.

    python examples/llamaindex_query_engine.py [LEDGER]

LEDGER defaults to ``examples-ledgers/llamaindex_query_engine.db``. The PTA demonstrations (``save_to``) and the
private index (``kept_index``) are kept beside it: a second run reopens them and charges only its answers.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
from llama_index.core import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.dp_icl import DPICL
from llama_index.retrievers.dp_icl import DPICLRetriever

from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset, PTASynthesizer
from dp_icl_plugin import PromptTemplate as DemoTemplate
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.decoding.decoders import MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig, PrivateKNN, index_beside, kept_index

DATA = Path(__file__).resolve().parent / "data" / "trec"  # shipped with the examples (data/README.md)


def main() -> None:
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("examples-ledgers") / "llamaindex_query_engine.db"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    lines = (DATA / "train.txt").read_text(encoding="latin-1").splitlines()[:1000]
    questions = [ln.split(" ", 1)[1] for ln in lines]
    classes = [ln.split(":", 1)[0] for ln in lines]
    backend = HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu")  # the set-up's pretrained model

    # --8<-- [start:llamaindex]
    budget = BudgetManager(PrivacyBudget(epsilon=8.0, delta=1e-4), ledger=ledger)  # replace-one, the default
    trec = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]  # TREC's public classes
    # each label's size is private under replace-one; |D| (public) bounds every one of them
    records = PrivateDataset.from_pairs(questions, classes, public_label_counts=dict.fromkeys(trec, len(questions)))
    labels = trec[1:]  # demonstrations for five classes
    demos = PTASynthesizer(
        epsilon=1.0,
        delta=1e-5,
        n_prompts=5,
        records_per_prompt=2,
        max_tokens=12,
        top_k=20,
        template=DemoTemplate(header="Questions of type {label}:\n", example="{text}\n", query=""),
    ).synthesize(
        records,
        labels=labels,
        backend=backend,
        budget=budget,
        rng=np.random.default_rng(),
        save_to=f"{ledger}.demos.jsonl",  # paid once: served from the file at every later start
    )
    index = kept_index(
        index_beside(budget, "trec"),  # beside the ledger: its cover is charged once, not at every start
        budget=IndividualBudget(epsilon=2.0, delta=1e-6),
        texts=questions,
        answers=classes,
    )
    retriever = DPICLRetriever(
        PrivateKNN(
            index,
            budget=budget,
            backend=backend,
            config=KNNConfig(k=40, uses=2, max_answer_tokens=4),
            releases=("decode",),
        ),
        rng=np.random.default_rng(),
    )
    decoder = MozoDecoder(records, backend=backend, budget=budget, n_queries=50, epsilon=2.0, max_tokens=8)
    examples = "\n".join(f"{d.label}: {d.text}" for d in demos)  # DP output: public
    qa = PromptTemplate(
        "Example questions:\n"
        + examples.replace("{", "{{").replace("}", "}}")
        + "\nContext: {context_str}\nQuestion: {query_str}\nAnswer:"
    )
    engine = RetrieverQueryEngine.from_args(
        retriever, llm=DPICL(decoder, rng=np.random.default_rng()), text_qa_template=qa
    )
    response = engine.query("Who wrote Hamlet ?")
    # --8<-- [end:llamaindex]

    print("DP demonstrations:", [f"{d.label}: {d.text}" for d in demos])
    print("answer:", repr(str(response)))
    print("context:", [node.node.metadata["kind"] for node in response.source_nodes])
    kinds = Counter(entry.label.split(":")[0] for entry in budget.history())
    print(
        f"ledger {ledger} ({budget.neighbouring}): spent ε = {budget.spent().epsilon:.3f} of "
        f"{budget.budget.epsilon} (δ = {budget.budget.delta:.3g}); entries: {dict(kinds)}"
    )
    budget.close()


if __name__ == "__main__":
    main()
