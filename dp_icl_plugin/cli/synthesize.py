"""``dp-icl synthesize``: private records in, DP synthetic demonstrations (a DemoSet JSONL file) out.

The run is charged to a ledger file before any record is read by the model. The ledger must exist
(``dp-icl budget init``) unless ``--budget-epsilon``/``--budget-delta`` create it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dp_icl_plugin import (
    ANSWER_PRESETS,
    PRESETS,
    AdaDPSynSynthesizer,
    ClipBlendSynthesizer,
    MozoOfflineSynthesizer,
    PTASynthesizer,
    TangAnswerSynthesizer,
    TangSynthesizer,
)
from dp_icl_plugin._progress import report_lines_off_a_terminal
from dp_icl_plugin.accounting import BudgetManager, PrivacyBudget
from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.loading import load_backend
from dp_icl_plugin.data.files import load_dataset, read_rows
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc import load_model

__all__ = ["METHOD_CHOICES", "add_parser", "synthesize"]

METHOD_CHOICES = ("tang", "pta", "adadpsyn", "clip-blend", "mozo-offline", "tang-answers")
ANSWERING = ("mozo-offline", "tang-answers")  # methods that answer public inputs (free-text demonstrations)

# CLI option -> config field; a method refuses the options its config does not have.
_SETTINGS = (
    "n_prompts",
    "records_per_prompt",
    "max_tokens",
    "shots_per_label",
    "top_k",
    "top_p",
    "alpha",
    "t_hat",
    "sigma0",
    "sigma2",
    "lam",
    "clip",
    "subset_size",
    "n_shots",
    "order",
    "population",
)


def add_parser(top: Any, common: argparse.ArgumentParser, number: Any, integer: Any) -> None:
    p = top.add_parser("synthesize", parents=[common], help="DP synthetic demonstrations from a private file")
    p.add_argument("--method", required=True, choices=METHOD_CHOICES)
    p.add_argument("--data", required=True, help="private records: .csv (with a header) or .jsonl")
    p.add_argument("--text-column", required=True)
    p.add_argument("--label-column", required=True)
    p.add_argument("--labels", default=None, help="the public label set, comma-separated (default: the file's)")
    p.add_argument("--generate-for", default=None, help="labels to generate for, comma-separated (default: all)")
    p.add_argument(
        "--public-label-counts",
        default=None,
        help="label sizes declared public, 'label=size,...' or 'observed' (publishes the file's "
        "counts); tang, pta, adadpsyn and clip-blend size their sampling by them",
    )
    p.add_argument(
        "--unit-column",
        default=None,
        help="the column of each record's privacy unit (a person): with a unit-level ledger every method samples "
        "units and bounds each unit's contribution",
    )
    p.add_argument(
        "--public-unit-counts",
        default=None,
        help="units per label declared public, 'label=units,...' or 'observed' (publishes the file's counts); "
        "unit-level tang, pta, adadpsyn and clip-blend sample units by them",
    )
    p.add_argument(
        "--records-per-unit", type=integer, default=1, help="the most records of one unit in one prompt (default 1)"
    )
    p.add_argument(
        "--labels-per-unit",
        type=integer,
        default=None,
        help="the most labels one unit takes part in (default: every label generated; each costs a label's run)",
    )
    p.add_argument(
        "--public-inputs",
        default=None,
        help="mozo-offline, tang-answers: public inputs (.txt, one per line, or .csv/.jsonl with --input-column)",
    )
    p.add_argument("--input-column", default=None, help="the column of --public-inputs in a .csv/.jsonl file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--model",
        help="a local Hugging Face causal LM directory, a .gguf file, a named model "
        "('smollm2-135m-instruct'), or 'ginc'",
    )
    where.add_argument(
        "--server",
        help="an OpenAI-compatible inference server's URL (vLLM started with --max-logprobs -1); needs --tokenizer",
    )
    p.add_argument("--tokenizer", default=None, help="--server: the served model's folder, .gguf file or name")
    p.add_argument(
        "--server-top-k",
        type=integer,
        default=None,
        help="--server: ask for the top k log-probabilities only (default: the full vocabulary)",
    )
    p.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="--server: allow plain http to a host other than this machine",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--epsilon", type=number, required=True, help="target ε of this synthesis")
    p.add_argument("--delta", type=number, default=None, help="target δ (default: the ledger's δ)")
    p.add_argument("--ledger", required=True, help="the budget ledger file charged for the run")
    p.add_argument("--budget-epsilon", type=number, default=None, help="create the ledger with this ε")
    p.add_argument("--budget-delta", type=number, default=None, help="create the ledger with this δ")
    p.add_argument(
        "--neighbouring",
        default=None,
        choices=["replace_one", "add_remove"],
        help="the relation of a ledger created here (default replace_one)",
    )
    p.add_argument(
        "--privacy-unit",
        default=None,
        choices=["record", "unit"],
        help="the privacy unit of a ledger created here (default: unit with --unit-column, else record)",
    )
    p.add_argument("--out", required=True, help="where the demonstrations go (JSONL)")
    p.add_argument(
        "--template",
        default=None,
        help="a preset: agnews, trec, dbpedia, sst2, ginc; for mozo-offline and tang-answers "
        "classification, ginc, e2e, samsum (default: a plain layout)",
    )
    g = p.add_argument_group("method settings (each method takes those of its config)")
    g.add_argument("--n-prompts", type=integer, default=None, help="M (tang, pta, adadpsyn, tang-answers)")
    g.add_argument("--records-per-prompt", type=integer, default=None, help="N (tang, pta, adadpsyn, tang-answers)")
    g.add_argument(
        "--population",
        type=integer,
        default=None,
        help="tang-answers: the number of records declared public (q = M·N/n); needed under add/remove",
    )
    g.add_argument("--max-tokens", type=integer, default=None, help="T, tokens per demonstration")
    g.add_argument("--shots-per-label", type=integer, default=None, help="demonstrations per label")
    g.add_argument("--top-k", type=integer, default=None, help="public vocabulary size k")
    g.add_argument("--top-p", type=number, default=None, help="adaptive vocabulary limit p (BA2/PA2/PA3)")
    g.add_argument("--alpha", type=number, default=None, help="PTA amplification α")
    g.add_argument("--no-base", action="store_true", help="PTA without the base probability (PA3)")
    g.add_argument("--t-hat", type=integer, default=None, help="AdaDPSyn radius-reduction rounds T̂")
    g.add_argument("--sigma0", type=number, default=None, help="AdaDPSyn GoodRadius noise σ0")
    g.add_argument("--sigma2", type=number, default=None, help="AdaDPSyn coverage-count noise σ2")
    g.add_argument("--lam", type=number, default=None, help="AdaDPSyn margin λ")
    g.add_argument("--clip", type=number, default=None, help="clip-blend logit clip c")
    g.add_argument("--subset-size", type=integer, default=None, help="clip-blend fixed divisor s")
    g.add_argument("--n-shots", type=integer, default=None, help="MOZO records per token")
    g.add_argument("--order", type=number, default=None, help="MOZO Rényi order α")
    p.add_argument("--seed", type=integer, default=None, help="noise seed (tests and benchmarks only)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        action="store_true",
        help="a progress bar on stderr even off a terminal (default: a bar on a terminal, a line every 30 s elsewhere)",
    )
    shown.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=synthesize)


def _labels(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _label_counts(text: str | None, flag: str) -> dict[str, int] | str | None:

    if text is None or text.strip() == "observed":
        return None if text is None else "observed"
    counts: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.rpartition("=")
        if not sep or not name.strip() or not size.strip().isdigit():
            raise ConfigurationError(f"{flag} takes 'label=size,...' or 'observed'")
        counts[name.strip()] = int(size)
    return counts


def _method(a: argparse.Namespace, delta: float) -> Any:

    classes: dict[str, Any] = {
        "tang": TangSynthesizer,
        "pta": PTASynthesizer,
        "adadpsyn": AdaDPSynSynthesizer,
        "clip-blend": ClipBlendSynthesizer,
        "mozo-offline": MozoOfflineSynthesizer,
        "tang-answers": TangAnswerSynthesizer,
    }
    cls = classes[a.method]
    settings: dict[str, Any] = {"epsilon": a.epsilon, "delta": delta}
    settings.update({name: getattr(a, name) for name in _SETTINGS if getattr(a, name) is not None})
    if a.no_base:
        settings["use_base"] = False
    if a.template is not None:
        presets = ANSWER_PRESETS if a.method in ANSWERING else PRESETS
        if a.template not in presets:
            raise ConfigurationError(f"unknown template {a.template!r} for {a.method}; choose from {sorted(presets)}")
        settings["template"] = presets[a.template]
    known = {f.name for f in dataclasses.fields(cls.config_type)}
    unsupported = sorted(set(settings) - known)
    if unsupported:
        flags = ", ".join("--no-base" if n == "use_base" else "--" + n.replace("_", "-") for n in unsupported)
        raise ConfigurationError(f"--method {a.method} does not take {flags}")
    return cls(**settings)


def _public_inputs(a: argparse.Namespace) -> list[str] | None:

    if a.method not in ANSWERING:
        if a.public_inputs is not None:
            raise ConfigurationError("--public-inputs is for --method mozo-offline or tang-answers")
        return None
    if a.public_inputs is None:
        raise ConfigurationError(f"--method {a.method} needs --public-inputs (the public inputs to answer)")
    path = Path(a.public_inputs)
    if path.suffix.lower() == ".txt":
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read {path}: {type(exc).__name__}") from None
        return [line for line in lines if line.strip()]
    if a.input_column is None:
        raise ConfigurationError("--public-inputs in a .csv/.jsonl file needs --input-column")
    return [row[0] for row in read_rows(path, [a.input_column])]


def _check_out(path: Path) -> None:
    """Refuse an output path that cannot be written before the run is charged (else the charge buys nothing)."""

    if path.is_dir():
        raise ConfigurationError(f"--out {path} is a folder; give a file path")
    parent = next(p for p in path.absolute().parents if p.exists())  # save() creates the missing folders
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigurationError(f"--out {path}: cannot create a file under {parent}")


def _interrupted(budget: Any, label: str, charged_before: int) -> None:
    """Say on stderr what an interrupted run leaves: its charge stands when it was made (never refunded;
    the demonstrations under way are not written, being unfinished)."""
    if budget.label_counts().get(label, 0) > charged_before:
        entry = [e for e in budget.history() if e.label == label][-1]
        message = (
            f"dp-icl: interrupted after the charge: ledger entry {entry.id} ({label}) stands, never refunded; "
            "nothing was written (a shorter run: fewer --max-tokens or --shots-per-label)"
        )
        print(message, file=sys.stderr)
    else:
        print("dp-icl: interrupted before the charge: nothing was charged or written", file=sys.stderr)


def synthesize(a: argparse.Namespace) -> dict[str, Any]:

    _check_out(Path(a.out))
    if (a.budget_epsilon is None) != (a.budget_delta is None):
        raise ConfigurationError("give both --budget-epsilon and --budget-delta to create a ledger, or neither")
    ledger = Path(a.ledger)
    if a.budget_epsilon is None and not ledger.exists():
        raise ConfigurationError(f"no ledger at {ledger}: create it with `dp-icl budget init` or --budget-epsilon")
    if a.budget_epsilon is None and (a.neighbouring is not None or a.privacy_unit is not None):
        raise ConfigurationError(
            "--neighbouring and --privacy-unit set the relation of a ledger created with --budget-epsilon"
        )
    relation = a.neighbouring or "replace_one"
    unit = a.privacy_unit or ("unit" if a.unit_column is not None else "record")
    budget_arg = (
        None
        if a.budget_epsilon is None
        else PrivacyBudget(epsilon=a.budget_epsilon, delta=a.budget_delta, neighbouring=relation, privacy_unit=unit)
    )
    if ledger.exists():  # its own relation and δ (a different --budget-* is refused when it is opened below)
        existing = BudgetManager.open(ledger)
        relation, delta, unit = existing.neighbouring, existing.budget.delta, existing.privacy_unit
        existing.close()
    else:
        assert budget_arg is not None
        delta = budget_arg.delta
    if (unit == "unit") != (a.unit_column is not None):
        raise ConfigurationError(
            "a unit-level ledger needs --unit-column (each record's unit)"
            if unit == "unit"
            else f"--unit-column is for a unit-level ledger; the ledger {ledger} is record-level (its units would be "
            "ignored): create a ledger with --privacy-unit unit"
        )
    delta = a.delta if a.delta is not None else delta
    if (a.server is None) != (a.tokenizer is None and a.server_top_k is None and not a.allow_insecure_http):
        raise ConfigurationError(
            "--server needs --tokenizer; --tokenizer, --server-top-k and --allow-insecure-http apply to --server only"
        )
    method = _method(a, delta)  # config errors before any private record is read, nothing charged
    inputs = _public_inputs(a)
    counts = _label_counts(a.public_label_counts, "--public-label-counts")
    data = load_dataset(
        a.data,
        text_column=a.text_column,
        label_column=a.label_column,
        unit_column=a.unit_column,
        labels=_labels(a.labels),
        public_label_counts=counts,
        public_unit_counts=_label_counts(a.public_unit_counts, "--public-unit-counts"),
        records_per_unit=a.records_per_unit,
        labels_per_unit=a.labels_per_unit,
    )
    plan = method.plan(data, _labels(a.generate_for), public_inputs=inputs, neighbouring=relation, privacy_unit=unit)
    backend: NextTokenBackend
    if a.model == "ginc":
        backend, _ = load_model(device=a.device)
    elif a.server is not None:
        backend = load_backend(
            a.server, tokenizer=a.tokenizer, top_k=a.server_top_k, allow_insecure_http=a.allow_insecure_http
        )
    else:
        rows = method.step_rows  # public settings: a forward of the rows a token step computes
        backend = HFBackend.from_pretrained(
            a.model, device=a.device, **({} if rows is None else {"micro_batch_size": rows})
        )
    budget = BudgetManager(budget_arg, ledger=ledger)
    report_lines_off_a_terminal(not a.no_progress)
    progress = False if a.no_progress else (True if a.progress else None)
    try:
        labels = None if inputs is not None else plan.labels
        charged_before = budget.label_counts().get(f"{method.name}:synthesize", 0)
        try:
            demos = method.synthesize(
                data,
                labels=labels,
                public_inputs=inputs,
                backend=backend,
                budget=budget,
                rng=np.random.default_rng(a.seed),
                progress=progress,
            )
        except KeyboardInterrupt:
            _interrupted(budget, f"{method.name}:synthesize", charged_before)
            raise
        out = demos.save(a.out)
        spent, remaining = budget.spent(), budget.remaining()
    finally:
        budget.close()
    p = demos.provenance
    return {
        "out": str(out),
        "method": p.method,
        "demonstrations": len(demos),
        "labels": list(demos.labels),
        "epsilon": p.epsilon,
        "delta": p.delta,
        "ledger": str(ledger),
        "ledger_entry": p.ledger_entry_id,
        "parameters": {k: v for k, v in p.extra.items() if isinstance(v, (int, float, str)) or v is None},
        "spent_epsilon": spent.epsilon,
        "remaining_epsilon": remaining.epsilon,
        "model": p.model_id,
    }
