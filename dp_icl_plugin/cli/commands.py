"""Handlers of the ``dp-icl`` subcommands: each takes parsed arguments and returns a JSON-ready dict."""

from __future__ import annotations

import argparse
import math
from typing import Any

from dp_icl_plugin.accounting import calibration, events
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import get_accountant, tightest
from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.accounting.privacy import PrivacyBudget

__all__ = [
    "budget_init",
    "budget_show",
    "budget_spend",
    "calibrate_adadpsyn",
    "calibrate_mozo",
    "calibrate_subsampled_gaussian",
    "epsilon_clip_blend",
    "epsilon_subsampled_gaussian",
    "to_text",
]


def calibrate_subsampled_gaussian(a: argparse.Namespace) -> dict[str, Any]:
    r = calibration.calibrate_subsampled_gaussian(
        epsilon=a.epsilon,
        delta=a.delta,
        sampling_rate=a.sampling_rate,
        steps=a.steps,
        grid=a.grid,
        lo=a.lo,
        hi=a.hi,
        accountant=a.accountant,
        neighbouring=a.neighbouring,
    )
    return {
        "noise_multiplier": r.value,
        "epsilon": r.epsilon,
        "target_epsilon": a.epsilon,
        "delta": a.delta,
        "sampling_rate": a.sampling_rate,
        "steps": a.steps,
        "accountant": r.accountant,
        "sampling": "poisson",
        "neighbouring": a.neighbouring,
    }


def calibrate_adadpsyn(a: argparse.Namespace) -> dict[str, Any]:
    r = calibration.calibrate_adadpsyn(
        epsilon=a.epsilon,
        delta=a.delta,
        sampling_rate=a.sampling_rate,
        steps=a.steps,
        t_hat=a.t_hat,
        sigma0=a.sigma0,
        sigma2=a.sigma2,
        theta=a.theta,
        grid=a.grid,
        labels_touched=a.labels_touched,
    )
    return {
        "sigma1": r.value,
        "epsilon": r.epsilon,
        "target_epsilon": a.epsilon,
        "delta": a.delta,
        "accountant": r.accountant,
        "sampling": "without_replacement",
        "neighbouring": "replace_one",
        "labels_touched": a.labels_touched,
    }


def calibrate_mozo(a: argparse.Namespace) -> dict[str, Any]:
    target = me.mozo_rdp_target(epsilon=a.epsilon, delta=a.delta, order=a.order)
    r = calibration.calibrate_mozo(
        epsilon=a.epsilon, delta=a.delta, sampling_rate=a.sampling_rate, steps=a.steps, order=a.order
    )
    return {
        "beta": r.value,
        "rdp_target": target,
        "order": a.order,
        "epsilon": r.epsilon,
        "target_epsilon": a.epsilon,
        "delta": a.delta,
        "accountant": r.accountant,
        "sampling": "without_replacement",
        "neighbouring": "replace_one",
    }


def epsilon_clip_blend(a: argparse.Namespace) -> dict[str, Any]:
    event = me.clip_blend_event(
        clip=a.clip, subset_size=a.subset_size, temperature=a.temperature, steps=a.steps, neighbouring=a.neighbouring
    )
    bounds = tightest().epsilons(event, delta=a.delta)
    paper = me.clip_blend_paper_epsilon(
        clip=a.clip, subset_size=a.subset_size, temperature=a.temperature, steps=a.steps, delta=a.delta
    )
    eps0 = me.clip_blend_token_epsilon(
        clip=a.clip, subset_size=a.subset_size, temperature=a.temperature, neighbouring=a.neighbouring
    )
    # The full advanced-composition bound (Dwork, Rothblum & Vadhan 2010) at the same ε0.
    full_advanced = eps0 * math.sqrt(2 * a.steps * math.log(1 / a.delta)) + a.steps * eps0 * math.expm1(eps0)
    return {
        "epsilon": min(bounds.values()),
        "epsilon_advanced_composition": paper,
        "epsilon_full_advanced_composition": full_advanced,
        "epsilon_per_token": eps0,
        "bounds": bounds,
        "delta": a.delta,
        "neighbouring": a.neighbouring,
        "note": "epsilon_advanced_composition is the paper's figure (leading term only), not a guarantee",
    }


