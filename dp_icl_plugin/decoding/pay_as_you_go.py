"""Pay as you go: a decoder's share kept on the ledger as an allowance and paid one token mechanism at a time.

Per answer (the default), an answer is charged before its first token for every token mechanism it could run
(its limit), and stopping early refunds nothing. Per token (``pay_per_token=True`` on
:class:`~dp_icl_plugin.decoding.decoders.MozoDecoder` or
:class:`~dp_icl_plugin.decoding.decoders.ClipBlendDecoder`), the decoder's share (ε, δ) is charged to the ledger
once, as an allowance (:mod:`~dp_icl_plugin.accounting.allowance`), when its first answer starts; then each token
mechanism is committed as a draw on it *before* its rows are computed. An answer that ends at its
end-of-sequence token after 9 tokens has paid for 9, so the share serves more answers, or answers under less
noise (``expected_tokens``).

**The guarantee.** The draws form a privacy filter over the share (Feldman & Zrnic 2021; the ledger checks it in
each draw's transaction, :mod:`~dp_icl_plugin.accounting.allowance`): the whole sequence of answers is
(ε, δ)-DP under the ledger's relation, whatever decided how many tokens each answer ran, so long as that
decision reads only released tokens and public settings (it does: EOS, stop sequences, choices and schemas are
read from released tokens). The per-token event is the one per-answer charging composes (DPS-MOZO: (α, 4βα)-RDP
for the projected mechanism this library releases through, ``MozoTokenEvent``, after Flemings et al. Thm. B.3,
amplified by sampling without replacement; clip-blend: the bounded-range exponential mechanism of ε0, Bhusal et
al. eq. 2). DPS-MOZO's filter is at one order, ⌊α⌋ (its token is analysed at orders up to α only; no δ split);
clip-blend's at the 19 filter orders (δ split over them). The cost against a fixed schedule is mostly the
allowance's δ, a tenth of the ledger's by default (:func:`allowance_delta`): at the same number of tokens a share
paid per token gets a little more noise than one paid per answer (``dp-icl plan`` shows both).

**One answer at a time.** Answers drawing on one allowance at once would let one answer's speed, which depends on
the records it reads, decide where another is cut once the allowance runs out. So the answers of an allowance run
one at a time in a process, each whole (it streams in one piece at its end), in the order they asked
(:meth:`TokenAllowance.turn`); a caller that gives up while waiting leaves uncharged. An allowance must be drawn
on by one process at a time: replicas that answer at once need one allowance each (a restart may take a named
allowance over; :mod:`~dp_icl_plugin.decoding.allowance_lease` refuses a second process). First come first served
is only as private as the order answers arrive in: a private stage before the decoder needs its own
``fixed_latency``. The ledger holds an entry per token, with its time and its place in the ledger's order
(``BudgetManager.on_charge`` sees each): whoever reads the ledger sees how long each token took
(``fixed_latency`` hides the answer's length from its caller, not from the ledger).

**When the allowance is spent** mid-answer (a draw refused: public, it depends on earlier draws only), the answer
either ends there (``when_spent="stop"``, its ``finish_reason`` ``"length"``) or goes on with the public model's
greedy tokens, free (``when_spent="public"``: the zero-shot prompt and the released tokens only; no record is
read). An answer whose first token cannot be paid is refused with
:class:`~dp_icl_plugin.errors.AllowanceSpentError` before anything is computed.

**Restarts.** With ``allowance_name`` the allowance is found on the ledger by its label at the next start and
drawn on again (the ledger holds every draw, so the spend survives the restart with it). Without a name each
decoder object opens a new allowance: a restart pays a new one. A named allowance is held by one process at a
time (:mod:`~dp_icl_plugin.decoding.allowance_lease`): a second process opening it is refused before anything
is charged.
"""

from __future__ import annotations

import math
import os
import re
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.allowance import (
    ALLOWANCE_SUFFIX,
    admits,
    allowance_budget,
    allowance_label,
    allowance_owner,
    draw_cost,
    drawn,
)
from dp_icl_plugin.accounting.allowance import epsilon_spent as _epsilon_spent
from dp_icl_plugin.accounting.budget import BudgetManager, LedgerEntry
from dp_icl_plugin.accounting.individual_filter import _FIT_MARGIN, FILTER_ORDERS, IndividualBudget
from dp_icl_plugin.decoding.allowance_lease import AllowanceLease, ledger_identity
from dp_icl_plugin.errors import CalibrationError, ConfigurationError
from dp_icl_plugin.timing import Turns

