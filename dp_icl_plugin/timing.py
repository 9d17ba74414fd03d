"""Hide the timing side channel: every private release takes one fixed wall-clock time.

How long a release takes depends on private data: a kNN release does more work when more records are
candidates, a decoder's forward passes grow with the private prompts' lengths, an answer that stops early
returns sooner. DP covers what a release *returns*, not when it returns. :class:`FixedLatency` pads each
release to ``seconds`` after it starts (success and failure alike), so a caller who can only observe the
response sees the same latency whatever the private data. Streams under it release the whole answer at the
end in one piece (a token stream's rhythm is a timing channel too).

Releases under one :class:`FixedLatency` run one at a time, each whole inside its own window: run side by
side, each window would hold the others' private computation. A release waits for the windows ahead of it
*before* its own starts (that wait depends on how many came first, and on nothing private while every window
ends on time, served first come first served), and a caller that gives up while waiting (``cancelled``,
which the decoders' async paths set) leaves before anything is charged.
Share one instance between components that share a machine, so that they too take turns.

The padding only hides what finishes in time: a release that runs past ``seconds`` returns late, and its
lateness depends on private data; so does the wait of every release queued behind it. Each overrun is
counted (:attr:`FixedLatency.overruns`) and logged as one fixed warning (:data:`OVERRUN_WARNING`). Neither
holds how long a release took: that duration is exactly what the padding hides, so it is kept nowhere (no
attribute, ``repr`` or log line). Choose ``seconds`` above the slowest release measured with a margin, timed
on public or synthetic records (``benchmarks/``), never by reading the durations of private releases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["OVERRUN_WARNING", "FixedLatency", "ReleaseCancelled", "Turns", "as_fixed_latency"]

_POLL = 0.05  # seconds between checks of a waiting caller's cancellation

logger = logging.getLogger(__name__)

OVERRUN_WARNING = (
    "a private release overran its fixed latency window: its timing is not hidden (nor the wait of releases queued "
    "behind it); raise fixed_latency"
)
"""The warning logged for each overrun: one fixed text, with no duration (a release's duration is private)."""


class ReleaseCancelled(Exception):
    """The caller gave up while its release waited for its window: nothing ran, nothing was charged."""


class Turns:
    """One block at a time, first come first served; a caller that gives up while waiting leaves its place.

    Thread-safe. A block nested in another on the same thread is refused (it would wait for itself).
    """

    def __init__(self, what: str = "a release") -> None:
        self._what = what
        self._turns = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._owner: int | None = None  # the thread whose turn it is

    @contextmanager
    def hold(self, cancelled: threading.Event | None = None) -> Iterator[None]:
        """Wait for this caller's turn, then run the block.

        Args:
            cancelled: set by a caller that gives up while waiting, or None.

        Raises:
            ReleaseCancelled: ``cancelled`` was set before the turn came (the block never ran).
            ConfigurationError: a block nested in another on the same thread.
        """
        self._take_turn(cancelled)  # its turn is served from here on, whatever interrupts what follows
        try:
            if cancelled is not None and cancelled.is_set():  # gave up just as its turn came: nothing runs
                raise ReleaseCancelled
            yield
        finally:
            with self._turns:
                self._owner = None
                self._advance()

    def _take_turn(self, cancelled: threading.Event | None) -> None:
        with self._turns:
            if self._owner == threading.get_ident():
                raise ConfigurationError(
                    f"{self._what} nested inside another that takes the same turns would wait for itself; give the "
                    "inner component its own"
                )
            ticket = self._next_ticket
            self._next_ticket += 1
            try:
                while self._serving != ticket:
                    if cancelled is not None and cancelled.is_set():
                        raise ReleaseCancelled
                    self._turns.wait(timeout=_POLL)
            except BaseException:  # cancelled, or interrupted (KeyboardInterrupt) while waiting: leave the queue
                if self._serving == ticket:
                    self._advance()
                else:
                    self._abandoned.add(ticket)
                raise
            self._owner = threading.get_ident()

    def _advance(self) -> None:
        """Serve the next ticket that is still waiting (the caller holds ``_turns``)."""
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._turns.notify_all()


class FixedLatency:
    """Pad every release to ``seconds`` of wall-clock time (``time.monotonic``), one release at a time,
    counting overruns.

    Share one instance between components (they then take turns, and their overruns are read together); it
    is thread-safe.

    Attributes:
        seconds: the window (public configuration).
        releases: how many releases ran (a count of calls, public).
        overruns: how many ran past ``seconds``. Whether a release overran depends on private data; the count
            is kept because an overrun is the failure the operator must see to raise ``seconds``, and it holds
            no more than the late answer already showed its caller (one bit per release, no duration). Treat
            it like the warning log: for operators, not for publication.

    Args:
        seconds: the window, positive.

    Raises:
        ConfigurationError: ``seconds`` is not positive and finite.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = check.positive_finite("seconds", seconds)
        self.releases = 0
        self.overruns = 0
        self._lock = threading.Lock()
        self._turns = Turns("a release under a FixedLatency")  # one window at a time, first come first served
        self._opened: float | None = None  # the open window's start (pacer), or None
        self._step_late = False  # a paced step of the open window was late (counted once, at its end)

    def __repr__(self) -> str:
        return f"FixedLatency(seconds={self.seconds}, releases={self.releases}, overruns={self.overruns})"

    @contextmanager
    def hold(self, cancelled: threading.Event | None = None) -> Iterator[None]:
        """Wait for this release's turn (first come, first served), run the block, then sleep until
        ``seconds`` after it started (also when it raises).

        Args:
            cancelled: set by a caller that gives up while waiting, or None.

        Raises:
            ReleaseCancelled: ``cancelled`` was set before the window opened (the block never ran).
            ConfigurationError: a release nested in another under this policy, on the same thread (it would
                wait for itself).
        """
        with self._turns.hold(cancelled), self._window():
            yield

    def pacer(self, steps: int) -> Callable[[int], None]:
        """Inside a window: ``pace(n)`` sleeps until the n-th of ``steps`` equal parts of the window (from its
        opening) has passed, so that a release whose steps each commit something others can see (an answer paid
        per token: a ledger entry a token) commits them on a public schedule, not when its private computation
        happens to finish. A step already late goes at once, and the release counts as one overrun (with the
        warning), like a late window: one bit per release, whichever steps were late.

        Args:
            steps: how many equal parts the window is cut into (public: the release's most steps).

        Raises:
            ConfigurationError: ``steps`` is not a positive int.
        """
        steps = check.positive_int("steps", steps)
        started = self._opened if self._opened is not None else time.monotonic()

        def pace(step: int) -> None:
            delay = started + self.seconds * step / steps - time.monotonic()  # private: used for the wait only
            if delay > 0:
                time.sleep(delay)
            else:  # late: the window counts one overrun for the whole release, as for a late window
                self._step_late = True

        return pace

    @contextmanager
    def _window(self) -> Iterator[None]:
        started = time.monotonic()
        self._opened, self._step_late = started, False  # windows run one at a time (the turns)
        try:
            yield
        finally:
            elapsed = time.monotonic() - started  # private: used for the padding only, never kept or shown
            late = elapsed > self.seconds or self._step_late
            self._opened, self._step_late = None, False
            with self._lock:
                self.releases += 1
                if late:
                    self.overruns += 1
            if late:
                logger.warning(OVERRUN_WARNING)
            if elapsed < self.seconds:  # padded to the window also when only a paced step was late
                time.sleep(self.seconds - elapsed)


def as_fixed_latency(value: float | FixedLatency | None) -> FixedLatency | None:
    """Accept a number of seconds, a shared :class:`FixedLatency`, or ``None`` (timing not hidden).

    Args:
        value: seconds, a :class:`FixedLatency`, or None.

    Returns:
        ``value`` itself, a new :class:`FixedLatency` of that many seconds, or None.

    Raises:
        ConfigurationError: another type, or seconds that are not positive and finite.
    """
    if value is None or isinstance(value, FixedLatency):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"fixed_latency must be seconds or a FixedLatency, got {type(value).__name__}")
    return FixedLatency(value)
