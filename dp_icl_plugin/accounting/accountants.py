"""Accountants: turn a privacy event into ε at a given δ.

- :class:`BasicAccountant` (``"basic"``): pure and (ε, δ) atoms; ε and δ add up (Dwork et al. 2006), summed
  exactly and rounded up, so a reported total is never below the true one (:func:`add_up`).
- :class:`RDPAccountant` (``"rdp"``): Rényi DP curves added order by order, converted with Balle et al.
  2020 (see ``rdp.py`` for each mechanism's curve).
- :class:`PLDAccountant` (``"pld"``): numerical composition of privacy loss distributions with Google's
  ``dp-accounting`` (``pld.py``); the direct analysis of Poisson subsampling under replace-one.
- :class:`PRVAccountant` (``"prv"``): numerical composition of privacy random variables (``prv.py``), kept
  to reproduce PTA's Table 4 (add/remove only); not a member of the default tightest accountant.
- :class:`TightestAccountant` (``"auto"``, the default everywhere; members basic, RDP and PLD): every
  valid bound is a bound, so it returns the smallest ε among its members that support the event. When
  none supports the whole event (e.g. an (ε, δ) atom or a replace-one Poisson atom next to an RDP-only
  atom), it also splits the atoms into parts analysed separately and adds their ε with basic composition
  over a split of δ (Dwork et al. 2006): (ε1, δ1) and (ε2, δ2) compose to (ε1 + ε2, δ1 + δ2); the ε's are added
  rounded up and the δ's split so that their exact sum never exceeds δ.

Every event an accountant analyses is under one neighbouring relation (a ledger converts charges to its
own first; ``conversion.py``); the relation selects the analysis of Poisson subsampling.

Results are cached per (multiset of atoms, δ), so a ledger of ten thousand charges of a few kinds is
analysed once per kind-count combination.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from fractions import Fraction
from typing import Generic, TypeVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import pld, prv, rdp
from dp_icl_plugin.errors import ConfigurationError, UnsupportedEventError

__all__ = [
    "Accountant",
    "BasicAccountant",
    "PLDAccountant",
    "PRVAccountant",
    "RDPAccountant",
    "TightestAccountant",
    "get_accountant",
    "tightest",
]

_V = TypeVar("_V")


class _LRU(Generic[_V]):
    """A small thread-safe LRU map."""

    def __init__(self, maxsize: int = 4096) -> None:
        self._data: OrderedDict[object, _V] = OrderedDict()
        self._lock = threading.Lock()
        self._maxsize = maxsize

    def get(self, key: object) -> _V | None:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: object, value: _V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)


class Accountant(ABC):
    """Common interface: ``supports(event)`` and ``epsilon(event, delta=...)``."""

    name: str = ""

    def __init__(self) -> None:
        self._cache: _LRU[float] = _LRU()

    def supports(self, event: ev.DPEvent) -> bool:
        """Whether this accountant can analyse ``event``.

        Args:
            event: the event to analyse.
        """
        return self.name in event.supported_accountants

    def require_supported(self, event: object) -> None:
        """Raise ConfigurationError / UnsupportedEventError unless ``event`` is an event this accountant takes.

        Args:
            event: the object to check.

        Raises:
            ConfigurationError: ``event`` is not a :class:`~dp_icl_plugin.accounting.events.DPEvent`.
            UnsupportedEventError: this accountant cannot analyse it.
        """
        if not isinstance(event, ev.DPEvent):
            raise ConfigurationError(f"expected a DPEvent, got {type(event).__name__}")
        if not self.supports(event):
            raise UnsupportedEventError(
                f"the {self.name!r} accountant cannot analyse {event.type_name!r} events "
                f"(supported by: {', '.join(sorted(event.supported_accountants)) or 'none'})"
            )

    def epsilon(self, event: ev.DPEvent, *, delta: float) -> float:
        """The ε of ``event`` at ``delta`` (``inf`` when this analysis cannot bound it).

        Args:
            event: the event to analyse.
            delta: the δ, in (0, 1).

        Raises:
            ConfigurationError: ``delta`` is out of range, or ``event`` is not an event.
            UnsupportedEventError: this accountant cannot analyse ``event``.
        """
        delta = check.probability_open("delta", delta)
        self.require_supported(event)
        return self._cached(ev.costly(ev.atoms(event)), delta)

    def _cached(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        if not atoms:  # nothing that costs privacy (e.g. only records of filtered releases)
            return 0.0
        key = (frozenset(atoms.items()), delta)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._compute(atoms, delta)
            self._cache.put(key, hit)
        return hit

    @abstractmethod
    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _round_up(exact: Fraction) -> float:
    """The smallest float ≥ ``exact`` (``inf`` past the largest float)."""
    try:
        nearest = float(exact)
    except OverflowError:
        return math.inf
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < exact else nearest


def _round_down(exact: Fraction) -> float:
    """The largest float ≤ ``exact`` (``exact`` within the float range)."""
    nearest = float(exact)
    return math.nextafter(nearest, -math.inf) if Fraction(nearest) > exact else nearest


def add_up(*bounds: float) -> float:
    """Σ ``bounds`` (ε's or δ's composed by basic composition), rounded up: never below their exact sum.

    Rounding to the nearest float can land below the sum (1 + 2⁻⁵³ rounds to 1), which would certify less
    than was spent. ``inf`` if any bound is infinite.
    """
    if any(math.isinf(b) for b in bounds):
        return math.inf
    return _round_up(sum(map(Fraction, bounds), Fraction(0)))


def left_over(total: float, used: float) -> float:
    """``total`` − ``used`` rounded down (the δ left for the rest of a composition, the ε left in a budget):
    ``used`` plus it never exceeds ``total``."""
    return _round_down(Fraction(total) - Fraction(used))


def split_delta(delta: float, share: float) -> tuple[float, float]:
    """``delta`` split into about ``share``·δ and the rest, whose exact sum never exceeds ``delta``."""
    first = share * delta
    return first, left_over(delta, first)


def _basic_totals(atoms: Counter[ev.DPEvent]) -> tuple[float, float]:
    """Σ n·ε and Σ n·δ of pure / (ε, δ) atoms, summed exactly and rounded up (never below the true sums)."""
    eps, delta = Fraction(0), Fraction(0)
    for atom, n in atoms.items():
        if isinstance(atom, (ev.PureDPEvent, ev.ExponentialMechanismEvent)):
            eps += n * Fraction(atom.epsilon)
        elif isinstance(atom, ev.ApproxDPEvent):
            eps += n * Fraction(atom.epsilon)
            delta += n * Fraction(atom.delta)
        else:
            raise UnsupportedEventError(f"basic composition cannot take {atom.type_name!r} events")
    return _round_up(eps), _round_up(delta)


class BasicAccountant(Accountant):
    """Basic composition: (Σ ε_i, Σ δ_i); ε is reported at any δ ≥ Σ δ_i, else ``inf``."""

    name = ev.BASIC

    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        eps, used_delta = _basic_totals(atoms)
        return eps if used_delta <= delta else math.inf


class RDPAccountant(Accountant):
    """Rényi DP composition over ``orders``, converted with Balle et al. 2020.

    Args:
        orders: the Rényi orders (each > 1) the curves are evaluated at.

    Raises:
        ConfigurationError: ``orders`` is empty or holds an invalid order.
    """

    name = ev.RDP

    def __init__(self, orders: tuple[float, ...] = rdp.DEFAULT_ORDERS) -> None:
        super().__init__()
        self.orders = tuple(check.order("orders[i]", a) for a in orders)
        if not self.orders:
            raise ConfigurationError("orders must not be empty")

    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        curve = np.zeros(len(self.orders))
        for atom, n in atoms.items():
            curve = curve + n * rdp.event_rdp(atom, self.orders)
        return rdp.rdp_to_epsilon(self.orders, curve, delta)[0]

    def best_order(self, event: ev.DPEvent, *, delta: float) -> float:
        """The order at which the conversion is tightest for ``event``.

        Args:
            event: the event to analyse.
            delta: the δ of the conversion.
        """
        return rdp.rdp_to_epsilon(self.orders, rdp.event_rdp(event, self.orders), delta)[1]


class PRVAccountant(Accountant):
    """PRV numerical composition; reports the certified upper bound on ε.

    :meth:`coarse_bounds` runs the same analysis with a 10× larger ε error (about 10× cheaper): its
    certified lower bound tells :class:`TightestAccountant` when the fine analysis cannot help.

    Args:
        eps_error: the allowed error on ε.
        delta_error: the allowed error on δ, in (0, 1).

    Raises:
        ConfigurationError: an error bound is out of range.
    """

    name = ev.PRV
    COARSE_FACTOR = 10.0

    def __init__(self, eps_error: float = prv.DEFAULT_EPS_ERROR, delta_error: float = prv.DEFAULT_DELTA_ERROR) -> None:
        super().__init__()
        self.eps_error = check.positive_finite("eps_error", eps_error)
        self.delta_error = check.probability_open("delta_error", delta_error)
        self._coarse: _LRU[tuple[float, float]] = _LRU()

    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        return prv.prv_epsilon(atoms, delta, eps_error=self.eps_error, delta_error=self.delta_error)

    def coarse_bounds(self, atoms: Counter[ev.DPEvent], delta: float) -> tuple[float, float]:
        """Certified (lower, upper) ε bounds from a coarse analysis (cached).

        Args:
            atoms: the atoms with their counts (:func:`~dp_icl_plugin.accounting.events.atoms`).
            delta: the δ.
        """
        key = (frozenset(atoms.items()), delta)
        hit = self._coarse.get(key)
        if hit is None:
            hit = prv.prv_bounds(
                atoms, delta, eps_error=self.eps_error * self.COARSE_FACTOR, delta_error=self.delta_error
            )
            self._coarse.put(key, hit)
        return hit


class PLDAccountant(Accountant):
    """Privacy loss distributions (Google's ``dp-accounting``, pessimistic); reports an upper bound on ε.

    Args:
        value_discretization_interval: the PLD's discretisation interval (smaller: tighter and slower).

    Raises:
        ConfigurationError: the interval is not positive and finite.
    """

    name = ev.PLD

    def __init__(self, value_discretization_interval: float = pld.DEFAULT_DISCRETIZATION) -> None:
        super().__init__()
        self.value_discretization_interval = check.positive_finite(
            "value_discretization_interval", value_discretization_interval
        )

    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        return pld.pld_epsilon(atoms, delta, interval=self.value_discretization_interval)


DELTA_SPLITS = (0.5, 0.9, 0.1, 0.99, 0.75, 0.25, 0.01)
"""Shares of δ tried for the first part when a composition is split between two analyses."""


class TightestAccountant(Accountant):
    """The smallest valid ε among its members, cheapest first; splits events no single member supports.

    Args:
        members: the accountants to take the smallest ε of (default: basic, RDP and PLD).
    """

    name = "auto"

    def __init__(self, members: tuple[Accountant, ...] | None = None) -> None:
        super().__init__()
        self.members = members if members is not None else (BasicAccountant(), RDPAccountant(), PLDAccountant())

    def supports(self, event: ev.DPEvent) -> bool:
        """Whether every atom of ``event`` is taken by some member (then a valid, possibly split, bound exists).

        Args:
            event: the event to analyse.
        """
        return all(a.supported_accountants & {m.name for m in self.members} for a in ev.atoms(event))

    def epsilons(self, event: ev.DPEvent, *, delta: float) -> dict[str, float]:
        """ε from every member that supports ``event`` (for reports that show each bound).

        Args:
            event: the event to analyse.
            delta: the δ, in (0, 1).

        Returns:
            Member name → ε.
        """
        return {m.name: m.epsilon(event, delta=delta) for m in self.members if m.supports(event)}

    def fits(self, event: ev.DPEvent, *, epsilon: float, delta: float) -> bool:
        """Whether some valid analysis shows ``event`` is (epsilon, delta)-DP; stops at the first that does.

        Args:
            event: the event to analyse.
            epsilon: the ε to fit in.
            delta: the δ, in (0, 1).

        Raises:
            ConfigurationError: ``delta`` is out of range.
        """
        return self.first_fitting(event, epsilon=epsilon, delta=delta) is not None

    def first_fitting(self, event: ev.DPEvent, *, epsilon: float, delta: float) -> float | None:
        """The first valid ε bound (cheapest first) that is ≤ ``epsilon``, or None if none is.

        Args:
            event: the event to analyse.
            epsilon: the ε to fit in.
            delta: the δ, in (0, 1).

        Raises:
            ConfigurationError: ``delta`` is out of range.
        """
        delta = check.probability_open("delta", delta)
        atoms = ev.costly(ev.atoms(event))
        return next((eps for eps in self._candidates(atoms, delta, target=epsilon) if eps <= epsilon), None)

    def _compute(self, atoms: Counter[ev.DPEvent], delta: float) -> float:
        return min(self._candidates(atoms, delta), default=math.inf)

    def _candidates(self, atoms: Counter[ev.DPEvent], delta: float, target: float | None = None):
        """Valid ε bounds, cheapest first. The fine PRV analysis is skipped when a coarse one certifies
        that it cannot come out below both ``target`` (if given) and the best bound seen so far."""
        if not atoms:
            yield 0.0
            return
        whole = [m for m in self.members if all(m.name in a.supported_accountants for a in atoms)]
        best = math.inf
        for m in whole:
            if isinstance(m, PRVAccountant):
                lower, upper = m.coarse_bounds(atoms, delta)
                yield upper
                best = min(best, upper)
                if lower >= best or (target is not None and lower > target):
                    continue
            eps = m._cached(atoms, delta)
            best = min(best, eps)
            yield eps
        yield from self._split(atoms, delta)

    def _split(self, atoms: Counter[ev.DPEvent], delta: float):
        """Valid bounds from analysing two parts of ``atoms`` separately (basic composition over a δ split).

        Parts tried, each against the rest: the atoms without an RDP curve ((ε, δ) steps, composed exactly by
        basic composition); the Poisson-subsampled atoms with them (their numerical analysis is much tighter
        than RDP, while exponential mechanisms keep their bounded-range RDP); every atom a numerical
        accountant (PLD) takes. Each part gets its own best analysis (cached).
        """
        approx = Counter({a: n for a, n in atoms.items() if ev.RDP not in a.supported_accountants})
        rest = atoms - approx
        if approx and rest and all(ev.BASIC in a.supported_accountants for a in approx):
            eps_a, delta_a = _basic_totals(approx)
            yield add_up(eps_a, self._cached(rest, left_over(delta, delta_a))) if delta_a < delta else math.inf
        numerical = {m.name for m in self.members} & ev.NUMERICAL
        if not numerical:
            return
        takes = {a for a in atoms if numerical & a.supported_accountants}
        sampled = {a for a in takes if isinstance(a, ev.PoissonSampledEvent) or a in approx}
        tried: list[frozenset[ev.DPEvent]] = []
        for chosen in (sampled, takes):
            first = Counter({a: n for a, n in atoms.items() if a in chosen})
            rest = atoms - first
            if not first or not rest or frozenset(first) in tried:
                continue
            tried.append(frozenset(first))
            for share in DELTA_SPLITS:
                delta_first, delta_rest = split_delta(delta, share)
                yield add_up(self._cached(first, delta_first), self._cached(rest, delta_rest))


_NAMED: dict[str, type[Accountant]] = {
    "auto": TightestAccountant,
    ev.BASIC: BasicAccountant,
    ev.RDP: RDPAccountant,
    ev.PLD: PLDAccountant,
    ev.PRV: PRVAccountant,
}
_SHARED: dict[str, Accountant] = {}


def tightest() -> TightestAccountant:
    """The shared ``auto`` accountant, typed as such."""
    acc = get_accountant("auto")
    assert isinstance(acc, TightestAccountant)
    return acc


_SHARED_LOCK = threading.Lock()


def get_accountant(name: str | Accountant = "auto") -> Accountant:
    """The shared accountant called ``name`` (``auto``, ``basic``, ``rdp``, ``pld`` or ``prv``), or ``name`` itself.

    Args:
        name: an accountant's name, or an accountant.

    Raises:
        ConfigurationError: ``name`` names no accountant.
    """
    if isinstance(name, Accountant):
        return name
    if name not in _NAMED:
        raise ConfigurationError(f"unknown accountant {name!r}; choose one of {', '.join(_NAMED)}")
    with _SHARED_LOCK:
        if name not in _SHARED:
            _SHARED[name] = _NAMED[name]()
        return _SHARED[name]
