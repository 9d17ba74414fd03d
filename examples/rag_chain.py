"""A RAG chain whose context comes from private records through a DP release (LangChain).

Offline, 57 s at the first start and 34 s at the second (``OMP_NUM_THREADS=1``, 2 cores, ``/usr/bin/time``):
1,000 TREC questions (``examples/data/trec``, shipped) are the private records, with their coarse class as the
"answer" each record carries; every record may lose at most ε = 2 (δ = 1e-6) for
adding or removing it, ε = 4 for replacing it (the ledger's relation). The retriever returns one DP answer
decoded by the 40 nearest records as experts (each paying its own budget; expert decoding), which the chain
puts into the chat prompt of a local model: the pretrained SmolLM2-135M-Instruct that the set-up installs,
which also decodes the experts' answer.

    python examples/rag_chain.py [LEDGER]

LEDGER defaults to ``examples-ledgers/rag_chain.db``; the private index is kept beside it (``kept_index``), so a
second run reopens both and charges only its answers.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_dp_icl import ChatZeroShot, DPICLRetriever

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.retrieval import KNNConfig, PrivateKNN, index_beside, kept_index

DATA = Path(__file__).resolve().parent / "data" / "trec"  # shipped with the examples (data/README.md)
NAMES = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}


def main() -> None:
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("examples-ledgers") / "rag_chain.db"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    lines = (DATA / "train.txt").read_text(encoding="latin-1").splitlines()[:1000]
    texts = [ln.split(" ", 1)[1] for ln in lines]
    answers = [NAMES[ln.split(":", 1)[0]] for ln in lines]
    backend = HFBackend.from_pretrained("smollm2-135m-instruct", device="cpu")  # the set-up's pretrained model

    # --8<-- [start:rag]
    budget = BudgetManager(PrivacyBudget(epsilon=5.0, delta=1e-4), ledger=ledger)
    index = kept_index(  # built beside the ledger once; reopened with its records' spend at every later start
        index_beside(budget, "trec"),
        budget=IndividualBudget(epsilon=2.0, delta=1e-6),  # per record; (4, 8.4e-6) on the ledger
        texts=texts,
        answers=answers,
    )
    core = PrivateKNN(
        index,
        budget=budget,
        backend=backend,
        config=KNNConfig(k=40, min_similarity=0.3, uses=2, max_answer_tokens=4),
        releases=("decode",),  # expert decoding (checked before the filter's cover is charged)
    )  # a record joins 2 answers of at most 4 tokens
    retriever = DPICLRetriever(knn=core, rng=np.random.default_rng())  # mode="experts"
    prompt = PromptTemplate.from_template("Answer briefly. The answer type: {context}\nQuestion: {question}")
    chain = (
        {
            "context": retriever | (lambda docs: docs[0].page_content),
            "question": RunnablePassthrough(),
        }
        | prompt
        # the same model, greedy: it reads only the DP context. It shares the DP core's backend because only this
        # chain calls it; a model that others can call and time needs its own (docs/audit.md, side channels)
        | ChatZeroShot(backend=backend, max_tokens=16)
        | StrOutputParser()
    )
    for question in ["Who wrote Hamlet ?", "How far is the Moon from the Earth ?"]:
        print(question, "->", repr(chain.invoke(question)))
    # --8<-- [end:rag]

    kinds = Counter(entry.label.split(":")[0] for entry in budget.history())
    print(
        f"ledger {ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
        f"(δ = {budget.budget.delta:.3g}); entries: {dict(kinds)}"
    )
    budget.close()


if __name__ == "__main__":
    main()