__all__ = [
    "ALLOWANCE_DELTA_SHARE",
    "MANY_DRAWS",
    "WHEN_SPENT",
    "PerToken",
    "TokenAllowance",
    "allowance_delta",
    "calibrate_per_token",
    "mozo_filter_order",
    "per_token_settings",
]

WHEN_SPENT = ("stop", "public")
"""What an answer does when its allowance cannot pay its next token: end, or go on with the public model."""

ALLOWANCE_DELTA_SHARE = 0.1
"""An allowance's default δ, as a share of the ledger's: its cover is an (ε, δ) event, and the ledger certifies
everything at its own δ, so the cover's δ must leave the rest room."""


MANY_DRAWS = 10**9
"""What :meth:`TokenAllowance.draws_left` reports for an allowance that can pay this many draws or more."""


class _Shared:
    """What every object of one allowance in this process shares: the lock of its cover, its answers' turns and
    its lease (a process holds it once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turns = Turns("an answer paid per token")
        self.lease: AllowanceLease | None = None


_REGISTRY_LOCK = threading.Lock()
_SHARED: weakref.WeakValueDictionary[tuple[str, ...], _Shared] = weakref.WeakValueDictionary()


def _shared_of(key: tuple[str, ...]) -> _Shared:
    """This process's shared state of one allowance (kept while an object of it lives)."""
    with _REGISTRY_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = _Shared()
        return found


_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True)
class PerToken:
    """How a decoder pays per token.

    Attributes:
        allowance_name: the allowance's name on the ledger (found again at a restart), or None (a new one).
        when_spent: ``"stop"`` or ``"public"`` (:data:`WHEN_SPENT`).
        expected_tokens: the tokens an answer is expected to run, public: the noise is calibrated so that
            ``n_queries`` answers of this many fit the allowance (None: ``max_tokens``, every answer at its limit).
    """

    allowance_name: str | None = None
    when_spent: str = "stop"
    expected_tokens: int | None = None


def mozo_filter_order(order: float) -> float:
    """The one order of a DPS-MOZO allowance's filter: ⌊α⌋ (the token's bound holds at every order up to α, and
    sampling without replacement is analysed at integer orders).

    Args:
        order: DPS-MOZO's Rényi order α.

    Raises:
        ConfigurationError: α below 2 (no integer order at or under it).
    """
    whole = float(math.floor(order))
    if whole < 2:
        raise ConfigurationError(f"paid per token, DPS-MOZO needs an order of at least 2, got {order}")
    return whole


def allowance_delta(delta: float | None, budget: BudgetManager) -> float:
    """An allowance's δ: ``delta``, or :data:`ALLOWANCE_DELTA_SHARE` of the ledger's.

    Args:
        delta: the share's δ, or None.
        budget: the ledger.

    Raises:
        ConfigurationError: ``delta`` is not in (0, the ledger's δ): a cover at the ledger's δ or above would
            leave no finite ε for anything else.
    """
    ledger = float(budget.budget.delta)
    if delta is None:
        return ledger * ALLOWANCE_DELTA_SHARE
    value = check.probability_open("delta", delta)
    if not value < ledger:
        raise ConfigurationError(
            f"a per-token allowance's delta ({value:g}) must be below the ledger's ({ledger:g}): its cover is an "
            "(epsilon, delta) charge, and at the ledger's delta nothing else could be certified; leave delta unset "
            f"({ALLOWANCE_DELTA_SHARE:g} of the ledger's) or give a smaller one"
        )
    return value


def per_token_settings(
    pay_per_token: bool, allowance_name: str | None, when_spent: str, expected_tokens: int | None
) -> PerToken | None:
    """The decoders' per-token keywords, checked: a :class:`PerToken`, or None to pay per answer.

    Args:
        pay_per_token: pay per token (an allowance) instead of per answer.
        allowance_name: as :class:`PerToken`.
        when_spent: as :class:`PerToken`.
        expected_tokens: as :class:`PerToken`.

    Raises:
        ConfigurationError: a bad value, or a per-token setting without ``pay_per_token``.
    """
    if not isinstance(pay_per_token, bool):
        raise ConfigurationError("pay_per_token must be True or False")
    if when_spent not in WHEN_SPENT:
        raise ConfigurationError(f"when_spent must be one of {', '.join(WHEN_SPENT)}, got {when_spent!r}")
    if not pay_per_token:
        if allowance_name is not None or when_spent != "stop" or expected_tokens is not None:
            raise ConfigurationError(
                "allowance_name, when_spent and expected_tokens apply with pay_per_token=True only"
            )
        return None
    expected = None if expected_tokens is None else check.positive_int("expected_tokens", expected_tokens)
    return PerToken(allowance_name, when_spent, expected)


