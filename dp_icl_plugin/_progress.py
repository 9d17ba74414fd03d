"""Progress for long work on stderr: a tqdm bar on a terminal; elsewhere (a log, a CI job, a pipe) plain lines
at most every :data:`LINE_INTERVAL_S` seconds where the entry point asked for them; otherwise silent."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from tqdm.auto import tqdm

__all__ = ["LINE_INTERVAL_S", "ProgressBar", "progress_bar", "report_lines_off_a_terminal"]

LINE_INTERVAL_S = 30.0
_lines_off_a_terminal = False


def report_lines_off_a_terminal(enabled: bool = True) -> None:
    """Make ``progress_bar(enabled=None)`` print plain lines when stderr is not a terminal (a command line
    program's choice: a library stays silent there)."""
    global _lines_off_a_terminal
    _lines_off_a_terminal = enabled


class ProgressBar(Protocol):
    """What :func:`progress_bar` returns: a tqdm bar, plain lines or silence."""

    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


class _Silent:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


class _Lines:
    """``desc: done/total unit (p %), elapsed, about … left`` on stderr, at most every LINE_INTERVAL_S seconds,
    and once at the end."""

    def __init__(self, total: int, desc: str, unit: str, initial: int) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.started = self.last = time.monotonic()
        self._write("started")

    def _write(self, note: str = "") -> None:
        elapsed = time.monotonic() - self.started
        share = self.done / self.total if self.total else 1.0
        left = f", about {elapsed / share - elapsed:.0f} s left" if 0 < share < 1 else ""
        print(
            f"{self.desc}: {self.done}/{self.total} {self.unit}s ({100 * share:.0f} %), {elapsed:.0f} s{left}"
            f"{' ' + note if note else ''}",
            file=sys.stderr,
            flush=True,
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        if time.monotonic() - self.last >= LINE_INTERVAL_S:
            self.last = time.monotonic()
            self._write()

    def set_postfix(self, **kwargs: Any) -> None: ...

    def close(self) -> None:
        self._write("done" if self.done >= self.total else "stopped")


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool | None = True, initial: int = 0) -> ProgressBar:
    """A tqdm bar, plain lines, or an object with the same ``update``/``set_postfix``/``close`` that prints
    nothing.

    ``enabled=None`` shows the bar only when stderr is a terminal; off one, lines where
    :func:`report_lines_off_a_terminal` asked for them, else nothing.
    """
    if enabled is None:
        if not sys.stderr.isatty():
            return _Lines(total, desc, unit, initial) if _lines_off_a_terminal else _Silent()
        enabled = True
    if not enabled:
        return _Silent()
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, file=sys.stderr)
