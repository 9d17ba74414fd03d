"""Frozen descriptions of private releases ("privacy events"), built before anything runs.

An event says what a release costs, not how to compute it: accountants (``accountants.py``) turn events
into (ε, δ). Every event validates its parameters on construction, serialises to a canonical JSON-ready
dict (the ledger stores that form), and names the accountants that can analyse it
(``supported_accountants``). Composite events (``ComposedEvent``, ``SelfComposedEvent``) are flattened
into atoms with counts before accounting (:func:`atoms`), so ten thousand identical charges cost one
analysis.

Neighbouring relations (``neighbouring.py``): every event states the relation its analysis assumed in its
``neighbouring`` field (``"replace_one"`` or ``"add_remove"``); none is untagged. For a Gaussian, pure,
exponential-mechanism or (ε, δ) event the tag says for which relation its sensitivity or ε was computed.
Poisson subsampling has an analysis under both (its inner Gaussian's sensitivity bounds one record's
contribution, an add/remove quantity); sampling without replacement (Wang, Balle & Kasiviswanathan 2019)
and the DPS-MOZO token only under replace-one. A composition takes its children's relation and refuses to
mix two; a ledger converts a charge to its own relation (``conversion.py``) or refuses it.

Privacy units: every event also names the unit its relation counts in (``privacy_unit``: ``"record"``, the
default and left out of the canonical form, or ``"unit"``: all of one person's records; ``neighbouring.py``).
The analysis of an event does not depend on it (a unit-level mechanism is the record-level one with a unit's
bounded contribution as its element); compositions take their children's unit and refuse to mix two, and a ledger
refuses every charge made for another unit than its own. :func:`with_privacy_unit` tags a whole event tree.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.neighbouring import (
    ADD_REMOVE,
    PER_RECORD,
    REPLACE_ONE,
    check_privacy_unit,
    check_relation,
)
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError, UnsupportedEventError

__all__ = [
    "ADD_REMOVE",
    "BASIC",
    "PLD",
    "PRV",
    "RDP",
    "REPLACE_ONE",
    "ApproxDPEvent",
    "ComposedEvent",
    "DPEvent",
    "ExponentialMechanismEvent",
    "FilteredReleaseEvent",
    "GaussianEvent",
    "MozoTokenEvent",
    "PoissonSampledEvent",
    "PureDPEvent",
    "RDPCurveEvent",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "atoms",
    "compose",
    "costly",
    "event_from_dict",
    "event_key",
    "with_privacy_unit",
]

PRV = "prv"
"""Numerical composition of privacy random variables (Gopi et al. 2021)."""
RDP = "rdp"
"""Rényi DP composition with the Balle et al. 2020 conversion."""
PLD = "pld"
"""Numerical composition of privacy loss distributions with Google's ``dp-accounting`` (pessimistic)."""
BASIC = "basic"
"""Basic composition of pure / approximate DP guarantees (ε and δ add up)."""

NUMERICAL = frozenset({PRV, PLD})

_REGISTRY: dict[str, type[DPEvent]] = {}


