"""The ``dp-icl`` command: JSON on stdout for machines, readable text with ``--human``.

Exit status: 0 success, 2 bad input (including an unusable ledger file or path), 3 a charge refused for lack
of budget (nothing committed), 1 an unexpected failure, a failed audit, a row that is not isolated, or an answer
run stopped by a failing query (the answers before it printed). Every
failure writes one line to stderr (never a traceback) and, except for malformed arguments, a JSON ``error``
object to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dp_icl_plugin.accounting.neighbouring import DEFAULT_NEIGHBOURING, PER_RECORD, PRIVACY_UNITS, RELATIONS
from dp_icl_plugin.cli import answer, audit, bench, commands, isolation, plan, synthesize
from dp_icl_plugin.errors import BudgetExhaustedError, DPICLError

__all__ = ["EXIT_BAD_INPUT", "EXIT_REFUSED", "build_parser", "main"]

EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dp-icl`` (exposed for tests and documentation)."""
    # --human is accepted before or after the subcommand; SUPPRESS keeps a subparser from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--human", action="store_true", default=argparse.SUPPRESS, help="readable text, not JSON")

    parser = argparse.ArgumentParser(prog="dp-icl", description=__doc__.splitlines()[0])
    parser.add_argument("--human", action="store_true", help="readable text instead of JSON")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cal = top.add_parser("calibrate", help="the least noise / most signal meeting (ε, δ)").add_subparsers(
        dest="what", required=True, metavar="MECHANISM"
    )
    p = cal.add_parser("subsampled-gaussian", parents=[common], help="σ for Tang et al. / PTA (Poisson)")
    _privacy_target(p)
    _relation(p, "PTA's Table 4: --neighbouring add_remove --accountant prv")
    p.add_argument("--sampling-rate", type=_float, required=True, help="Poisson rate q = M·N/n_y")
    p.add_argument("--steps", type=_int, required=True, help="compositions (tokens × demos per label)")
    p.add_argument("--grid", type=_float, default=0.01)
    p.add_argument("--min", dest="lo", type=_float, default=0.3)
    p.add_argument("--max", dest="hi", type=_float, default=3.0)
    p.add_argument("--accountant", default="auto", choices=["auto", "pld", "prv", "rdp"])
    p.set_defaults(handler=commands.calibrate_subsampled_gaussian)

    p = cal.add_parser("adadpsyn", parents=[common], help="σ1 of AdaDPSyn (RDP, sampling w/o replacement)")
    _privacy_target(p)
    p.add_argument("--sampling-rate", type=_float, required=True, help="γ = M·N/n_y")
    p.add_argument("--steps", type=_int, required=True, help="T_max tokens")
    p.add_argument(
        "--labels-touched",
        type=_int,
        default=1,
        help="label runs one swap touches: 1 (the paper, label kept) or 2 (label changed)",
    )
    p.add_argument("--t-hat", type=_int, required=True, help="radius-reduction rounds T̂")
    p.add_argument("--sigma0", type=_float, required=True)
    p.add_argument("--sigma2", type=_float, required=True)
    p.add_argument("--theta", type=_float, default=0.1)
    p.add_argument("--grid", type=_float, default=0.01)
    p.set_defaults(handler=commands.calibrate_adadpsyn)

    p = cal.add_parser("mozo", parents=[common], help="the largest β of DPS-MOZO (RDP)")
    _privacy_target(p)
    p.add_argument("--sampling-rate", type=_float, required=True, help="q = n_shots/|D|")
    p.add_argument("--steps", type=_int, required=True, help="n_queries × T_max tokens")
    p.add_argument("--order", type=_float, required=True, help="Rényi order α")
    p.set_defaults(handler=commands.calibrate_mozo)

    eps = top.add_parser("epsilon", help="ε of a mechanism run").add_subparsers(
        dest="what", required=True, metavar="MECHANISM"
    )
    p = eps.add_parser("clip-blend", parents=[common], help="tightest valid ε and the paper's figure")
    p.add_argument("--clip", type=_float, required=True)
    p.add_argument("--subset-size", type=_int, required=True)
    p.add_argument("--temperature", type=_float, required=True)
    p.add_argument("--steps", type=_int, required=True)
    p.add_argument("--delta", type=_float, required=True)
    _relation(p, "add_remove: one prompt added or removed (the paper's); replace_one: ε0 doubles")
    p.set_defaults(handler=commands.epsilon_clip_blend)

    p = eps.add_parser("subsampled-gaussian", parents=[common], help="ε of Poisson-subsampled Gaussian steps")
    p.add_argument("--noise-multiplier", type=_float, required=True)
    p.add_argument("--sampling-rate", type=_float, required=True)
    p.add_argument("--steps", type=_int, required=True)
    p.add_argument("--delta", type=_float, required=True)
    _relation(p, "replace_one analyses the swapped record's coin directly (dp-accounting PLD)")
    p.add_argument("--accountant", default="auto", choices=["auto", "pld", "prv", "rdp"])
    p.set_defaults(handler=commands.epsilon_subsampled_gaussian)

    bud = top.add_parser("budget", help="create, charge and inspect a ledger").add_subparsers(
        dest="what", required=True, metavar="ACTION"
    )
    p = bud.add_parser("init", parents=[common], help="create a ledger file with a budget")
    p.add_argument("--ledger", required=True)
    _privacy_target(p)
    _relation(p, "the ledger's one relation; every charge is converted to it or refused")
    p.add_argument(
        "--privacy-unit",
        default=PER_RECORD,
        choices=list(PRIVACY_UNITS),
        help="what the relation changes: one record (default) or all records of one unit (a person); every charge "
        "must be made for it",
    )
    p.set_defaults(handler=commands.budget_init)

    p = bud.add_parser("spend", parents=[common], help="charge one pure-DP or (ε, δ)-DP event")
    p.add_argument("--ledger", required=True)
    p.add_argument(
        "--epsilon",
        "--pure-epsilon",
        dest="pure_epsilon",
        type=_float,
        required=True,
        help="ε of the event (with --delta: an (ε, δ)-DP event; without: pure ε-DP)",
    )
    p.add_argument("--delta", type=_float, default=None, help="δ of the event (omit for pure DP)")
    p.add_argument("--label", required=True)
    p.add_argument(
        "--neighbouring",
        default=None,
        choices=list(RELATIONS),
        help="the relation the event's ε holds under (default: the ledger's)",
    )
    p.add_argument(
        "--privacy-unit",
        default=PER_RECORD,
        choices=list(PRIVACY_UNITS),
        help="what the event's ε protects: one record (default) or all records of one unit; a ledger refuses "
        "another unit than its own",
    )
    p.set_defaults(handler=commands.budget_spend)

    p = bud.add_parser("show", parents=[common], help="spent, remaining and events per label")
    p.add_argument("--ledger", required=True)
    p.set_defaults(handler=commands.budget_show)

    synthesize.add_parser(top, common, _float, _int)
    answer.add_parser(top, common, _float, _int)
    plan.add_parser(top, common, _float, _int)
    bench.add_parsers(top, common, _float, _int)
    audit.add_parser(top, common, _int)
    isolation.add_parser(top, common, _int)
    return parser


