"""Private kNN classification: TREC questions as private records, each with its own privacy budget.

Runs offline in under a minute: 2,000 TREC training questions (``examples/data/trec``, shipped) go into a private
index embedded with all-MiniLM-L6-v2; every record may lose at most ε = 2 (δ = 1e-6) over all releases
for adding or removing it. Fifty test questions are labelled by a DP vote of their nearest private
neighbours; the (replace-one) ledger is charged once for the filter, converted by group privacy, and
records every release.

    python examples/private_knn_classification.py [LEDGER]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.retrieval import KNNConfig, PrivateKNN, index_beside, kept_index

DATA = Path(__file__).resolve().parent / "data" / "trec"  # shipped with the examples (data/README.md)


def read(path: Path, limit: int) -> tuple[list[str], list[str]]:
    lines = path.read_text(encoding="latin-1").splitlines()[:limit]
    return [ln.split(" ", 1)[1] for ln in lines], [ln.split(":", 1)[0] for ln in lines]


def main() -> None:
    ledger = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("examples-ledgers") / "private_knn_classification.db"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    texts, labels = read(DATA / "train.txt", 2000)
    queries, truth = read(DATA / "test.txt", 50)

    # --8<-- [start:knn]
    # replace-one ledger: the filter's add/remove (2, 1e-6) is charged as (4, (1 + e²)·1e-6) by group privacy
    budget = BudgetManager(PrivacyBudget(epsilon=5.0, delta=1e-4), ledger=ledger)
    index = kept_index(  # beside the ledger: a second run reopens it (and its spend) instead of paying again
        index_beside(budget, "trec"),
        budget=IndividualBudget(epsilon=2.0, delta=1e-6),  # per record, over all releases
        texts=texts,
        labels=labels,
    )
    retriever = PrivateKNN(
        index, budget=budget, labels=sorted(set(labels)), config=KNNConfig(k=40, min_similarity=0.35, uses=4)
    )
    rng = np.random.default_rng()
    answers = [retriever.vote(question, rng=rng).label for question in queries]
    # --8<-- [end:knn]

    accuracy = np.mean([a == t for a, t in zip(answers, truth, strict=True)])
    print(f"DP nearest-neighbour vote on {len(queries)} TREC questions: accuracy {100 * accuracy:.0f}%")
    print(f"records that paid at least once: {len(index.filter.all_spent()[0])} of {len(index)}")
    kinds = Counter(entry.label.split(":")[0] for entry in budget.history())  # labels also name the index
    print(
        f"ledger {ledger}: spent ε = {budget.spent().epsilon:.3f} of {budget.budget.epsilon} "
        f"(δ = {budget.budget.delta:.3g}); entries: {dict(kinds)}"
    )
    budget.close()


if __name__ == "__main__":
    main()