class TokenAllowance:
    """A decoder's share on the ledger, paid token by token (see the module docstring).

    Args:
        budget: the shared ledger.
        component: the decoder's kind (``"mozo"``, ``"clip-blend"``): the labels' prefix.
        epsilon: the share's ε.
        delta: the share's δ.
        name: the allowance's name on the ledger (letters, digits, ``_.-``; at most 64), found again at a
            restart; None: a new allowance for this object.
        orders: the filter's Rényi orders, fixed with the cover (one order: no δ split).

    Raises:
        ConfigurationError: a bad name, an ε too small for δ at every order, or the ledger holding an allowance of
            this name with another (ε, δ) or relation.
    """

    def __init__(
        self,
        budget: BudgetManager,
        *,
        component: str,
        epsilon: float,
        delta: float,
        name: str | None = None,
        orders: tuple[float, ...] = FILTER_ORDERS,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise ConfigurationError(
                "allowance_name must be 1 to 64 letters, digits, '_', '.' or '-' (it names the allowance on the ledger)"
            )
        self.budget = budget
        self.component = component
        self.owner = name if name is not None else uuid.uuid4().hex
        self.owner_named = name is not None
        self.label = allowance_label(component, self.owner, orders)
        self.draw_label = f"{component}-token:{self.owner}"
        self.cover_event = ev.with_privacy_unit(
            ev.ApproxDPEvent(epsilon, delta, neighbouring=budget.neighbouring), budget.privacy_unit
        )
        self.filter: IndividualBudget = allowance_budget(self.cover_event, budget.neighbouring, orders)
        self._shared = _shared_of((*ledger_identity(budget), component, self.owner))
        self._lock, self._turns = self._shared.lock, self._shared.turns
        if name is not None:  # one process at a time (an unnamed allowance no other process can name)
            with self._lock:
                lease = self._shared.lease
                if lease is None or lease.pid != os.getpid():
                    self._shared.lease = AllowanceLease(budget, f"{component}{ALLOWANCE_SUFFIX}:{self.owner}")
        self._cover: LedgerEntry | None = self._find_cover() if name is not None else None

    def __repr__(self) -> str:
        return f"TokenAllowance({self.label!r}, epsilon={self.filter.epsilon}, delta={self.filter.delta})"

    def _find_cover(self) -> LedgerEntry | None:
        """The ledger's cover of this name (the first, where two starts both charged one), checked; or None."""
        covers = [e for e in self.budget.history() if allowance_owner(e.label) == (self.component, self.owner)]
        for entry in covers:
            if entry.label != self.label:
                raise ConfigurationError(
                    f"the ledger holds the allowance {self.owner!r} with other filter orders ({entry.label!r}, not "
                    f"{self.label!r}: another DPS-MOZO order?); give this share another allowance_name"
                )
            if entry.event != self.cover_event:
                raise ConfigurationError(
                    f"the ledger holds the allowance {self.label!r} with another budget or relation "
                    f"({entry.event}); give this share another allowance_name"
                )
        return covers[0] if covers else None

    def _current_cover(self) -> LedgerEntry | None:
        """The cover, found again when another object of this allowance may have charged it since."""
        if self._cover is None and self.owner_named:
            with self._lock:
                if self._cover is None:
                    self._cover = self._find_cover()
        return self._cover

    @property
    def cover(self) -> LedgerEntry | None:
        """The ledger entry that paid for the allowance (None until the first draw charges it)."""
        return self._cover

    def draw(self, per_unit: ev.DPEvent) -> LedgerEntry:
        """Commit one draw of ``per_unit`` (charging the allowance's cover first if it is not on the ledger yet).

        Args:
            per_unit: the event of what the draw pays for (one token mechanism).

        Returns:
            The committed draw.

        Raises:
            AllowanceSpentError: the allowance cannot pay it; nothing committed.
            BudgetExhaustedError: the ledger cannot pay the cover (first draw only); nothing committed.
        """
        with self._lock:  # one cover per allowance in this process: found again here (another object may have
            # charged it since this one was made), else charged once
            if self._cover is None and self.owner_named:
                self._cover = self._find_cover()
            if self._cover is None:
                self._cover = self.budget.spend(self.cover_event, label=self.label)
                if self.owner_named:  # two starts that raced: every object draws on the first cover
                    self._cover = self._find_cover() or self._cover
            cover = self._cover
        event = ev.FilteredReleaseEvent(per_unit, cover.id, neighbouring=self.budget.neighbouring)
        return self.budget.spend(event, label=self.draw_label)

    def spent(self) -> tuple[int, float]:
        """The draws committed under this allowance (every process's) and the ε they have used at its δ.

        Returns:
            ``(draws, epsilon)``.
        """
        cover = self._current_cover()
        if cover is None:
            return 0, 0.0
        history = self.budget.history()
        counts = Counter(ev.event_key(e.event) for e in history)
        draws = sum(
            1 for e in history if isinstance(e.event, ev.FilteredReleaseEvent) and e.event.covered_by == cover.id
        )
        spent = drawn(counts, cover.id, self.budget.neighbouring, self.filter.orders)
        return draws, _epsilon_spent(self.filter, spent)

    def draws_left(self, per_unit: ev.DPEvent) -> int:
        """How many more draws of ``per_unit`` the allowance admits now (advisory, public: earlier draws' events
        only; the ledger decides each draw). Read it inside :meth:`turn`, where no answer is half-way.

        Args:
            per_unit: one draw's event.
        """
        cover = self._current_cover()
        spent = np.zeros(len(self.filter.orders))
        if cover is not None:
            spent = drawn(self.budget._store.event_counts(), cover.id, self.budget.neighbouring, self.filter.orders)
        cost = draw_cost(per_unit, self.budget.neighbouring, self.filter.orders)
        room = self.filter.caps * (1 - _FIT_MARGIN) - spent
        with np.errstate(divide="ignore", invalid="ignore"):
            fits = np.where(np.isfinite(room) & (room >= 0), np.floor(room / np.maximum(cost, 1e-300)), 0.0)
        n = int(min(np.max(fits, initial=0.0), MANY_DRAWS))
        if n >= MANY_DRAWS:
            return MANY_DRAWS
        for _ in range(64):  # the float sums the ledger compares may differ from the division by an ulp or two
            if n > 0 and not admits(self.filter, spent + (n - 1) * cost, cost):
                n -= 1
            elif admits(self.filter, spent + n * cost, cost):
                n += 1
            else:
                break
        return n

    @contextmanager
    def turn(self, cancelled: threading.Event | None = None) -> Iterator[None]:
        """Run the block as this allowance's only answer in this process (first come, first served).

        Args:
            cancelled: set by a caller that gives up while waiting, or None.

        Raises:
            ReleaseCancelled: ``cancelled`` was set before the turn came (the block never ran).
        """
        with self._turns.hold(cancelled):
            yield

    def epsilon_of(self, per_unit: ev.DPEvent, draws: int, *, capped: bool = True) -> float:
        """The ε ``draws`` draws of ``per_unit`` use of a fresh allowance like this one (public arithmetic).

        Args:
            per_unit: one draw's event.
            draws: how many.
            capped: at most the allowance's ε (False: the figure of draws it would refuse).
        """
        cost = draw_cost(per_unit, self.budget.neighbouring, self.filter.orders)
        return _epsilon_spent(self.filter, draws * cost, capped=capped)


def calibrate_per_token(
    make_event: Callable[[float], ev.DPEvent],
    *,
    steps: int,
    filter_budget: IndividualBudget,
    neighbouring: str,
    lo: float,
    hi: float,
    find: str,
    tolerance: float = 1e-9,
) -> float:
    """The parameter (β, 1/τ) whose ``steps`` token mechanisms fit a fresh allowance, by bisection.

    Args:
        make_event: one token's event for a parameter value (the privacy cost grows with the parameter when
            ``find="largest"``, shrinks when ``"smallest"``).
        steps: the token mechanisms the share is calibrated for (n_queries × expected tokens).
        filter_budget: the allowance's filter.
        neighbouring: the ledger's relation.
        lo: the search range's lower end.
        hi: its upper end.
        find: ``"largest"`` or ``"smallest"``.
        tolerance: the bracket width, relative to ``hi``.

    Returns:
        A value that was checked to fit (never past the target).

    Raises:
        CalibrationError: no value in range fits.
    """
    zero = np.zeros(len(filter_budget.orders))

    def fits(x: float) -> bool:
        return admits(filter_budget, zero, steps * draw_cost(make_event(x), neighbouring, filter_budget.orders))

    good, bad = (lo, hi) if find == "largest" else (hi, lo)
    if not fits(good):
        raise CalibrationError(
            f"no value in [{lo:.3g}, {hi:.3g}] lets {steps} token mechanisms fit an allowance of "
            f"epsilon={filter_budget.epsilon}, delta={filter_budget.delta}; raise epsilon or lower n_queries or "
            "expected_tokens"
        )
    if fits(bad):
        return bad
    while abs(bad - good) > tolerance * hi:
        mid = (good + bad) / 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
