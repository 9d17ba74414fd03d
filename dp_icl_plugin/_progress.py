"""Progress bars for long work (tqdm on stderr when installed and wanted; otherwise silent)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


class _Silent:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool | None = True, initial: int = 0) -> Any:
    """A tqdm bar, or an object with the same ``update``/``set_postfix``/``close`` that prints nothing.

    ``enabled=None`` shows the bar only when stderr is a terminal.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, file=sys.stderr)
