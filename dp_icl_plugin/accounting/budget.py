"""The shared budget manager: every release of anything derived from private data is charged here first.

One :class:`BudgetManager` is meant to be shared by every component of an app (example selector,
retriever, LLM): it composes everything charged so far with the tightest valid accountant, and either
commits a new charge atomically or refuses it with :class:`BudgetExhaustedError` and commits nothing.
There are no refunds. With an SQLite ledger the spend survives restarts and is shared safely by threads
and processes.

**One relation per ledger.** A ledger is created with one neighbouring relation (its budget's
``neighbouring``, replace-one by default) and its total is a guarantee under that relation. Every charge
is converted to it first (``conversion.to_relation``: itself, a direct analysis, or a stated conversion
such as group privacy); a charge with no valid conversion (a replace-one analysis into an add/remove
ledger) is refused with :class:`~dp_icl_plugin.errors.UnsupportedEventError` and nothing is committed.
The ledger stores each event as charged (its own relation) and converts when it analyses.

**Adaptivity.** The total holds for charges made in any order, each mechanism run on inputs chosen after
seeing earlier outputs (adaptive composition), when each charge's *parameters* (its event) do not depend on
earlier DP outputs: the usual case, where each component's configuration fixes its event. If an app picks
the next event from earlier outputs (stopping when the budget runs out included), the ledger is a privacy
filter; filters are proven for basic composition of (ε, δ) (Rogers et al. 2016) and for RDP at one order
fixed in advance (Feldman & Zrnic 2021), not for an order or a PLD chosen after the fact. Such an app should
fix its schedule of events in advance, or use ``accountant="basic"`` when every event is pure or (ε, δ)-DP
(no filter accountant for Gaussian or RDP events is provided yet).

**Filtered releases.** A :class:`~dp_icl_plugin.accounting.events.FilteredReleaseEvent` costs the ledger
nothing because an earlier entry, its cover, paid for every release of a per-record filter at once. So it is
admitted only if, in the transaction of the charge, ``covered_by`` names an entry of this ledger labelled
``<component>-filter:<owner>`` whose event is the filter's (ε, δ) under add/remove (what
``IndividualBudget.as_event`` gives), the release is labelled ``<component>-<kind>:<owner>`` with the same
component and owner (``knn-filter:<index id>`` covers ``knn-vote:<index id>``), and one release's
``per_unit`` cost is within the cover's (ε, δ) by basic composition or RDP (a release whose cost per unit
exceeds the filter's whole budget is one no unit can join, or one that bypassed the filter). Otherwise it is
refused with :class:`~dp_icl_plugin.errors.ConfigurationError` and nothing is committed.

**Watching charges.** :meth:`BudgetManager.on_charge` registers a callable that receives every entry this
manager commits (from any method, adapter or thread), after the commit and before the charging release goes
on: an audit log or a budget dashboard that does not depend on a framework's callbacks. It sees this process's
charges; :meth:`BudgetManager.history` has every process's.

Speed: the ledger keeps a count per distinct event, and the check tries the cheap valid bounds (basic
composition, RDP) before numerical PLD/PRV composition, stopping at the first bound that shows the charge
fits. Refusals and :meth:`BudgetManager.spent` use the tightest bound.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin._storage.postgres_connection import POSTGRES_SCHEMES
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.accountants import Accountant, TightestAccountant, get_accountant, left_over
from dp_icl_plugin.accounting.allowance import (
    admits,
    allowance_budget,
    allowance_orders,
    allowance_owner,
    draw_cost,
    drawn,
    epsilon_spent,
)
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.accounting.neighbouring import PER_RECORD
from dp_icl_plugin.accounting.privacy import PrivacyBudget, PrivacySpend
from dp_icl_plugin.accounting.stores import InMemoryStore, LedgerStore, LedgerTransaction, PostgresStore, SQLiteStore
from dp_icl_plugin.errors import (
    AllowanceSpentError,
    BudgetExhaustedError,
    ConfigurationError,
    ConfigurationTypeError,
    DPICLError,
    UnsupportedEventError,
)

__all__ = ["BudgetManager", "LedgerEntry"]

MAX_LABEL_LENGTH = 200
FILTER_COVER_SUFFIX = "-filter"
"""A filter's cover is labelled ``<component>-filter:<owner>``; its releases ``<component>-<kind>:<owner>``."""
RELEASE_NUMBER = "#"
"""A filtered release's label may end with ``#<n>``: its number under its cover, as its filter counted it."""
_POSTGRES_SCHEMES = POSTGRES_SCHEMES
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerEntry:
    """A committed charge.

    Attributes:
        id: the ledger's id for the charge (increasing in commit order).
        label: which component and call it was for.
        event: what was charged.
        timestamp: commit time, seconds since the epoch (UTC).
        certified_epsilon: the ε bound on the whole ledger that admitted this charge.
    """

    id: int
    label: str
    event: ev.DPEvent
    timestamp: float
    certified_epsilon: float

    @property
    def committed_at(self) -> _dt.datetime:
        """The commit time as an aware UTC datetime."""
        return _dt.datetime.fromtimestamp(self.timestamp, tz=_dt.UTC)