@dataclass(frozen=True)
class DPEvent:
    """Base class of all privacy events.

    Attributes:
        neighbouring: the relation the event's analysis assumed (``"replace_one"`` or ``"add_remove"``);
            a keyword every atomic event requires, derived from the children for compositions.
        privacy_unit: what one step of that relation changes: ``"record"`` (default) or ``"unit"`` (all of one
            privacy unit's records); derived from the children for compositions and sampled events.
    """

    type_name: ClassVar[str] = ""
    neighbouring: str = field(kw_only=True)
    privacy_unit: str = field(default=PER_RECORD, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.type_name:
            _REGISTRY[cls.type_name] = cls

    @property
    def supported_accountants(self) -> frozenset[str]:
        """Names of the accountants that can analyse this event (``PRV``, ``RDP``, ``BASIC``)."""
        raise NotImplementedError

    def _tag(self, allowed: tuple[str, ...] = (REPLACE_ONE, ADD_REMOVE)) -> None:
        check_privacy_unit(self.privacy_unit)
        relation = check_relation(self.neighbouring)
        if relation not in allowed:
            raise UnsupportedEventError(
                f"a {self.type_name!r} event has an analysis only for {' or '.join(allowed)} neighbours, not {relation}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON-ready form; :func:`event_from_dict` inverts it exactly.

        Returns:
            ``{"type": ..., <field>: ...}``, nested events as dicts and tuples as lists.
        """
        out: dict[str, Any] = {"type": self.type_name}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "privacy_unit" and value == PER_RECORD:
                continue  # the default: left out, so record-level events keep the keys ledgers stored before units
            if isinstance(value, DPEvent):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = [v.to_dict() if isinstance(v, DPEvent) else v for v in value]
            out[f.name] = value
        return out


def event_from_dict(data: Mapping[str, Any]) -> DPEvent:
    """Rebuild an event from :meth:`DPEvent.to_dict` output (validating it again).

    Args:
        data: the dict, as :meth:`DPEvent.to_dict` wrote it (nested events as dicts).

    Raises:
        ConfigurationError: the dict has no ``type`` key, or its fields are malformed.
        UnsupportedEventError: the ``type`` names no known event.
    """
    if not isinstance(data, Mapping) or "type" not in data:
        raise ConfigurationError("an event dict needs a 'type' key")
    cls = _REGISTRY.get(str(data["type"]))
    if cls is None:
        raise UnsupportedEventError(f"unknown event type {data['type']!r}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(value, Mapping):
            value = event_from_dict(value)
        elif isinstance(value, list):
            value = tuple(event_from_dict(v) if isinstance(v, Mapping) else v for v in value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except ConfigurationError:
        raise
    except TypeError as exc:
        raise ConfigurationError(f"malformed {cls.type_name!r} event: {exc}") from None


def event_key(event: DPEvent) -> str:
    """Canonical string identity of an event (stable across processes; floats round-trip exactly).

    Args:
        event: the event to identify.
    """
    return json.dumps(event.to_dict(), sort_keys=True, separators=(",", ":"))


def _require_event(name: str, value: object) -> DPEvent:
    if not isinstance(value, DPEvent):
        raise ConfigurationTypeError(f"{name} must be a DPEvent, got {type(value).__name__}")
    return value


def _merge_relations(children: Iterable[DPEvent]) -> str:
    relations = {c.neighbouring for c in children}
    if len(relations) != 1:
        raise ConfigurationError(
            "cannot compose events analysed under different neighbouring relations "
            f"({', '.join(sorted(relations))}) into one guarantee; convert them to one relation first "
            "(conversion.to_relation)"
        )
    return relations.pop()


def _derive_relation(event: DPEvent, children: Iterable[DPEvent]) -> None:
    """Set a composition's relation and privacy unit from its children's (one of each; a given tag must agree)."""
    children = tuple(children)
    relation = _merge_relations(children)
    if event.neighbouring and event.neighbouring != relation:
        raise ConfigurationError(f"a composition of {relation} events cannot be tagged {event.neighbouring!r}")
    object.__setattr__(event, "neighbouring", relation)
    _derive_unit(event, children)


def _derive_unit(event: DPEvent, children: Iterable[DPEvent]) -> None:
    """Set ``event``'s privacy unit from its children's: one unit, never a mix (a record-level guarantee says
    nothing of a unit, and a ledger holds one unit). A composite tagged ``"unit"`` over record-level children is
    refused (it would claim what they do not hold)."""
    units = {c.privacy_unit for c in children}
    if len(units) != 1:
        raise ConfigurationError(
            "cannot compose events of different privacy units (record and unit) into one guarantee: a record-level "
            "charge says nothing of a unit with many records"
        )
    unit = units.pop()
    if event.privacy_unit != PER_RECORD and event.privacy_unit != unit:
        raise ConfigurationError(f"an event over {unit}-level events cannot be tagged {event.privacy_unit!r}")
    object.__setattr__(event, "privacy_unit", unit)


@dataclass(frozen=True)
class GaussianEvent(DPEvent):
    """The Gaussian mechanism: noise of std ``noise_multiplier * sensitivity`` on an ℓ2-bounded query.

    Privacy depends on the noise multiplier only; ``sensitivity`` records the ℓ2 sensitivity under
    ``neighbouring`` that the mechanism scales its noise by (e.g. √2 for a sum of probability vectors,
    Tang et al. 2024). RDP: α / (2σ²) (Mironov 2017, Prop. 7). PRV: Gopi et al. 2021, Prop. B.1. PLD:
    ``dp_accounting`` (Doroshenko et al. 2022).

    Attributes:
        noise_multiplier: σ, the noise std in units of the sensitivity.
        sensitivity: the query's ℓ2 sensitivity under ``neighbouring``.

    Raises:
        ConfigurationError: a parameter is not positive and finite, or the relation is unknown.
    """

    type_name: ClassVar[str] = "gaussian"
    noise_multiplier: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        self._tag()
        object.__setattr__(self, "noise_multiplier", check.positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sensitivity", check.positive_finite("sensitivity", self.sensitivity))

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise the mechanism must add."""
        return self.noise_multiplier * self.sensitivity

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({PRV, PLD, RDP})


@dataclass(frozen=True)
class _EpsilonEvent(DPEvent):
    """Shared body of the events described by one pure ε (analysed by every accountant)."""

    epsilon: float

    def __post_init__(self) -> None:
        self._tag()
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({BASIC, PRV, PLD, RDP})


@dataclass(frozen=True)
class PureDPEvent(_EpsilonEvent):
    """A release that is ε-DP (δ = 0), e.g. a Laplace or randomized-response step declared by the caller.

    Attributes:
        epsilon: the ε of the release.

    Raises:
        ConfigurationError: ``epsilon`` is not positive and finite, or the relation is unknown.
    """

    type_name: ClassVar[str] = "pure_dp"


@dataclass(frozen=True)
class ApproxDPEvent(DPEvent):
    """A release that is (ε, δ)-DP. No Rényi curve follows from (ε, δ) alone, so RDP cannot take it.

    Attributes:
        epsilon: the ε of the release.
        delta: the δ of the release, in (0, 1).

    Raises:
        ConfigurationError: a parameter is out of range, or the relation is unknown.
    """

    type_name: ClassVar[str] = "approx_dp"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        self._tag()
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check.probability_open("delta", self.delta))

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({BASIC, PRV, PLD})


@dataclass(frozen=True)
class ExponentialMechanismEvent(_EpsilonEvent):
    """An exponential (more generally, ε0-bounded-range) mechanism.

    It is ε0-DP, and as a bounded-range mechanism ε0²/8-zCDP (Cesar & Rogers 2021), i.e.
    (α, α·ε0²/8)-RDP: far tighter than advanced composition over many tokens.

    Attributes:
        epsilon: ε0, the mechanism's pure-DP (bounded-range) parameter.

    Raises:
        ConfigurationError: ``epsilon`` is not positive and finite, or the relation is unknown.
    """

    type_name: ClassVar[str] = "exponential_mechanism"


@dataclass(frozen=True)
class RDPCurveEvent(DPEvent):
    """A raw Rényi-DP curve: (orders[i], epsilons[i])-RDP for every i, and D_∞ ≤ ``epsilon_inf``.

    At order α the smallest value listed at any order ≥ α is used (Rényi divergence is non-decreasing in
    the order); above the largest listed order the curve is unknown (infinite).

    Attributes:
        orders: the Rényi orders α (distinct, > 1), stored sorted.
        epsilons: the RDP ε at each order, aligned with ``orders``.
        epsilon_inf: a bound on D_∞ (``math.inf`` when unknown; ``None`` in the dict form).

    Raises:
        ConfigurationError: the curve is empty, misaligned, repeats an order or holds an invalid value.
    """

    type_name: ClassVar[str] = "rdp_curve"
    orders: tuple[float, ...]
    epsilons: tuple[float, ...]
    epsilon_inf: float = math.inf

    def __post_init__(self) -> None:
        self._tag()
        orders = tuple(check.order("orders[i]", a) for a in self.orders)
        eps = tuple(check.non_negative_finite("epsilons[i]", e) for e in self.epsilons)
        if not orders or len(orders) != len(eps):
            raise ConfigurationError("orders and epsilons must be non-empty and of equal length")
        if len(set(orders)) != len(orders):
            raise ConfigurationError("orders must be distinct")
        pairs = sorted(zip(orders, eps, strict=True))
        inf = math.inf if self.epsilon_inf is None else check.real("epsilon_inf", self.epsilon_inf)
        if inf <= 0:
            raise ConfigurationError("epsilon_inf must be positive (math.inf when unknown)")
        object.__setattr__(self, "orders", tuple(a for a, _ in pairs))
        object.__setattr__(self, "epsilons", tuple(e for _, e in pairs))
        object.__setattr__(self, "epsilon_inf", inf)

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`DPEvent.to_dict`, with ``epsilon_inf`` None when it is infinite (JSON has no infinity)."""
        out = super().to_dict()
        # JSON has no infinity literal; None stands for "unknown / infinite".
        out["epsilon_inf"] = None if math.isinf(self.epsilon_inf) else self.epsilon_inf
        return out

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({RDP})


@dataclass(frozen=True)
class MozoTokenEvent(DPEvent):
    """One DPS-MOZO token before subsampling: (α, 4βα)-RDP (the claim of Flemings et al., Theorem B.3).

    Replace-one: the token reads a fixed number of one-shot prompts, one record each, and neighbours swap
    one record. The claim's proof fails for the published mechanism (a ball at one Rényi order and a
    normalised product bound nothing between neighbours; counterexamples in ``tests/test_mozo.py``). It is a
    theorem for the projected mechanism this library releases through (``mechanisms.mozo_mixing.project_output``:
    Hölder's inequality, Mironov 2017 Prop. 11), at the order α and every order ≤ α (monotonicity of Rényi
    divergence); above α nothing is known. Wrap it in :class:`SampledWithoutReplacementEvent` for the
    per-token sampling of n_shots records.

    Attributes:
        beta: the β of the token's projection.
        order: the Rényi order α the bound holds at (and below).

    Raises:
        ConfigurationError: a parameter is out of range.
        UnsupportedEventError: tagged with a relation other than replace-one.
    """

    type_name: ClassVar[str] = "mozo_token"
    beta: float
    order: float
    neighbouring: str = field(default=REPLACE_ONE, kw_only=True)

    def __post_init__(self) -> None:
        self._tag((REPLACE_ONE,))
        object.__setattr__(self, "beta", check.positive_finite("beta", self.beta))
        object.__setattr__(self, "order", check.order("order", self.order))

    @property
    def rdp_bound(self) -> float:
        """The constant RDP bound 4βα, valid at every order ≤ α."""
        return 4.0 * self.beta * self.order

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({RDP})


@dataclass(frozen=True)
class FilteredReleaseEvent(DPEvent):
    """A release paid by individual privacy filters: a record of it, costing the ledger nothing more.

    The per-record filter of a private index makes *all* of its releases together (ε, δ)-DP, and that
    total is charged to the ledger once (entry ``covered_by``) before the first release. Each release is
    then recorded with what it cost each record that took part (``per_unit``, under the filter's
    add/remove relation); accountants skip it (see :func:`costly`), so it never counts twice. Its own
    ``neighbouring`` is the relation of the ledger that holds the covering charge.

    Being free, it is admitted only against a real cover: the ledger checks, in the transaction of the
    charge, that ``covered_by`` is an earlier entry of the same ledger labelled ``<component>-filter:<owner>``
    holding the filter's add/remove (ε, δ), that the release is labelled ``<component>-<kind>:<owner>`` with
    the same component and owner, and that ``per_unit`` fits in that (ε, δ) (see
    :mod:`dp_icl_plugin.accounting.budget`).

    Attributes:
        per_unit: what the release cost a unit with one record among its candidates (not itself a filtered
            release); a unit with more pays more through its own filter, never more than the cover.
        covered_by: the id of the ledger entry holding the filter's covering charge.

    Raises:
        ConfigurationError: ``per_unit`` is not an event or holds a filtered release, or ``covered_by`` is not
            a positive integer.
    """

    type_name: ClassVar[str] = "filtered_release"
    per_unit: DPEvent
    covered_by: int

    def __post_init__(self) -> None:
        _derive_unit(self, [_require_event("per_unit", self.per_unit)])
        self._tag()
        if any(isinstance(a, FilteredReleaseEvent) for a in atoms(self.per_unit)):
            raise ConfigurationError("per_unit is what one release costs one unit, not another filtered release")
        object.__setattr__(self, "covered_by", check.positive_int("covered_by", self.covered_by))

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({BASIC, PRV, PLD, RDP})


def costly(counted: Counter[DPEvent]) -> Counter[DPEvent]:
    """The atoms that cost privacy at the ledger level (drops :class:`FilteredReleaseEvent` records).

    Args:
        counted: atoms with their counts, as :func:`atoms` returns them.
    """
    if not any(isinstance(a, FilteredReleaseEvent) for a in counted):
        return counted
    return Counter({a: n for a, n in counted.items() if not isinstance(a, FilteredReleaseEvent)})


@dataclass(frozen=True)
class PoissonSampledEvent(DPEvent):
    """Each record enters the mechanism independently with probability ``sampling_rate``, then a Gaussian.

    The inner Gaussian is tagged add/remove: its sensitivity bounds one record's contribution (the change
    its presence makes). ``neighbouring`` says which pair is analysed:

    - add/remove: the mixture (1−q)·N(0, σ²) + q·N(1, σ²) against N(0, σ²). PRV (Gopi et al. 2021, Prop.
      B.3), PLD (``dp_accounting``), RDP (Mironov, Talwar & Zhang 2019, every order).
    - replace-one: the replaced record keeps the other's coin, so the pair is (1−q)·N(0, σ²) + q·N(−1, σ²)
      against (1−q)·N(0, σ²) + q·N(1, σ²): PLD (``dp_accounting``'s REPLACE adjacency) and RDP by the
      weak triangle inequality from the add/remove curve (Mironov 2017, Prop. 11). At q = 1 it is a
      Gaussian of twice the sensitivity.

    Attributes:
        sampling_rate: q, each record's inclusion probability, in (0, 1].
        event: the inner Gaussian, tagged add/remove.

    Raises:
        ConfigurationError: ``sampling_rate`` is out of range or the inner Gaussian is not tagged add/remove.
        UnsupportedEventError: the inner event is not a :class:`GaussianEvent`.
    """

    type_name: ClassVar[str] = "poisson_sampled"
    sampling_rate: float
    event: DPEvent

    def __post_init__(self) -> None:
        inner = _require_event("event", self.event)
        _derive_unit(self, [inner])
        self._tag()
        object.__setattr__(self, "sampling_rate", check.probability_half_open("sampling_rate", self.sampling_rate))
        if not isinstance(inner, GaussianEvent):
            raise UnsupportedEventError(
                f"Poisson subsampling is analysed only for a Gaussian event, not {inner.type_name!r}"
            )
        if inner.neighbouring != ADD_REMOVE:
            raise ConfigurationError(
                "the Gaussian inside Poisson subsampling must be tagged add_remove: its sensitivity bounds one "
                "record's contribution"
            )

    @property
    def supported_accountants(self) -> frozenset[str]:
        if self.neighbouring == ADD_REMOVE:
            return frozenset({PRV, PLD, RDP})
        return frozenset({PLD, RDP})


@dataclass(frozen=True)
class SampledWithoutReplacementEvent(DPEvent):
    """A fixed-size subset of m of n records (rate γ = m/n) drawn without replacement, then ``event``.

    Replace-one neighbours only (n is the same for both); the inner event, also replace-one, is the
    mechanism on the subset, where the swap changes at most one element. RDP amplification by Wang,
    Balle & Kasiviswanathan 2019, Theorem 9 (integer orders ≥ 2). The inner event must itself be
    analysable with RDP.

    Attributes:
        sampling_rate: γ = m/n, in (0, 1].
        event: the mechanism run on the subset (replace-one, with an RDP curve).

    Raises:
        ConfigurationError: ``sampling_rate`` is out of range or the inner event is not replace-one.
        UnsupportedEventError: the inner event has no RDP analysis, or the relation is not replace-one.
    """

    type_name: ClassVar[str] = "sampled_without_replacement"
    sampling_rate: float
    event: DPEvent
    neighbouring: str = field(default=REPLACE_ONE, kw_only=True)

    def __post_init__(self) -> None:
        inner = _require_event("event", self.event)
        _derive_unit(self, [inner])
        self._tag((REPLACE_ONE,))
        object.__setattr__(self, "sampling_rate", check.probability_half_open("sampling_rate", self.sampling_rate))
        if RDP not in inner.supported_accountants:
            raise UnsupportedEventError(
                f"sampling without replacement needs an inner event with an RDP curve, not {inner.type_name!r}"
            )
        if inner.neighbouring != REPLACE_ONE:
            raise ConfigurationError(
                "the event inside sampling without replacement must be analysed for replace-one neighbours"
            )

    @classmethod
    def from_sizes(cls, sample_size: int, population_size: int, event: DPEvent) -> SampledWithoutReplacementEvent:
        """Build the event from the subset size m and the dataset size n (γ = m/n).

        Args:
            sample_size: m, the records drawn.
            population_size: n, the records drawn from.
            event: the mechanism run on the subset.

        Raises:
            ConfigurationError: a size is not a positive integer, or m > n.
        """
        m = check.positive_int("sample_size", sample_size)
        n = check.positive_int("population_size", population_size)
        if m > n:
            raise ConfigurationError(f"sample_size ({m}) exceeds population_size ({n})")
        return cls(sampling_rate=m / n, event=event)

    @property
    def supported_accountants(self) -> frozenset[str]:
        return frozenset({RDP})


@dataclass(frozen=True)
class SelfComposedEvent(DPEvent):
    """``event`` run ``count`` times (adaptively); its relation is ``event``'s.

    Attributes:
        event: the event repeated.
        count: how many times it runs (a positive integer).

    Raises:
        ConfigurationError: ``event`` is not an event, ``count`` is not positive, or a given tag disagrees
            with ``event``'s relation.
    """

    type_name: ClassVar[str] = "self_composed"
    event: DPEvent
    count: int
    neighbouring: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        _derive_relation(self, [_require_event("event", self.event)])
        object.__setattr__(self, "count", check.positive_int("count", self.count))

    @property
    def supported_accountants(self) -> frozenset[str]:
        return self.event.supported_accountants


@dataclass(frozen=True)
class ComposedEvent(DPEvent):
    """Adaptive composition of several events, all analysed under one relation (which it takes).

    Attributes:
        events: the events composed (at least one, all of one relation).

    Raises:
        ConfigurationError: no events, a non-event, or children of different relations.
    """

    type_name: ClassVar[str] = "composed"
    events: tuple[DPEvent, ...] = field(default=())
    neighbouring: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        events = tuple(self.events)
        if not events:
            raise ConfigurationError("a composition needs at least one event")
        for e in events:
            _require_event("events[i]", e)
        _derive_relation(self, events)
        object.__setattr__(self, "events", events)

    @property
    def supported_accountants(self) -> frozenset[str]:
        result = self.events[0].supported_accountants
        for e in self.events[1:]:
            result = result & e.supported_accountants
        return result


def atoms(event: DPEvent) -> Counter[DPEvent]:
    """Flatten compositions into a multiset of atomic events with their counts.

    Args:
        event: the event to flatten.

    Returns:
        Each atomic (non-composite) event with how many times it runs.
    """
    out: Counter[DPEvent] = Counter()
    stack: list[tuple[DPEvent, int]] = [(event, 1)]
    while stack:
        e, n = stack.pop()
        if isinstance(e, ComposedEvent):
            stack.extend((child, n) for child in e.events)
        elif isinstance(e, SelfComposedEvent):
            stack.append((e.event, n * e.count))
        else:
            out[e] += n
    return out


def compose(*events: DPEvent) -> DPEvent:
    """Compose events of one relation into one canonical event (identical atoms grouped into counts).

    Args:
        *events: the events to compose, all of one neighbouring relation.

    Returns:
        The single atom when there is one, else a :class:`ComposedEvent` of :class:`SelfComposedEvent` counts.

    Raises:
        ConfigurationError: no events, a non-event, or events of different relations.
    """
    if not events:
        raise ConfigurationError("compose() needs at least one event")
    total: Counter[DPEvent] = Counter()
    for e in events:
        total.update(atoms(_require_event("events[i]", e)))
    ordered = sorted(total.items(), key=lambda kv: event_key(kv[0]))
    parts = [e if n == 1 else SelfComposedEvent(e, n) for e, n in ordered]
    return parts[0] if len(parts) == 1 else ComposedEvent(tuple(parts))


def with_privacy_unit(event: DPEvent, privacy_unit: str) -> DPEvent:
    """``event`` with every node of its tree tagged ``privacy_unit``: the same analysis, stated per unit.

    Only a method whose analysis holds with a privacy unit as its element may tag its event ``"unit"`` (it
    draws units and bounds each unit's contribution as its records' were bounded; see its docstring).

    Args:
        event: the event.
        privacy_unit: ``"record"`` or ``"unit"``.

    Raises:
        ConfigurationError: ``privacy_unit`` names no unit.
        UnsupportedEventError: a unit-level event restated per record (no record-level guarantee follows).
    """
    unit = check_privacy_unit(privacy_unit)
    if event.privacy_unit == unit and all(a.privacy_unit == unit for a in atoms(event)):
        return event
    if unit == PER_RECORD:
        # removing one record of a unit changes that unit's element (a replacement, not a removal): a unit-level
        # event holds no record-level guarantee as it stands
        raise UnsupportedEventError("a unit-level event cannot be restated per record")
    changes: dict[str, Any] = {}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, DPEvent):
            changes[f.name] = with_privacy_unit(value, unit)
        elif isinstance(value, tuple) and value and all(isinstance(v, DPEvent) for v in value):
            changes[f.name] = tuple(with_privacy_unit(v, unit) for v in value)
    return replace(event, **changes, privacy_unit=unit)
