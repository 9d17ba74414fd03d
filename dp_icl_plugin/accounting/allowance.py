"""Allowances: a share of the ledger charged once, then spent release by release with the ledger as a privacy filter.

**What it is.** An allowance is one ledger entry, its *cover*, labelled ``<component>-allowance@<orders>:<owner>``
(:func:`allowance_label`): an
(ε, δ)-DP event under the ledger's own relation and privacy unit, composed with everything else the ledger holds.
Each release it pays for is then committed as a
:class:`~dp_icl_plugin.accounting.events.FilteredReleaseEvent` naming that cover (``covered_by``), labelled
``<component>-<kind>:<owner>``, whose ``per_unit`` is the release's own event. Such a *draw* costs the ledger
nothing more; it is admitted, in the transaction of its commit, only if the RDP of every draw already committed
under the cover plus its own fits the cover's caps (:func:`admits`). A draw that does not fit is refused
(:class:`~dp_icl_plugin.errors.AllowanceSpentError`) and nothing is committed. So the number of releases, and
which ones, may depend on what was released before (an answer that stops at its end-of-sequence token pays
for the tokens it ran, not its limit): fully adaptive composition.

**Why the total holds.** The draws under one cover are a privacy filter (Rogers et al. 2016): each release's
event may be chosen after seeing earlier outputs, and the sequence is halted before a release that would pass
the caps. Feldman & Zrnic 2021 (Thm. 3.1 with one individual; their filter is stated for any relation whose
per-step RDP bounds hold) show such a sequence is (α, B)-RDP when B caps the RDP sum at one order α fixed in
advance. The caps are those of :class:`~dp_icl_plugin.accounting.individual_filter.IndividualBudget` at
the orders the cover's label fixes (the 19 :data:`~dp_icl_plugin.accounting.individual_filter.FILTER_ORDERS`;
for DPS-MOZO one order, ⌊α⌋, as its token is analysed at orders up to α only), with the cover's δ split evenly
over them (no approximate-δ share: draws must be RDP). With one order this is Feldman & Zrnic's filter itself.
With m orders a draw is admitted when it fits at *some* order: put each transcript in the group of the order at
which its last admitted draw fit; within a group the filter admits and refuses exactly as the single-order filter
of that order, which is (α_k, B_k)-RDP, so (ε, δ/m)-DP; the m groups give (ε, δ), exactly the cover (the argument
of :mod:`~dp_icl_plugin.accounting.individual_filter`). A refused draw runs nothing (a skip, not a halt): its
refusal depends on earlier draws' events only, a predictable step of the transcript.

The filtered interaction runs interleaved with the ledger's other releases. Concurrent composition of interactive
mechanisms (Vadhan & Wang 2021; Lyu 2022; Vadhan & Zhang 2023, which also covers composing it through f-DP/PLD
with the ledger's Gaussian charges; Haney et al. 2023 for filters beside concurrent mechanisms) lets the ledger
compose the cover as one (ε, δ) event, as it does the cover of a private index's per-record filter.

**Concurrent answers.** The filter argument takes the draws in one sequence, each chosen from the outputs before
it. Two answers drawing on one allowance at once would let one answer's speed (which depends on the records it
reads) decide where the other is cut; :mod:`~dp_icl_plugin.decoding.pay_as_you_go` therefore runs the answers
of an allowance one at a time in a process, and an allowance must be drawn on by one process at a time.

**What stays public.** The admission depends only on the events of earlier draws (the parameters of released
mechanisms), never on private data. The cover's ε and δ are the caller's.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.accounting.individual_filter import FILTER_ORDERS, IndividualBudget, admissible
from dp_icl_plugin.errors import ConfigurationError, DPICLError

__all__ = [
    "ALLOWANCE_SUFFIX",
    "admits",
    "allowance_budget",
    "allowance_label",
    "allowance_orders",
    "allowance_owner",
    "draw_cost",
    "drawn",
    "epsilon_spent",
]

ALLOWANCE_SUFFIX = "-allowance"
"""An allowance's cover is labelled ``<component>-allowance:<owner>``; its draws ``<component>-<kind>:<owner>``."""


def allowance_label(component: str, owner: str, orders: tuple[float, ...] = FILTER_ORDERS) -> str:
    """The label of an allowance's cover, ``<component>-allowance@<α1>,<α2>,…:<owner>``: the filter's orders are
    written into it, so that they are fixed with the cover before any draw (a later default cannot change them).

    Args:
        component: the component (e.g. ``"mozo"``).
        owner: the allowance's name.
        orders: the filter's Rényi orders.
    """
    return f"{component}{ALLOWANCE_SUFFIX}@{','.join(repr(float(a)) for a in orders)}:{owner}"


def allowance_owner(label: str) -> tuple[str, str] | None:
    """(component, owner) of an allowance cover's label (:func:`allowance_label`), or None if it is not one.

    Args:
        label: a ledger entry's label.
    """
    parsed = _parse(label)
    return None if parsed is None else (parsed[0], parsed[1])


def allowance_orders(label: str) -> tuple[float, ...]:
    """The filter orders an allowance cover's label fixes (:func:`allowance_label`).

    Args:
        label: the cover's label.

    Raises:
        ConfigurationError: not an allowance's label, or orders that are no valid set of Rényi orders.
    """
    parsed = _parse(label)
    if parsed is None:
        raise ConfigurationError(f"{label!r} is not an allowance's cover")
    return parsed[2]