def epsilon_subsampled_gaussian(a: argparse.Namespace) -> dict[str, Any]:
    event = me.tang_event(
        noise_multiplier=a.noise_multiplier, sampling_rate=a.sampling_rate, steps=a.steps, neighbouring=a.neighbouring
    )
    acc = get_accountant(a.accountant)
    return {
        "epsilon": acc.epsilon(event, delta=a.delta),
        "delta": a.delta,
        "accountant": acc.name,
        "noise_multiplier": a.noise_multiplier,
        "sampling_rate": a.sampling_rate,
        "steps": a.steps,
        "neighbouring": a.neighbouring,
    }


def budget_init(a: argparse.Namespace) -> dict[str, Any]:
    budget = PrivacyBudget(a.epsilon, a.delta, neighbouring=a.neighbouring, privacy_unit=a.privacy_unit)
    manager = BudgetManager(budget, ledger=a.ledger)
    try:
        return {"ledger": a.ledger, **_summary(manager)}
    finally:
        manager.close()


def budget_spend(a: argparse.Namespace) -> dict[str, Any]:
    manager = BudgetManager.open(a.ledger)
    try:
        tag = {"neighbouring": a.neighbouring or manager.neighbouring, "privacy_unit": a.privacy_unit}
        event: events.DPEvent = (
            events.PureDPEvent(a.pure_epsilon, **tag)
            if a.delta is None
            else events.ApproxDPEvent(a.pure_epsilon, a.delta, **tag)
        )
        entry = manager.spend(event, label=a.label)
        return {
            "committed": True,
            "entry_id": entry.id,
            "label": entry.label,
            "event": event.to_dict(),
            "certified_epsilon": entry.certified_epsilon,
            "ledger": a.ledger,
        }
    finally:
        manager.close()


def budget_show(a: argparse.Namespace) -> dict[str, Any]:
    manager = BudgetManager.open(a.ledger)
    try:
        return {"ledger": a.ledger, **_summary(manager)}
    finally:
        manager.close()


def _summary(manager: BudgetManager) -> dict[str, Any]:
    spent, remaining = manager.spent(), manager.remaining()
    counts = manager.label_counts()
    return {
        "budget": {"epsilon": manager.budget.epsilon, "delta": manager.budget.delta},
        "neighbouring": manager.neighbouring,
        "privacy_unit": manager.privacy_unit,
        # ε is certified at the ledger's one δ: there is no "δ spent" or "δ remaining" apart from it
        "spent": {"epsilon": spent.epsilon, "at_delta": spent.delta},
        "remaining": {"epsilon": remaining.epsilon, "at_delta": remaining.delta},
        "events": sum(counts.values()),
        "events_per_label": dict(sorted(counts.items())),
    }


def _significant(value: float, *, up: bool, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits, rounded up or down (never the other way)."""
    if value == 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(value))))
    rounded = (math.ceil if up else math.floor)(value * scale) / scale
    return float(f"{rounded:.{digits}g}")


def _certified(name: str, value: dict[str, Any]) -> str | None:
    """``spent``/``remaining`` in one line: ε to 4 digits rounded against the user (spent up, remaining down),
    at the ledger's δ; None for any other entry."""
    if name not in ("spent", "remaining") or set(value) != {"epsilon", "at_delta"}:
        return None
    shown = _significant(value["epsilon"], up=name == "spent")  # the JSON output (no --human) has every digit
    return f"{name}: epsilon {shown:g} at delta {value['at_delta']:g}"


def to_text(result: dict[str, Any], indent: str = "") -> str:
    """Readable rendering of a command's result for ``--human``."""
    lines = []
    for key, value in result.items():
        name = key.replace("_", " ")
        line = _certified(key, value) if isinstance(value, dict) else None
        if line is not None:
            lines.append(indent + line)
        elif isinstance(value, dict):
            lines.append(f"{indent}{name}:")
            lines.append(to_text(value, indent + "  ") if value else f"{indent}  (none)")
        elif isinstance(value, float):
            lines.append(f"{indent}{name}: {value:.6g}")
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            lines.append(f"{indent}{name}:")  # one block a row (dp-icl answer's answers)
            for number, item in enumerate(value, 1):
                lines.append(f"{indent}  {number}.")
                lines.append(to_text(item, indent + "    "))
        else:
            lines.append(f"{indent}{name}: {value}")
    return "\n".join(lines)
