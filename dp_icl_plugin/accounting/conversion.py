"""Converting an event to a ledger's neighbouring relation: a direct analysis, a stated conversion, or a refusal.

Replace-one is add/remove twice (remove the old record, add the new one), so every add/remove guarantee
converts to replace-one; the other way has no valid conversion (a mechanism may publish |D| exactly: 0-DP
under replace-one, not DP at all under add/remove), and :func:`to_relation` refuses it with
:class:`~dp_icl_plugin.errors.UnsupportedEventError`.

add/remove → replace-one, atom by atom (compositions convert their atoms; adaptive composition under
replace-one then adds them up):

- Gaussian with sensitivity Δ: sensitivity 2Δ (triangle inequality), i.e. the noise multiplier halves.
  Exact for a Gaussian; methods that know a smaller replace-one sensitivity build that event directly.
- Pure ε (and an ε0-bounded-range exponential mechanism): 2ε (group privacy; log-ratios, and their
  range, add up along D → D∖{x} → D' ).
- (ε, δ): (2ε, (1 + e^ε)·δ), chaining P(S) ≤ e^ε·Q(S) + δ ≤ e^ε(e^ε·R(S) + δ) + δ (group privacy of
  size 2); refused when that δ reaches 1.
- Poisson subsampling: the same event analysed for replace-one (the direct analysis: the replaced record
  keeps the other's coin; ``events.PoissonSampledEvent``).
- An RDP curve ε(·): the weak triangle inequality (Mironov 2017, Prop. 11) through D∖{x}:
  D_α(P‖R) ≤ (α − 1/p)/(α − 1) · D_{pα}(P‖Q) + D_{q(α−1/p)}(Q‖R) for 1/p + 1/q = 1, minimised over a grid
  of p (:func:`~dp_icl_plugin.accounting.rdp.weak_triangle`), and D_∞ doubled.
- A filtered-release record costs nothing; it is retagged (its covering charge converts on its own).

An event's privacy unit (``events.DPEvent.privacy_unit``) is kept: replacing all of one unit's records is removing
that unit and adding another, so the same conversions hold per unit.
"""

from __future__ import annotations

import math

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, REPLACE_ONE, check_relation
from dp_icl_plugin.errors import UnsupportedEventError

__all__ = ["group_of_two_delta", "to_relation"]


def to_relation(event: ev.DPEvent, relation: str) -> ev.DPEvent:
    """``event`` analysed under ``relation``: itself, or its stated conversion (see the module docstring).

    Args:
        event: the event.
        relation: the ledger's relation.

    Raises:
        UnsupportedEventError: no valid conversion (replace-one → add/remove, or a useless δ).
        ConfigurationError: ``relation`` names no relation.
    """
    relation = check_relation(relation)
    if event.neighbouring == relation:
        return event
    if relation == ADD_REMOVE:
        raise UnsupportedEventError(
            f"a {event.type_name!r} event analysed for replace-one neighbours cannot be charged to an "
            "add/remove ledger: no guarantee for adding or removing a record follows from one for replacing "
            "it. Use a replace-one ledger (the default) to hold it."
        )
    if isinstance(event, ev.SelfComposedEvent):
        return ev.SelfComposedEvent(to_relation(event.event, relation), event.count)
    if isinstance(event, ev.ComposedEvent):
        return ev.ComposedEvent(tuple(to_relation(e, relation) for e in event.events))
    converted = _atom_to_replace_one(event)  # the same math per unit: replacing a unit is removing it, adding another
    return ev.with_privacy_unit(converted, event.privacy_unit)


def group_of_two_delta(epsilon: float, delta: float) -> float:
    """δ of group privacy over two steps, (1 + e^ε)·δ, rounded up: ``exp`` (≤ 1 ulp off in IEEE libms), the sum
    and the product (½ ulp each) round to nearest, so three steps up bound the exact value from above. ε ≥ 700
    (e^ε past the floats) gives inf.

    Args:
        epsilon: ε of the add/remove guarantee.
        delta: δ of the add/remove guarantee.
    """
    if epsilon >= 700:
        return math.inf
    value = (1.0 + math.exp(epsilon)) * delta
    for _ in range(3):
        value = math.nextafter(value, math.inf)
    return value


def _atom_to_replace_one(event: ev.DPEvent) -> ev.DPEvent:
    tag = {"neighbouring": REPLACE_ONE}
    if isinstance(event, ev.GaussianEvent):
        return ev.GaussianEvent(event.noise_multiplier / 2.0, 2.0 * event.sensitivity, **tag)
    if isinstance(event, ev.PureDPEvent):
        return ev.PureDPEvent(2.0 * event.epsilon, **tag)
    if isinstance(event, ev.ExponentialMechanismEvent):
        return ev.ExponentialMechanismEvent(2.0 * event.epsilon, **tag)
    if isinstance(event, ev.ApproxDPEvent):
        delta = group_of_two_delta(event.epsilon, event.delta)
        if not delta < 1.0:
            raise UnsupportedEventError(
                f"group privacy turns ({event.epsilon}, {event.delta})-DP under add/remove into a δ of "
                f"{delta:.3g} under replace-one: no guarantee"
            )
        return ev.ApproxDPEvent(2.0 * event.epsilon, delta, **tag)
    if isinstance(event, ev.PoissonSampledEvent):
        return ev.PoissonSampledEvent(event.sampling_rate, event.event, **tag)
    if isinstance(event, ev.FilteredReleaseEvent):
        return ev.FilteredReleaseEvent(event.per_unit, event.covered_by, **tag)
    if isinstance(event, ev.RDPCurveEvent):
        return _curve_to_replace_one(event)
    raise UnsupportedEventError(f"no conversion of {event.type_name!r} events to replace-one neighbours")


def _curve_to_replace_one(event: ev.RDPCurveEvent) -> ev.RDPCurveEvent:
    orders = np.asarray(rdp.DEFAULT_ORDERS, dtype=float)
    converted = rdp.weak_triangle(orders, lambda a: rdp.event_rdp_at(event, a))
    keep = np.isfinite(converted)
    if not keep.any():
        raise UnsupportedEventError("the RDP curve is too short for the weak triangle inequality at any order")
    return ev.RDPCurveEvent(
        tuple(orders[keep].tolist()),
        tuple(converted[keep].tolist()),
        2.0 * event.epsilon_inf,
        neighbouring=REPLACE_ONE,
    )
