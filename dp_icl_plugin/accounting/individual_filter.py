"""Individual Rényi privacy filters: each record (or person) keeps its own privacy spend.

Feldman & Zrnic 2021 (Thm. 4.5) show that adaptively composed mechanisms stay (α, B)-RDP for a record if
the record is dropped as soon as its own accumulated individual RDP would pass B; the kNN DP-ICL paper
(Thm. 1, after Whitehouse et al. 2023) extends this to δ-approximate RDP, where the filter also halts a
record once its accumulated approximate δ would pass its share. Neighbouring relation: add/remove of one
record (or of all records of one person when spend is grouped by person).

**The condition that makes it valid.** A record's charge for a release must depend only on the record
itself and on what was already released, never on whether some other record is present; otherwise
removing one record changes other records' filter states and the retrieval sets that follow. The
retriever (``retrieval``) therefore charges every active record whose similarity to the (public) query
reaches a public threshold, not just the records that happened to be used.

**Several orders at once.** A unit is admitted when its spend plus the cost fits the cap at *some* order
of :data:`FILTER_ORDERS`. For a pair of neighbouring datasets, split the transcripts by the first order
whose filter never halted the record; on each part the real run equals the single-order filter of that
order, which is (α_k, B_k)-RDP and so (ε, δ_k)-DP by the conversion of Balle et al. 2020. Summing over the
disjoint parts gives (ε, Σ δ_k)-DP; the caps use δ_k = δ_conv / m. The approximate part (PTR's failure
events) is the same event at every order, so it is counted once: the total is
(ε, δ_conv + δ_approx)-DP per unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["FILTER_ORDERS", "IndividualBudget", "ReleaseCost", "admissible", "order_caps"]

FILTER_ORDERS: tuple[float, ...] = (
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    12.0,
    16.0,
    20.0,
    24.0,
    32.0,
    48.0,
    64.0,
    128.0,
    256.0,
)
"""Few orders on purpose: each one costs a share δ/m of the conversion δ."""

_FIT_MARGIN = 1e-9
"""Relative room kept below every cap: a unit's spend is a float sum, which may fall below the exact sum of its
costs by (n − 1)·2⁻⁵³ of it after n terms (1e-9 covers n up to 9 million), and the caps invert a conversion
in floats. Calibrations leave 2e-9 of room (``noise_for_uses``), so exactly ``uses`` releases still fit."""


def order_caps(epsilon: float, conversion_delta: float, orders: tuple[float, ...]) -> np.ndarray:
    """The RDP cap B_k at each order such that (α_k, B_k)-RDP converts to (ε, δ_conv / m)-DP.

    Inverts Balle et al. 2020: ε = B + log((α−1)/α) − (log δ_k + log α)/(α−1). Orders whose conversion
    alone exceeds ε get cap −inf (they can never admit anything).

    Args:
        epsilon: ε.
        conversion_delta: δ_conv, split evenly over the orders.
        orders: the Rényi orders.
    """
    a = np.asarray(orders, dtype=float)
    delta_k = conversion_delta / len(a)
    caps = epsilon - np.log1p(-1.0 / a) + (math.log(delta_k) + np.log(a)) / (a - 1)
    return np.where(caps > 0, caps, -np.inf)


@dataclass(frozen=True)
class IndividualBudget:
    """Each unit's (record's or person's) lifetime budget.

    Args:
        epsilon: ε each unit may lose over all releases.
        delta: the unit's total δ: ``approximate_delta`` for releases that are only approximately RDP
            (propose-test-release) plus the rest for the RDP → (ε, δ) conversion.
        approximate_delta: the part of δ that approximate-RDP releases may use up (default: half of δ;
            0 forbids such releases).
        orders: the Rényi orders tracked (the default is :data:`FILTER_ORDERS`).

    Raises:
        ConfigurationError: a value out of range, repeated orders, or an ε too small for δ at every order.
    """

    epsilon: float
    delta: float
    approximate_delta: float | None = None
    orders: tuple[float, ...] = FILTER_ORDERS
    caps: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        eps = check.positive_finite("epsilon", self.epsilon)
        delta = check.probability_open("delta", self.delta)
        approx = (
            delta / 2 if self.approximate_delta is None else check.real("approximate_delta", self.approximate_delta)
        )
        if not 0.0 <= approx < delta:
            raise ConfigurationError(f"approximate_delta must lie in [0, delta={delta}), got {approx!r}")
        orders = tuple(check.order("orders[i]", a) for a in self.orders)
        if not orders or len(set(orders)) != len(orders):
            raise ConfigurationError("orders must be a non-empty tuple of distinct Rényi orders")
        conversion = delta - approx  # rounded down, never above the exact difference
        if Fraction(conversion) > Fraction(delta) - Fraction(approx):
            conversion = math.nextafter(conversion, 0.0)
        caps = order_caps(eps, conversion, orders)
        if not np.isfinite(caps).any():
            raise ConfigurationError(
                f"epsilon={eps} is too small for delta={delta}: no order leaves any RDP budget after the conversion"
            )
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "approximate_delta", approx)
        object.__setattr__(self, "orders", orders)
        caps.setflags(write=False)
        object.__setattr__(self, "caps", caps)

    @property
    def conversion_delta(self) -> float:
        """The part of δ the RDP → (ε, δ) conversion uses (split evenly over the orders)."""
        return self.delta - float(self.approximate_delta or 0.0)

    def as_event(self) -> ev.ApproxDPEvent:
        """What the whole filtered mechanism costs the dataset: (ε, δ)-DP for every unit, under add/remove
        (a replace-one ledger converts it by group privacy to (2ε, (1 + e^ε)δ); ``conversion.py``)."""
        return ev.ApproxDPEvent(self.epsilon, self.delta, neighbouring=ev.ADD_REMOVE)

    def to_dict(self) -> dict[str, object]:
        """The fields as a JSON-ready dict; :meth:`from_dict` inverts it."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "approximate_delta": self.approximate_delta,
            "orders": list(self.orders),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> IndividualBudget:
        """Rebuild a budget from :meth:`to_dict` output (validating it again).

        Args:
            data: the dict.

        Raises:
            ConfigurationError: no list of orders, or an invalid budget.
        """
        orders = data.get("orders")
        if not isinstance(orders, list):
            raise ConfigurationError("stored individual budget has no list of orders")
        return cls(
            epsilon=data.get("epsilon"),  # type: ignore[arg-type]  # validated in __post_init__
            delta=data.get("delta"),  # type: ignore[arg-type]
            approximate_delta=data.get("approximate_delta"),  # type: ignore[arg-type]
            orders=tuple(orders),
        )


