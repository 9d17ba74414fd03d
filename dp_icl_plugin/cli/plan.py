"""``dp-icl plan``: what each method would do with a budget, before anything is charged (reads no data)."""

from __future__ import annotations

import argparse
from typing import Any

from dp_icl_plugin.planning import plan

__all__ = ["add_parser", "run"]


def add_parser(top: Any, common: argparse.ArgumentParser, number: Any, integer: Any) -> None:
    p = top.add_parser(
        "plan", parents=[common], help="preview every method's settings and effect for a budget; charges nothing"
    )
    p.add_argument("--records", type=integer, required=True, help="how many private records (as you know it)")
    p.add_argument("--epsilon", type=number, required=True, help="the ledger's ε for this use")
    p.add_argument("--delta", type=number, required=True)
    p.add_argument("--answers", type=integer, required=True, help="how many answers the app needs")
    p.add_argument(
        "--tokens",
        type=integer,
        required=True,
        help="the longest answer, in tokens (answers restricted to public choices or a JSON schema: the tokens a "
        "mechanism decides, e.g. 1 for six one-word types, 2 for an enum and a boolean; "
        "JSONSchemaAnswers.decisions gives it)",
    )
    p.add_argument(
        "--neighbouring",
        default="replace_one",
        choices=["replace_one", "add_remove"],
        help="the ledger's neighbouring relation (default replace_one)",
    )
    p.add_argument("--k", type=integer, default=40, help="kNN experts per answer (default 40)")
    p.add_argument(
        "--candidates",
        type=integer,
        default=None,
        help="records expected to pass min_similarity per query; they pay each answer (default k)",
    )
    p.add_argument("--shards", type=integer, default=10, help="kNN keyword answers' shards (default 10)")
    p.add_argument("--subset-size", type=integer, default=None, help="clip-blend's subset (default min(records, k))")
    p.add_argument("--vocab-size", type=integer, default=49152, help="the model's vocabulary (SmolLM2: 49152)")
    p.add_argument(
        "--choices",
        type=integer,
        default=None,
        help="how many public answer choices the answers are restricted to (default: free text)",
    )
    p.add_argument(
        "--agreeing",
        type=integer,
        default=10,
        help="records you expect to share a fact (a fix, a label's cue): the plan gives the ε at which that many "
        "would tip a token (default 10)",
    )
    p.add_argument(
        "--paid-tokens",
        type=integer,
        default=2,
        help="sparse expert decoding: tokens of an answer drawn from the records and paid, the rest public (default 2)",
    )
    p.add_argument(
        "--expected-tokens",
        type=integer,
        default=None,
        help="DPS-MOZO and clip-blend paid per token (pay_per_token=True): the tokens an answer is expected to run, "
        "EOS included; each answer pays what it ran (default: --tokens)",
    )
    p.add_argument(
        "--demonstrations",
        type=integer,
        default=4,
        help="a pay-once synthesis for free text (tang-answers): the public inputs it answers, each in --tokens "
        "tokens (default 4)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> dict[str, Any]:

    return plan(
        records=args.records,
        epsilon=args.epsilon,
        delta=args.delta,
        answers=args.answers,
        tokens=args.tokens,
        relation=args.neighbouring,
        k=args.k,
        candidates=args.candidates,
        shards=args.shards,
        subset_size=args.subset_size,
        vocab_size=args.vocab_size,
        choices=args.choices,
        agreeing=args.agreeing,
        paid_tokens=args.paid_tokens,
        expected_tokens=args.expected_tokens,
        demonstrations=args.demonstrations,
    ).as_dict()
