"""``dp-icl answer``: public queries in, DP answers from a private file out, each answer charged to a ledger file
before any record is read (``dp-icl budget init`` creates the ledger). A share too small for every query is refused
before the first charge; a query that fails later stops the run, and the answers before it (charged) are printed
with the failure (exit status 1).

The decoders are :func:`~dp_icl_plugin.decoding.factory.build_decoder`'s: DPS-MOZO, clip-blend, kNN expert decoding
(per answer or paid per token) and kNN keyword hints. A kNN decoder keeps its private index beside the ledger, so
a second run over the same file pays no second cover; the others charge each answer.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import BudgetManager
from dp_icl_plugin.data.files import load_dataset
from dp_icl_plugin.decoding.factory import DECODING_METHODS, build_decoder
from dp_icl_plugin.errors import ConfigurationError, DPICLError

__all__ = ["add_parser", "answer"]

# CLI option -> decoder setting; the decoder refuses, before the model loads, a setting it does not take
_SETTINGS = {
    "k": "k",
    "min_similarity": "min_similarity",
    "subset_size": "subset_size",
    "population": "population_size",
    "n_shots": "n_shots",
    "delta": "delta",
}


def add_parser(top: Any, common: argparse.ArgumentParser, number: Any, integer: Any) -> None:
    p = top.add_parser("answer", parents=[common], help="answer queries with a DP decoder over a private file")
    p.add_argument("queries", nargs="+", help="the public queries")
    p.add_argument("--method", required=True, choices=DECODING_METHODS)
    p.add_argument("--data", required=True, help="private records: .csv (with a header) or .jsonl")
    p.add_argument("--text-column", required=True, help="the column of the records' texts")
    p.add_argument(
        "--label-column",
        required=True,
        help="the column each record shows the model after its text (a label, or the answer to a ticket)",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="a local model, .gguf file or named model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ledger", required=True, help="the budget ledger file (create it with `dp-icl budget init`)")
    p.add_argument("--epsilon", type=number, required=True, help="this decoder's share of the ledger")
    p.add_argument("--delta", type=number, default=None, help="δ of the share (default: the decoder's)")
    p.add_argument("--n-queries", type=integer, required=True, help="the answers the share covers (public)")
    p.add_argument("--max-tokens", type=integer, default=32, help="the longest answer (default 32)")
    p.add_argument("--choices", default=None, help="public answers every answer is restricted to, comma-separated")
    p.add_argument(
        "--pay-per-token",
        action="store_true",
        help="each token mechanism charged right before it runs (mozo, clip-blend, knn-experts)",
    )
    g = p.add_argument_group("method settings (each method takes its own)")
    g.add_argument("--k", type=integer, default=None, help="knn: experts (candidates expected) per answer")
    g.add_argument(
        "--min-similarity", type=number, default=None, help="knn: the similarity a record needs to take part"
    )
    g.add_argument("--population", type=integer, default=None, help="the public population size (add/remove ledgers)")
    g.add_argument("--subset-size", type=integer, default=None, help="clip-blend: its fixed subset s")
    g.add_argument("--n-shots", type=integer, default=None, help="mozo: records per token")
    p.add_argument("--seed", type=integer, default=None, help="noise seed (tests and benchmarks only)")
    p.set_defaults(handler=answer)


def _settings(a: argparse.Namespace) -> dict[str, Any]:
    """The decoder's settings from the options given (public: read before any record)."""
    settings: dict[str, Any] = {"epsilon": a.epsilon, "n_queries": a.n_queries, "max_tokens": a.max_tokens}
    settings.update({key: getattr(a, option) for option, key in _SETTINGS.items() if getattr(a, option) is not None})
    if a.choices is not None:
        choices = [c.strip() for c in a.choices.split(",") if c.strip()]
        if not choices:
            raise ConfigurationError("--choices needs at least one answer")
        settings["choices"] = choices
    if a.pay_per_token:
        settings["pay_per_token"] = True
    if a.method == "clip-blend":  # the subset's one draw (its own randomness, as the noise's)
        settings["rng_subset"] = np.random.default_rng(None if a.seed is None else [a.seed, 1])
    return settings


def answer(a: argparse.Namespace) -> dict[str, Any]:
    ledger = Path(a.ledger)
    if not ledger.exists():
        raise ConfigurationError(f"no ledger at {ledger}: create it with `dp-icl budget init`")
    settings = _settings(a)
    data = load_dataset(a.data, text_column=a.text_column, label_column=a.label_column)
    budget = BudgetManager.open(ledger)
    try:
        decoder = build_decoder(a.model, data, budget=budget, method=a.method, device=a.device, **settings)
        decoder.check_answers_left(len(a.queries))  # a share too small for them all: refused before any charge
        rng = np.random.default_rng(a.seed)
        answers: list[dict[str, Any]] = []
        failed: dict[str, Any] | None = None
        for query in a.queries:  # a user's message where the model has a chat template, else a completion
            asked = [{"role": "user", "content": query}] if decoder.has_chat_template else query
            try:
                out = decoder.generate(asked, rng=rng)
            except Exception as exc:  # the answers before it were charged and are kept: printed, not lost
                # a library error's message is public (a release's failure after its charge is one fixed text);
                # any other's could quote a record, so only its type is shown
                message = str(exc) if isinstance(exc, DPICLError) else "an unexpected error"
                failed = {"query": query, "error": type(exc).__name__, "message": message}
                break
            answers.append(
                {
                    "query": query,
                    "answer": out.text,
                    "finish_reason": out.finish_reason,
                    "ledger_entry": out.ledger_entry,
                    **({} if out.released is None else {"released_keywords": list(out.released)}),
                }
            )
        spent, remaining = budget.spent(), budget.remaining()
        knn = getattr(decoder, "knn", None)  # a kNN decoder's index holds the records' text: say where
        kept = None if knn is None or knn.index.path is None else str(knn.index.path)
    finally:
        budget.close()
    return {
        "method": a.method,
        "answers": answers,
        **({} if failed is None else {"failed": failed}),
        **({} if kept is None else {"index": kept}),
        "ledger": str(ledger),
        "spent_epsilon": spent.epsilon,
        "remaining_epsilon": remaining.epsilon,
    }