def _relation(p: argparse.ArgumentParser, note: str) -> None:
    p.add_argument(
        "--neighbouring",
        default=DEFAULT_NEIGHBOURING,
        choices=list(RELATIONS),
        help=f"neighbouring relation (default {DEFAULT_NEIGHBOURING}); {note}",
    )


def _privacy_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epsilon", type=_float, required=True)
    p.add_argument("--delta", type=_float, required=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _emit(result: dict[str, Any], human: bool, stream: Any = None) -> None:
    stream = stream or sys.stdout
    if human:
        stream.write(_printable(commands.to_text(result)) + "\n")
    else:
        stream.write(json.dumps(_jsonable(result), sort_keys=True) + "\n")


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate from a file name


def _one_line(exc: BaseException) -> str:
    return _printable(" ".join(str(exc).split()) or type(exc).__name__)


def _option_names(parser: argparse.ArgumentParser, handler: Any) -> dict[str, str]:
    """The running subcommand's options (the one whose handler is ``handler``): each Python name
    (``public_label_counts``) and its flag (``--public-label-counts``), for names with an underscore (those
    that cannot be read as plain words)."""
    parsers, names = [parser], {}
    while parsers:
        current = parsers.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
        if current._defaults.get("handler") is handler:
            for action in current._actions:
                flags = [f for f in action.option_strings if f.startswith("--")]
                if flags and "_" in action.dest:
                    names[action.dest] = flags[0]
    return names


def _in_flags(message: str, names: dict[str, str]) -> str:
    """``message`` with the library's argument names written as the command line's flags."""
    return re.sub(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", lambda m: names.get(m.group(0), m.group(0)), message)


def _raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised (file name and line), for a bug report that quotes no data."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dp-icl``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on malformed arguments
    if any(isinstance(v, str) and "\x00" in v for v in vars(args).values()):
        parser.error("arguments cannot contain NUL characters")  # no file name can; open() would raise
    try:
        result = args.handler(args)
    except BudgetExhaustedError as exc:
        refusal = {
            "error": "BudgetExhaustedError",
            "message": str(exc),
            "committed": False,
            "requested_epsilon": exc.requested_epsilon,
            "remaining_epsilon": exc.remaining_epsilon,
        }
        _emit(refusal, args.human)
        print(f"dp-icl: refused: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REFUSED
    except (DPICLError, OSError) as exc:  # OSError: a path that cannot be read or written
        names = _option_names(parser, getattr(args, "handler", None))
        _emit({"error": type(exc).__name__, "message": _in_flags(str(exc), names)}, args.human)
        print(f"dp-icl: error: {_in_flags(_one_line(exc), names)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug: one line, and not its message, which could quote a private record
        where = _raised_at(exc)
        _emit({"error": type(exc).__name__, "message": f"unexpected error at {where}"}, args.human)
        print(f"dp-icl: unexpected error ({type(exc).__name__}): at {where}; please report it", file=sys.stderr)
        return 1
    _emit(result, args.human)
    return 1 if result.get("audit_failed") or result.get("failed") else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
