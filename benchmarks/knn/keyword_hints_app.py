"""Keyword hints as a new user's support app would use them: ``ChatDPICL.from_model_id(..., method="knn-keywords")``.

The "tickets" are written here from templates (three problems, each with two or three resolutions; no real data),
N of them (default 300: 100 per problem), on a replace-one ledger at ε = 4 for 20 answers. For each question the
script prints the DP answer, the words the records released, and the same model's greedy zero-shot answer, and
how long the DP answer took.

    python benchmarks/knn/keyword_hints_app.py [N]
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
from langchain_dp_icl import ChatDPICL, ChatZeroShot

from dp_icl_plugin import BudgetManager, PrivacyBudget, PrivateDataset, PrivateRecord

PROBLEMS = {
    "login": (
        ["I cannot log in after the update", "Login page keeps spinning", "Sign in fails with an error"],
        [
            "Clear the browser cache and cookies, then sign in again.",
            "Please clear your cache and cookies and log in again.",
            "Clearing the cache fixed it: clear cache, then sign in.",
        ],
    ),
    "billing": (
        ["I was charged twice this month", "Refund for a duplicate payment", "My invoice shows two charges"],
        ["We refunded the duplicate charge to your card within 5 days.", "The duplicate payment was refunded."],
    ),
    "export": (
        ["Export to CSV produces an empty file", "CSV download is blank", "The exported report is empty"],
        ["Select a date range before exporting; the export needs a date range.", "Set the date range, then export."],
    ),
}
QUESTIONS = ["I can't sign in to the app since yesterday's update", "My CSV export is empty", "I paid twice"]


def tickets(n: int, rng: np.random.Generator) -> PrivateDataset:
    out = []
    for i in range(n):
        asks, fixes = PROBLEMS[list(PROBLEMS)[i % len(PROBLEMS)]]
        out.append(PrivateRecord(f"{asks[rng.integers(len(asks))]} (ticket {i})", fixes[rng.integers(len(fixes))]))
    return PrivateDataset(out)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    ledger = BudgetManager(PrivacyBudget(epsilon=4.0, delta=1e-5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat = ChatDPICL.from_model_id(
            "smollm2-135m-instruct",
            tickets(n, np.random.default_rng(0)),
            budget=ledger,
            rng=np.random.default_rng(1),
            method="knn-keywords",
            epsilon=4.0,
            n_queries=20,
            k=n // 3,
            min_similarity=0.5,
            max_tokens=40,
            keep_index=False,
        )
    for w in caught:
        print("warning:", w.message)
    print(f"{n} tickets; a word needs about {chat.decoder.records_to_agree()} candidates sharing it")
    zero = ChatZeroShot(backend=chat.decoder.backend, max_tokens=40)
    for question in QUESTIONS:
        started = time.perf_counter()
        answer = chat.invoke(question)
        seconds = time.perf_counter() - started
        released = answer.response_metadata["released_keywords"]  # the words the records released (DP, public)
        print(f"\nQ: {question}\n  released: {released}\n  DP ({seconds:.1f} s): {answer.content!r}")
        print(f"  zero-shot: {zero.invoke(question).content!r}")


if __name__ == "__main__":
    main()
