"""Hide the timing side channel: every private release takes one fixed wall-clock time.

How long a release takes depends on private data: a kNN release does more work when more records are
candidates, a decoder's forward passes grow with the private prompts' lengths, an answer that stops early
returns sooner. DP covers what a release *returns*, not when it returns. :class:`FixedLatency` pads each
release to ``seconds`` after it starts (success and failure alike), so a caller who can only observe the
response sees the same latency whatever the private data. Streams under it release the whole answer at the
end in one piece (a token stream's rhythm is a timing channel too).

The padding only hides what finishes in time: a release that runs past ``seconds`` returns late, and its
lateness depends on private data. Each overrun is counted (:attr:`FixedLatency.overruns`) and logged as a
warning (the duration only, nothing private); choose ``seconds`` above the slowest release you measured
(:attr:`FixedLatency.slowest`) with a margin.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["FixedLatency", "as_fixed_latency"]

logger = logging.getLogger(__name__)


class FixedLatency:
    """Pad every release to ``seconds`` of wall-clock time (``time.monotonic``), counting overruns.

    Share one instance between components to read their overruns together; it is thread-safe.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = check.positive_finite("seconds", seconds)
        self.releases = 0
        self.overruns = 0
        self.slowest = 0.0  # the longest release before padding, in seconds
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FixedLatency(seconds={self.seconds}, releases={self.releases}, overruns={self.overruns})"

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Run the block, then sleep until ``seconds`` after it started (also when it raises)."""
        started = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            with self._lock:
                self.releases += 1
                self.slowest = max(self.slowest, elapsed)
                late = elapsed > self.seconds
                if late:
                    self.overruns += 1
            if late:
                logger.warning(
                    "a private release took %.3f s, past its fixed latency of %.3f s: its timing is not hidden; "
                    "raise the latency",
                    elapsed,
                    self.seconds,
                )
            else:
                time.sleep(self.seconds - elapsed)


def as_fixed_latency(value: float | FixedLatency | None) -> FixedLatency | None:
    """Accept a number of seconds, a shared :class:`FixedLatency`, or ``None`` (timing not hidden)."""
    if value is None or isinstance(value, FixedLatency):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"fixed_latency must be seconds or a FixedLatency, got {type(value).__name__}")
    return FixedLatency(value)