def _check_label(label: object) -> str:
    if not isinstance(label, str) or not label.strip():
        raise ConfigurationError("label must be a non-empty string naming the component and call")
    # isprintable() also refuses format characters (zero-width, bidi overrides) and lone surrogates.
    if len(label) > MAX_LABEL_LENGTH or not label.isprintable():
        raise ConfigurationError(f"label must be at most {MAX_LABEL_LENGTH} printable characters")
    return label


class BudgetManager:
    """Charges privacy events against one (ε, δ) budget, durably and atomically.

    Args:
        budget: the total budget and its neighbouring relation (``PrivacyBudget(1.0, 1e-5)`` is under
            replace-one). May be omitted when opening an existing ledger file.
        ledger: ``None`` for an in-memory ledger, a path for an SQLite ledger file, a
            ``postgresql://`` URL for the ledger ``"default"`` in a PostgreSQL database (needs the ``postgres``
            extra; :class:`~dp_icl_plugin.accounting.stores.PostgresStore` names others), or any
            :class:`~dp_icl_plugin.accounting.stores.LedgerStore`.
        accountant: ``"auto"`` (tightest valid bound; the default), ``"basic"``, ``"rdp"``, ``"pld"`` or
            ``"prv"``; see the module docstring for events chosen from earlier DP outputs.

    Raises:
        BudgetMismatchError: the ledger exists with a different budget or relation.
        LedgerError: the ledger file is missing (and no budget given), foreign or damaged.
    """

    def __init__(
        self,
        budget: PrivacyBudget | None = None,
        *,
        ledger: str | os.PathLike[str] | LedgerStore | None = None,
        accountant: str | Accountant = "auto",
    ) -> None:
        if budget is not None and not isinstance(budget, PrivacyBudget):
            raise ConfigurationTypeError("budget must be a PrivacyBudget")
        if ledger is None:
            store: LedgerStore = InMemoryStore()
        elif isinstance(ledger, LedgerStore):
            store = ledger
        elif isinstance(ledger, str) and ledger.startswith(_POSTGRES_SCHEMES):
            store = PostgresStore(ledger)
        elif isinstance(ledger, (str, os.PathLike)):
            store = SQLiteStore(ledger)
        else:
            raise ConfigurationError("ledger must be None, a path, or a LedgerStore")
        self._accountant = get_accountant(accountant)
        self._store = store
        self._budget = store.initialize(budget)
        self._decoded: dict[str, ev.DPEvent] = {}  # event key → the event converted to the ledger's relation
        self._decode_lock = threading.Lock()
        self._watchers: list[Callable[[LedgerEntry], object]] = []
        self._watchers_lock = threading.Lock()

    @classmethod
    def open(cls, ledger: str | os.PathLike[str], *, accountant: str | Accountant = "auto") -> BudgetManager:
        """Open an existing ledger (file or ``postgresql://`` URL) with the budget it was created with.

        Args:
            ledger: a ledger file or a ``postgresql://`` URL.
            accountant: as the constructor.

        Raises:
            LedgerError: the ledger is missing, foreign or damaged.
        """
        return cls(None, ledger=ledger, accountant=accountant)

    @property
    def budget(self) -> PrivacyBudget:
        """The total budget."""
        return self._budget

    @property
    def neighbouring(self) -> str:
        """The ledger's neighbouring relation: every total it reports is a guarantee under it."""
        return self._budget.neighbouring

    @property
    def privacy_unit(self) -> str:
        """What the ledger's relation changes: one ``"record"`` or all records of one ``"unit"`` (a person)."""
        return self._budget.privacy_unit

    @property
    def location(self) -> str | os.PathLike[str] | None:
        """Where the ledger lives (an SQLite file's path, a PostgreSQL URL as given), so that private state
        whose cover it holds can be kept beside it and reopened; None for an in-memory ledger."""
        return self._store.location

    @property
    def ledger_name(self) -> str | None:
        """The ledger's name within its store (a PostgreSQL database holds several); None for one ledger a store."""
        return self._store.name

    @property
    def in_memory(self) -> bool:
        """Whether the ledger lives in this process's memory only (gone at exit)."""
        return isinstance(self._store, InMemoryStore)

    def __repr__(self) -> str:
        b = self._budget
        relation = f"neighbouring={b.neighbouring!r}"
        if b.privacy_unit != PER_RECORD:
            relation += f", privacy_unit={b.privacy_unit!r}"
        return f"BudgetManager(epsilon={b.epsilon}, delta={b.delta}, {relation}, ledger={self._store!r})"

    # -- charging ---------------------------------------------------------------------------------
    def spend(self, event: ev.DPEvent, *, label: str) -> LedgerEntry:
        """Charge ``event``: commit it if everything charged so far plus it fits the budget.

        Args:
            event: what the release costs (converted to the ledger's relation when it is under another).
            label: which component and call it is for (printable, at most 200 characters; never private data).

        Returns:
            The committed ledger entry. Release the private result only after this returns.

        Raises:
            BudgetExhaustedError: the charge would overspend; nothing was committed.
            UnsupportedEventError: the event has no valid analysis under the ledger's relation (nothing
                was committed).
            ConfigurationError: bad event or label, or a filtered release without a valid cover (see the
                module docstring); nothing was committed.
        """
        label = _check_label(label)
        event = self._check_event(event)
        key = ev.event_key(event)
        # Decide once without the lock (this may run the slow numerical analysis and fills the caches);
        # inside the exclusive section the decision is only recomputed if another charge landed meanwhile.
        seen = self._store.event_counts()
        seen_bound = self._admitting_bound(self._total(seen, event))
        with self._store.transaction() as tx:
            self._check_covers(tx, event, label)  # raising here rolls the transaction back
            counts = tx.event_counts()
            total = self._total(counts, event)
            certified = seen_bound if counts == seen else self._admitting_bound(total)
            if certified is not None:
                timestamp = time.time()
                row_id = tx.append(timestamp=timestamp, label=label, event_key=key, certified_epsilon=certified)
        if certified is None:  # the transaction has ended (nothing appended): explain outside the lock
            raise self._refusal(event, total, counts)
        entry = LedgerEntry(row_id, label, event, timestamp, certified)
        self._tell_watchers(entry)
        return entry

    def on_charge(self, callback: Callable[[LedgerEntry], object]) -> Callable[[], None]:
        """Call ``callback(entry)`` with every entry this manager commits from now on.

        It runs in the charging thread, after the commit and before the release that charged goes on: inside
        the release's :class:`~dp_icl_plugin.timing.FixedLatency` window when it has one, and while other
        answers of the same decoder wait for their charge. So it must be quick (hand the entry to a queue for
        slow work): a slow callback lengthens every release, and one that overruns a fixed-latency window
        shows in the release's timing. An exception it raises is logged and swallowed: the charge stands, and
        failing the release after it would spend the budget for nothing. Refused charges commit nothing and
        are not reported.

        Args:
            callback: a callable taking the :class:`LedgerEntry` (id, label, event, timestamp, the ledger's
                certified ε after it): no record's text, id or count. Its timestamp, and the moment the
                callback runs, are when the charge was committed; for a kNN release that follows the
                retrieval of private neighbours, so, like :meth:`history`'s timestamps, keep them from
                whoever a fixed latency hides the release's timing from.

        Returns:
            A function that unregisters ``callback``.

        Raises:
            ConfigurationError: ``callback`` is not callable.
        """
        if not callable(callback):
            raise ConfigurationError("on_charge takes a callable")
        with self._watchers_lock:
            self._watchers.append(callback)

        def unregister() -> None:
            with self._watchers_lock:
                if callback in self._watchers:
                    self._watchers.remove(callback)

        return unregister

    def _tell_watchers(self, entry: LedgerEntry) -> None:
        with self._watchers_lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            try:
                watcher(entry)
            except Exception:  # the charge is committed: a watcher's failure must not throw the release away
                _log.exception("an on_charge callback failed on ledger entry %s (the charge stands)", entry.id)

    def would_fit(self, event: ev.DPEvent, *, label: str | None = None) -> bool:
        """Dry run of :meth:`spend`: whether ``event`` would be admitted now (nothing is committed).

        Raises what :meth:`spend` would raise for a bad event; a filtered release's cover is checked too
        (whether it covers this release's owner only when ``label`` is given).

        Args:
            event: the event to try.
            label: the label it would be charged under, or None.

        Raises:
            UnsupportedEventError: the event has no valid analysis under the ledger's relation.
            ConfigurationError: a bad event or label, or a filtered release without a valid cover.
        """
        if label is not None:
            label = _check_label(label)
        event = self._check_event(event)
        if _filtered(event):
            with self._store.transaction() as tx:  # appends nothing: commits nothing
                self._check_covers(tx, event, label)
        return self._admitting_bound(self._total(self._store.event_counts(), event)) is not None

    # -- reading ----------------------------------------------------------------------------------
    def spent(self) -> PrivacySpend:
        """Tightest ε of everything charged so far, at the budget's δ (0 for an empty ledger)."""
        return PrivacySpend(self._spent_epsilon(self._store.event_counts()), self._budget.delta)

    def remaining(self) -> PrivacySpend:
        """Budget ε minus spent ε (at the budget's δ), never below 0.

        Composition is not additive, so an event of ε = remaining may still be refused (or, thanks to
        tighter composition, a larger one admitted): use :meth:`would_fit` to decide.
        """
        return PrivacySpend(_remaining(self._budget.epsilon, self.spent().epsilon), self._budget.delta)

    def history(self) -> list[LedgerEntry]:
        """Every committed charge, oldest first, with its event as charged (under its own relation)."""
        return [
            LedgerEntry(r.id, r.label, ev.event_from_dict(json.loads(r.event_key)), r.timestamp, r.certified_epsilon)
            for r in self._store.rows()
        ]

    def covered_releases(self, cover_id: int) -> int:
        """How many releases the filter under the cover entry ``cover_id`` must have counted, by this ledger: the
        highest release number recorded under it (``#<n>`` ending a release's label), and at least the number of
        releases recorded (a filter that counts fewer was rolled back: ``RenyiFilter.check_releases``).

        Args:
            cover_id: a cover entry's id.

        Raises:
            ConfigurationError: ``cover_id`` is not an entry labelled as a filter's cover.
        """
        rows = list(self._store.rows())
        cover = next((r for r in rows if r.id == cover_id), None)
        owner = None if cover is None else _cover_owner(cover.label)
        if owner is None:
            raise ConfigurationError(f"entry {cover_id} of this ledger is not a filter's cover")
        component, name = owner
        covered = [
            r
            for r in rows
            if r.id > cover_id
            and _release_owner(r.label, component) == name
            and any(f.covered_by == cover_id for f in _filtered(ev.event_from_dict(json.loads(r.event_key))))
        ]
        numbers = [n for r in covered if (n := _release_number(r.label)[1]) is not None]
        return max([len(covered), *numbers])

    def label_counts(self) -> dict[str, int]:
        """Number of committed charges per label (a filtered release's without its release number ``#<n>``)."""
        return dict(Counter(_release_number(r.label)[0] for r in self._store.rows()))

    def close(self) -> None:
        """Close the ledger store."""
        self._store.close()

    # -- internals --------------------------------------------------------------------------------
    def _check_event(self, event: object) -> ev.DPEvent:
        """``event`` as charged (validated: it converts to the ledger's relation and can be analysed)."""
        if not isinstance(event, ev.DPEvent):
            raise ConfigurationError(f"expected a DPEvent, got {type(event).__name__}")
        unit = self._budget.privacy_unit
        if event.privacy_unit != unit:
            raise UnsupportedEventError(
                f"a {event.privacy_unit}-level event cannot be charged to this {unit}-level ledger: "
                + (
                    "a guarantee for one record says nothing of a unit with many records (run the method with the "
                    "ledger's privacy_unit, on records that name their unit)"
                    if unit != PER_RECORD
                    else "this ledger certifies record-level totals; open a ledger with privacy_unit='unit' for it"
                )
            )
        self._accountant.require_supported(self._converted(event))
        return event

    def _check_covers(self, tx: LedgerTransaction, event: ev.DPEvent, label: str | None) -> None:
        """Refuse a filtered release in ``event`` whose ``covered_by`` is not a cover of its filter (module
        docstring); ``label`` None skips the owner check (a dry run without a label)."""
        for release in _filtered(event):
            entry_id = release.covered_by
            row = tx.entry(entry_id)
            if row is None:
                raise ConfigurationError(
                    f"filtered release: covered_by={entry_id} names no entry {entry_id} of this ledger (the filter's "
                    "cover must be charged first); nothing was committed"
                )
            cover = ev.event_from_dict(json.loads(row.event_key))
            if allowance_owner(row.label) is not None:
                self._check_draw(tx, entry_id, row.label, cover, event, label)
                continue
            cover_owner = _cover_owner(row.label)
            if cover_owner is None or not isinstance(cover, ev.ApproxDPEvent) or cover.neighbouring != ev.ADD_REMOVE:
                raise ConfigurationError(
                    f"filtered release: entry {entry_id} ({row.label!r}, a {cover.type_name} event) is not a filter "
                    "cover (a '<component>-filter:<owner>' charge of the filter's (epsilon, delta) under add_remove); "
                    "nothing was committed"
                )
            if label is not None and _release_owner(label, cover_owner[0]) != cover_owner[1]:
                raise ConfigurationError(
                    f"filtered release: entry {entry_id} covers {row.label!r}, another filter than this release's "
                    f"{label!r} (a release of it is labelled '<component>-<kind>:<owner>' with the cover's component "
                    "and owner); nothing was committed"
                )
            unit_epsilon = _unit_epsilon(cover, release.per_unit)
            if unit_epsilon is None or unit_epsilon > cover.epsilon:
                cost = (
                    "cannot be analysed under add_remove" if unit_epsilon is None else f"is epsilon={unit_epsilon:.6g}"
                )
                raise ConfigurationError(
                    f"filtered release: one release's cost per unit {cost} at its cover's delta={cover.delta}, more "
                    f"than its cover (entry {entry_id}: epsilon={cover.epsilon}) holds; the filter could admit no unit "
                    "to it; nothing was committed"
                )

    def _check_draw(
        self,
        tx: LedgerTransaction,
        cover_id: int,
        cover_label: str,
        cover: ev.DPEvent,
        event: ev.DPEvent,
        label: str | None,
    ) -> None:
        """Refuse a draw on the allowance whose cover is entry ``cover_id`` unless it is labelled as one of its
        draws and every draw under the cover so far plus ``event``'s own fit the cover's caps
        (:mod:`~dp_icl_plugin.accounting.allowance`), all read in this transaction."""
        component, owner = allowance_owner(cover_label) or ("", "")
        if label is not None and _release_owner(label, component) != owner:
            raise ConfigurationError(
                f"allowance draw: entry {cover_id} is the allowance {cover_label!r}, and its draws are labelled "
                f"'{component}-<kind>:{owner}', not {label!r}; nothing was committed"
            )
        relation = self._budget.neighbouring
        budget = allowance_budget(cover, relation, allowance_orders(cover_label))
        cost = np.zeros(len(budget.orders))
        for atom, n in ev.atoms(event).items():
            if isinstance(atom, ev.FilteredReleaseEvent) and atom.covered_by == cover_id:
                cost = cost + n * draw_cost(atom.per_unit, relation, budget.orders)
        spent = drawn(tx.event_counts(), cover_id, relation, budget.orders)
        if not admits(budget, spent, cost):
            used = epsilon_spent(budget, spent)
            raise AllowanceSpentError(
                f"allowance {cover_label!r} (entry {cover_id}: epsilon={budget.epsilon}, delta={budget.delta}) "
                f"cannot pay this draw: its draws so far used epsilon {used:.4g} of it; nothing was committed",
                requested_epsilon=epsilon_spent(budget, cost, capped=False),
                remaining_epsilon=_remaining(budget.epsilon, used),
                total_epsilon=epsilon_spent(budget, spent + cost, capped=False),
            )

    def _converted(self, event: ev.DPEvent) -> ev.DPEvent:
        return to_relation(event, self._budget.neighbouring)

    def _decode(self, key: str) -> ev.DPEvent:
        with self._decode_lock:
            event = self._decoded.get(key)
        if event is None:
            event = self._converted(ev.event_from_dict(json.loads(key)))
            with self._decode_lock:
                self._decoded[key] = event
        return event

    def _total(self, counts: Counter[str], extra: ev.DPEvent | None) -> ev.DPEvent:
        parts: list[ev.DPEvent] = [ev.SelfComposedEvent(self._decode(k), n) for k, n in counts.items() if n > 0]
        if extra is not None:
            parts.append(self._converted(extra))
        return ev.compose(*parts)

    def _admitting_bound(self, total: ev.DPEvent) -> float | None:
        """A valid ε bound on ``total`` within the budget (the cheapest found), or None: refuse."""
        b = self._budget
        if isinstance(self._accountant, TightestAccountant):
            return self._accountant.first_fitting(total, epsilon=b.epsilon, delta=b.delta)
        eps = self._epsilon(total)
        return eps if eps <= b.epsilon else None

    def _epsilon(self, event: ev.DPEvent) -> float:
        return self._accountant.epsilon(event, delta=self._budget.delta)

    def _spent_epsilon(self, counts: Counter[str]) -> float:
        return self._epsilon(self._total(counts, None)) if counts else 0.0

    def _why(self, event: ev.DPEvent) -> str:
        """What a refusal's figures owe to the event's own terms: a conversion between relations (which doubles
        ε and grows δ), and a δ above the ledger's (which no ε can pay for at the ledger's δ)."""
        b, converted = self._budget, self._converted(event)
        parts = []
        if event.neighbouring != b.neighbouring:
            parts.append(
                f"the event holds under {event.neighbouring} and is charged to this {b.neighbouring} ledger by group "
                "privacy over two records: epsilon doubles, delta grows by (1 + e^epsilon)"
            )
        deltas = [a.delta for a in ev.atoms(converted) if isinstance(a, ev.ApproxDPEvent)]
        if deltas and max(deltas) > b.delta:
            parts.append(
                f"its delta{' after that conversion' if parts else ''} is {max(deltas):.3g}, above the "
                f"ledger's {b.delta:g}: no epsilon is finite at the ledger's delta"
            )
        return "".join(f"; {p}" for p in parts)

    def _refusal(self, event: ev.DPEvent, total: ev.DPEvent, counts: Counter[str]) -> BudgetExhaustedError:
        b = self._budget
        total_eps = self._epsilon(total)
        requested = self._epsilon(self._converted(event))
        remaining = _remaining(b.epsilon, self._spent_epsilon(counts))
        return BudgetExhaustedError(
            f"charge refused: epsilon would reach {_fmt(total_eps)} > budget {b.epsilon} at delta={b.delta} "
            f"(this charge alone: {_fmt(requested)}; remaining: {_fmt(remaining)}){self._why(event)}; nothing "
            "was committed",
            requested_epsilon=requested,
            remaining_epsilon=remaining,
            total_epsilon=total_eps,
        )