def _parse(label: str) -> tuple[str, str, tuple[float, ...]] | None:
    head, colon, owner = label.partition(":")
    head, at, listed = head.partition("@")
    component = head.removesuffix(ALLOWANCE_SUFFIX)
    if not colon or not owner or not component or component == head or not at or not listed:
        return None
    try:
        orders = tuple(check.order("orders[i]", float(x)) for x in listed.split(","))
    except (ValueError, ConfigurationError):
        raise ConfigurationError(f"allowance {label!r}: its orders are not Rényi orders") from None
    if len(set(orders)) != len(orders):
        raise ConfigurationError(f"allowance {label!r}: repeated orders")
    return component, owner, orders


def allowance_budget(
    cover: ev.DPEvent, neighbouring: str, orders: tuple[float, ...] = FILTER_ORDERS
) -> IndividualBudget:
    """The filter an allowance's cover holds: its (ε, δ) at ``orders`` (δ split evenly over them), no
    approximate-δ share.

    Args:
        cover: the cover entry's event.
        neighbouring: the ledger's relation (the cover must hold under it).
        orders: the filter's orders (:func:`allowance_orders` of the cover's label).

    Raises:
        ConfigurationError: ``cover`` is not an (ε, δ) event under ``neighbouring``, or its ε is too small for
            its δ at every order.
    """
    if not isinstance(cover, ev.ApproxDPEvent) or cover.neighbouring != neighbouring:
        raise ConfigurationError(
            "an allowance's cover is an (epsilon, delta) event under the ledger's relation "
            f"({neighbouring}); got a {cover.type_name} event under {cover.neighbouring}"
        )
    return _budget(cover.epsilon, cover.delta, tuple(orders))


@lru_cache(maxsize=256)
def _budget(epsilon: float, delta: float, orders: tuple[float, ...]) -> IndividualBudget:
    return IndividualBudget(epsilon, delta, approximate_delta=0.0, orders=orders)


def draw_cost(per_unit: ev.DPEvent, neighbouring: str, orders: tuple[float, ...]) -> np.ndarray:
    """The RDP curve of one draw's ``per_unit`` event under ``neighbouring``, at ``orders``.

    Args:
        per_unit: what the draw's release costs.
        neighbouring: the cover's relation.
        orders: the filter's orders.

    Raises:
        ConfigurationError: the event has no RDP analysis under that relation (a draw must be RDP).
    """
    try:
        return _draw_cost(per_unit, neighbouring, orders)
    except DPICLError as exc:
        raise ConfigurationError(
            f"an allowance pays for RDP releases only: {per_unit.type_name} under {neighbouring} has no RDP "
            f"analysis ({exc}); nothing was committed"
        ) from None


@lru_cache(maxsize=1024)
def _draw_cost(per_unit: ev.DPEvent, neighbouring: str, orders: tuple[float, ...]) -> np.ndarray:
    curve = rdp.event_rdp(to_relation(per_unit, neighbouring), orders)
    curve.setflags(write=False)
    return curve


def drawn(counts: Counter[str], cover_id: int, neighbouring: str, orders: tuple[float, ...]) -> np.ndarray:
    """The RDP every committed draw under cover entry ``cover_id`` has spent, at ``orders``.

    Args:
        counts: the ledger's committed charges per event key (one transaction's snapshot).
        cover_id: the cover's entry id.
        neighbouring: the cover's relation.
        orders: the filter's orders.
    """
    spent = np.zeros(len(orders))
    for key, n in counts.items():
        for per_unit, times in _draws_in(key, cover_id):
            spent = spent + (n * times) * _draw_cost(per_unit, neighbouring, orders)
    return spent


@lru_cache(maxsize=4096)
def _draws_in(key: str, cover_id: int) -> tuple[tuple[ev.DPEvent, int], ...]:
    """The draws under ``cover_id`` in the event stored as ``key``, with their counts (keys never change)."""
    if "filtered_release" not in key:  # most entries: no need to parse
        return ()
    atoms = ev.atoms(ev.event_from_dict(json.loads(key)))
    return tuple(
        (a.per_unit, c) for a, c in atoms.items() if isinstance(a, ev.FilteredReleaseEvent) and a.covered_by == cover_id
    )


def admits(budget: IndividualBudget, spent: np.ndarray, cost: np.ndarray) -> bool:
    """Whether a draw of RDP ``cost`` fits after ``spent`` (at some order, within the margin the filter keeps).

    Args:
        budget: the allowance's filter (:func:`allowance_budget`).
        spent: the RDP drawn so far.
        cost: the new draw's RDP.
    """
    return bool(admissible(budget, spent[None, :], np.zeros(1), cost, 0.0)[0])


def epsilon_spent(budget: IndividualBudget, spent: np.ndarray, *, capped: bool = True) -> float:
    """The ε (at the cover's δ) of RDP ``spent``: the least over orders of the conversion at δ/m (what the filter
    could still certify if it halted now); 0 for nothing.

    Args:
        budget: the allowance's filter.
        spent: RDP at its orders (the draws so far, or a draw's own).
        capped: at most the allowance's ε (what admitted draws can have used); False for a refused draw's figures.
    """
    if not spent.any():
        return 0.0
    eps, _ = rdp.rdp_to_epsilon(budget.orders, spent, budget.conversion_delta / len(budget.orders))
    return min(eps, budget.epsilon) if capped else eps
