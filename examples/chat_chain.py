"""A DP chat model in an LCEL chain (LangChain): every answer is DP with respect to private records.

Offline: 500 TREC questions with their coarse class are the private records; each answer is decoded by
DPS-MOZO (one-shot prompts from 4 records drawn per token, mixed with the zero-shot prompt) and charged to
the ledger before its first token. The model is the pretrained SmolLM2-135M-Instruct chat model that the
set-up installs (``"smollm2-135m-instruct"``; any local model path or ``.gguf`` works the same way).

    python examples/chat_chain.py [LEDGER]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_dp_icl import ChatDPICL

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.methods import PrivateDataset

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec"


def main() -> None:
    if not DATA.is_dir():
        sys.exit(f"the TREC data is not at {DATA}")
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "ledger.db"
    lines = (DATA / "train.txt").read_text(encoding="latin-1").splitlines()[:500]
    questions = [ln.split(" ", 1)[1] for ln in lines]
    classes = [ln.split(":", 1)[0] for ln in lines]

    # --8<-- [start:chat]
    private = PrivateDataset.from_pairs(questions, classes)  # the private records
    budget = BudgetManager(PrivacyBudget(epsilon=3.0, delta=1e-4), ledger=ledger)
    chat = ChatDPICL.from_model_id(
        "smollm2-135m-instruct", private, budget=budget, rng=np.random.default_rng(), n_queries=100, epsilon=2.0,
        max_tokens=12,
    )  # β calibrated for 100 answers
    chain = (
        ChatPromptTemplate.from_messages([("system", "Name the class of the question."), ("human", "{question}")])
        | chat
        | StrOutputParser()
    )
    print(repr(chain.invoke({"question": "Who wrote Hamlet ?"})))
    for piece in chain.stream({"question": "How far is the Moon ?"}):  # charged before the first piece
        print(repr(piece), end=" ")
    # --8<-- [end:chat]

    # What the records did: the same model's greedy answer with no private data, beside the DP answer above.
    from dp_icl_plugin.backends.generation import greedy_generate

    backend = chat.decoder.backend
    messages = [{"role": "system", "content": "Name the class of the question."},
                {"role": "user", "content": "Who wrote Hamlet ?"}]  # fmt: skip
    zero_shot = backend.decode(greedy_generate(backend, [backend.apply_chat_template(messages)], max_new_tokens=12)[0])
    print(f"\nzero-shot greedy (no private data): {zero_shot!r}")

    print(f"\nledger {ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
          f"(δ = {budget.budget.delta:.3g}); charges: {budget.label_counts()}")  # fmt: skip
    budget.close()


if __name__ == "__main__":
    main()