def _filtered(event: ev.DPEvent) -> list[ev.FilteredReleaseEvent]:
    return [a for a in ev.atoms(event) if isinstance(a, ev.FilteredReleaseEvent)]


def _cover_owner(label: str) -> tuple[str, str] | None:
    """(component, owner) of a cover's label ``<component>-filter:<owner>``, or None if it is not one."""
    head, colon, owner = label.partition(":")
    component = head.removesuffix(FILTER_COVER_SUFFIX)
    if not colon or not owner or not component or component == head:
        return None
    return component, owner


def _release_number(label: str) -> tuple[str, int | None]:
    """A label without its release number ``#<n>``, and the number (None when it has none)."""
    base, mark, number = label.rpartition(RELEASE_NUMBER)
    if mark and number.isdigit() and number.isascii():
        return base, int(number)
    return label, None


def _release_owner(label: str, component: str) -> str | None:
    """The owner of a release label ``<component>-<kind>:<owner>[#<n>]`` (not a cover's), or None."""
    head, colon, owner = _release_number(label)[0].partition(":")
    kind = head.removeprefix(component + "-")
    if not colon or kind == head or not kind or head == component + FILTER_COVER_SUFFIX:
        return None
    if allowance_owner(label) is not None:  # a cover's label is never a release's
        return None
    return owner


def _unit_epsilon(cover: ev.ApproxDPEvent, per_unit: ev.DPEvent) -> float | None:
    """ε of one release's per-unit cost at the cover's δ (under add/remove), or None if it has no analysis.

    Basic composition or RDP at the shared accountant's orders (which hold the filter's default orders): a
    unit the filter can admit has an RDP cost within a cap that converts to the cover's ε at a δ no larger than
    the cover's, so its release always passes. The numerical PLD analysis is not run: its cost grows without
    bound for the tiny noise this check exists to refuse.
    """
    try:
        unit = to_relation(per_unit, ev.ADD_REMOVE)
    except DPICLError:
        return None
    found = [
        get_accountant(n).epsilon(unit, delta=cover.delta)
        for n in (ev.BASIC, ev.RDP)
        if n in unit.supported_accountants
    ]
    return min(found, default=None)


def _remaining(budget: float, spent: float) -> float:
    """``budget`` − ``spent`` rounded down, never below 0."""
    return left_over(budget, spent) if spent < budget else 0.0


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"
