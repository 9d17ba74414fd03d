"""``dp-icl synthesize``: private records in, DP synthetic demonstrations (a DemoSet JSONL file) out.

The run is charged to a ledger file before any record is read by the model. The ledger must exist
(``dp-icl budget init``) unless ``--budget-epsilon``/``--budget-delta`` create it.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["METHOD_CHOICES", "add_parser", "synthesize"]

METHOD_CHOICES = ("tang", "pta")


def add_parser(top: Any, common: argparse.ArgumentParser, number: Any, integer: Any) -> None:
    p = top.add_parser("synthesize", parents=[common], help="DP synthetic demonstrations from a private file")
    p.add_argument("--method", required=True, choices=METHOD_CHOICES)
    p.add_argument("--data", required=True, help="private records: .csv (with a header) or .jsonl")
    p.add_argument("--text-column", required=True)
    p.add_argument("--label-column", required=True)
    p.add_argument("--labels", default=None, help="the public label set, comma-separated (default: the file's)")
    p.add_argument("--generate-for", default=None, help="labels to generate for, comma-separated (default: all)")
    p.add_argument("--model", required=True, help="a local Hugging Face causal LM directory, or 'ginc'")
    p.add_argument("--device", default="auto")
    p.add_argument("--epsilon", type=number, required=True, help="target ε of this synthesis")
    p.add_argument("--delta", type=number, default=None, help="target δ (default 1/min_y |D_y|)")
    p.add_argument("--ledger", required=True, help="the budget ledger file charged for the run")
    p.add_argument("--budget-epsilon", type=number, default=None, help="create the ledger with this ε")
    p.add_argument("--budget-delta", type=number, default=None, help="create the ledger with this δ")
    p.add_argument("--out", required=True, help="where the demonstrations go (JSONL)")
    p.add_argument("--template", default=None, help="agnews, trec, dbpedia, sst2, ginc (default: a plain layout)")
    p.add_argument("--n-prompts", type=integer, default=None, help="M (default 10)")
    p.add_argument("--records-per-prompt", type=integer, default=None, help="N (default 2)")
    p.add_argument("--max-tokens", type=integer, default=None, help="T (default 100)")
    p.add_argument("--shots-per-label", type=integer, default=None, help="demonstrations per label (default 1)")
    p.add_argument("--top-k", type=integer, default=None, help="public vocabulary size k (default 100)")
    p.add_argument("--top-p", type=number, default=None, help="adaptive vocabulary limit p (BA2/PA2)")
    p.add_argument("--alpha", type=number, default=None, help="PTA amplification α (default 1)")
    p.add_argument("--no-base", action="store_true", help="PTA without the base probability (PA3)")
    p.add_argument("--seed", type=integer, default=None, help="noise seed (tests and benchmarks only)")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.set_defaults(handler=synthesize)


def _labels(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _method(a: argparse.Namespace) -> Any:
    from dp_icl_plugin.errors import ConfigurationError
    from dp_icl_plugin.methods import PRESETS, PTASynthesizer, TangSynthesizer

    cls = {"tang": TangSynthesizer, "pta": PTASynthesizer}[a.method]
    settings: dict[str, Any] = {"epsilon": a.epsilon, "delta": a.delta}
    for name in ("n_prompts", "records_per_prompt", "max_tokens", "shots_per_label", "top_k", "top_p", "alpha"):
        if getattr(a, name) is not None:
            settings[name] = getattr(a, name)
    if a.no_base:
        settings["use_base"] = False
    if a.template is not None:
        if a.template not in PRESETS:
            raise ConfigurationError(f"unknown template {a.template!r}; choose from {sorted(PRESETS)}")
        settings["template"] = PRESETS[a.template]
    known = {f.name for f in dataclasses.fields(cls._config_type())}
    unsupported = sorted(set(settings) - known)
    if unsupported:
        raise ConfigurationError(f"--method {a.method} does not take {', '.join(unsupported)}")
    return cls(**settings)


def synthesize(a: argparse.Namespace) -> dict[str, Any]:
    from dp_icl_plugin.accounting import BudgetManager, PrivacyBudget
    from dp_icl_plugin.errors import ConfigurationError
    from dp_icl_plugin.methods.loading import load_dataset

    method = _method(a)  # config errors first: nothing read, nothing charged
    data = load_dataset(a.data, text_column=a.text_column, label_column=a.label_column, labels=_labels(a.labels))
    plan = method.plan(data, _labels(a.generate_for))
    if (a.budget_epsilon is None) != (a.budget_delta is None):
        raise ConfigurationError("give both --budget-epsilon and --budget-delta to create a ledger, or neither")
    ledger = Path(a.ledger)
    if a.budget_epsilon is None and not ledger.exists():
        raise ConfigurationError(f"no ledger at {ledger}: create it with `dp-icl budget init` or --budget-epsilon")
    budget_arg = None if a.budget_epsilon is None else PrivacyBudget(epsilon=a.budget_epsilon, delta=a.budget_delta)
    if a.model == "ginc":
        from dp_icl_plugin.ginc import load_model

        backend, _ = load_model(device=a.device)
    else:
        from dp_icl_plugin.backends.hf import HFBackend

        backend = HFBackend.from_pretrained(a.model, device=a.device)
    budget = BudgetManager(budget_arg, ledger=ledger)
    try:
        demos = method.synthesize(data, labels=plan.labels, backend=backend, budget=budget,
                                  rng=np.random.default_rng(a.seed), progress=a.progress or None)  # fmt: skip
        out = demos.save(a.out)
        spent, remaining = budget.spent(), budget.remaining()
    finally:
        budget.close()
    p = demos.provenance
    return {"out": str(out), "method": p.method, "demonstrations": len(demos), "labels": list(demos.labels),
            "epsilon": p.epsilon, "delta": p.delta, "ledger": str(ledger), "ledger_entry": p.ledger_entry_id,
            "noise_multiplier": p.extra.get("noise_multiplier"), "spent_epsilon": spent.epsilon,
            "remaining_epsilon": remaining.epsilon, "model": p.model_id}  # fmt: skip