@dataclass(frozen=True)
class ReleaseCost:
    """What one release costs one unit: an RDP curve at the filter's orders plus an approximate δ.

    Attributes:
        rdp: the RDP cost at each of the filter's orders.
        delta: the approximate δ cost.
    """

    rdp: np.ndarray
    delta: float = 0.0

    @classmethod
    def of(cls, event: ev.DPEvent, orders: tuple[float, ...], *, delta: float = 0.0) -> ReleaseCost:
        """The cost of an RDP-analysable event (e.g. a Gaussian with the unit's sensitivity).

        Args:
            event: an event with an RDP analysis.
            orders: the filter's orders.
            delta: the release's approximate δ.

        Raises:
            UnsupportedEventError: ``event`` has no RDP analysis.
            ConfigurationError: ``delta`` is negative or not finite.
        """
        curve = rdp.event_rdp(event, orders)
        curve.setflags(write=False)
        return cls(curve, check.non_negative_finite("delta", delta))


def admissible(
    budget: IndividualBudget,
    spent: np.ndarray,
    spent_delta: np.ndarray,
    cost: np.ndarray,
    cost_delta: np.ndarray | float,
) -> np.ndarray:
    """Which units can pay ``cost`` (one row per unit, or one row for all) and stay within their budget.

    Args:
        budget: each unit's budget.
        spent: accumulated RDP, shape (n_units, n_orders).
        spent_delta: accumulated approximate δ, shape (n_units,).
        cost: the release's RDP per unit, shape (n_orders,) or (n_units, n_orders).
        cost_delta: the release's approximate δ per unit.

    Returns:
        Boolean mask of shape (n_units,): fits at some order and within the approximate-δ share.
    """
    caps = budget.caps
    after = spent + cost
    fits_rdp = (after <= caps * (1 - _FIT_MARGIN)).any(axis=-1)
    approx = float(budget.approximate_delta or 0.0)
    fits_delta = spent_delta + cost_delta <= approx * (1 - _FIT_MARGIN)
    return np.asarray(fits_rdp & fits_delta, dtype=bool)
