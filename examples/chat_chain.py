"""A DP chat model in an LCEL chain (LangChain): every answer is DP with respect to private records.

Offline: 2,000 TREC questions with their type are the private records. Each answer is decoded by expert
decoding: the 40 records nearest to the question (with budget left) each give a one-shot prompt, steer every
token of the answer, and pay their own share of the budget through their Rényi filter; the answer is
restricted to the six public types (``choices``). The model is the pretrained SmolLM2-135M-Instruct chat
model that the set-up installs (``"smollm2-135m-instruct"``; any local model path or ``.gguf`` works the same
way). The data are the TREC questions shipped in ``examples/data/trec`` (see ``examples/data/README.md``).

The script then prints what the app has without the records (the same model's greedy answer, free and
restricted to the same types) beside the DP answers.

    python examples/chat_chain.py [LEDGER]

LEDGER defaults to ``examples-ledgers/chat_chain.db`` (in the working directory), with the private index beside it
(``chat_chain.db.indexes/``): run the script again and the second start reopens both, charging only its answers.
Delete both to start over.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_dp_icl import ChatDPICL, ChatZeroShot

from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset

DATA = Path(__file__).resolve().parent / "data" / "trec"  # shipped with the examples (data/README.md)
TYPES = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}
QUESTIONS = ["Who wrote Hamlet ?", "How far is the Moon from the Earth ?", "What does NASA stand for ?"]


def main() -> None:
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("examples-ledgers") / "chat_chain.db"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    lines = (DATA / "train.txt").read_text(encoding="latin-1").splitlines()[:2000]
    questions = [ln.split(" ", 1)[1] for ln in lines]
    types = [TYPES[ln.split(":", 1)[0]] for ln in lines]

    # --8<-- [start:chat]
    private = PrivateDataset.from_pairs(questions, types)  # the private records
    budget = BudgetManager(PrivacyBudget(epsilon=3.0, delta=1e-4), ledger=ledger)
    chat = ChatDPICL.from_model_id(
        "smollm2-135m-instruct",
        private,
        budget=budget,
        rng=np.random.default_rng(),
        method="knn-experts",
        n_queries=100,
        epsilon=2.0,
        choices=list(TYPES.values()),
    )  # the nearest records steer each answer and pay for it; answers are one of the public types
    system = f"Answer with the type of the question, one of: {', '.join(TYPES.values())}."
    chain = ChatPromptTemplate.from_messages([("system", system), ("human", "{question}")]) | chat | StrOutputParser()
    for question in QUESTIONS[:2]:
        print(f"{question!r}: {chain.invoke({'question': question})!r}")
    print(f"{QUESTIONS[2]!r}:", end=" ")
    for piece in chain.stream({"question": QUESTIONS[2]}):  # charged before the first piece
        print(repr(piece), end=" ")
    # --8<-- [end:chat]

    # What the app has without the records: the same model (loaded once), greedy, restricted and free. Sharing the
    # DP decoder's backend is right here, where only this script calls it; a zero-shot model that the app's users
    # can call and time needs a backend of its own (docs/audit.md: the shared lock and cache show the DP releases'
    # durations, which fixed_latency does not hide from another caller).
    restricted = ChatZeroShot(backend=chat.decoder.backend, choices=list(TYPES.values()))
    free = ChatZeroShot(backend=chat.decoder.backend, max_tokens=8)
    print("\nwithout the private records (greedy zero-shot):")
    for question in QUESTIONS:
        messages = [("system", system), ("human", question)]
        print(
            f"{question!r}: {restricted.invoke(messages).content!r} (restricted), "
            f"{free.invoke(messages).content!r} (free)"
        )

    print(
        f"\nledger {ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
        f"(δ = {budget.budget.delta:.3g}); charges: {budget.label_counts()}"
    )
    budget.close()


if __name__ == "__main__":
    main()
