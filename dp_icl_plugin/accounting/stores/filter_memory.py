"""An individual Rényi filter's spend in this process's memory (:class:`MemoryFilterStore`).

It belongs to the process that made it: after a ``fork()`` (a pre-forking web server, ``multiprocessing``'s
``fork`` start method) every worker would hold its own copy of every unit's spend and let each unit spend its
budget once per worker, so it refuses use in any other process. Once its filter is moved to a file
(:meth:`~dp_icl_plugin.accounting.renyi_filter.RenyiFilter.move_to`) it is retired and refuses every use: a
unit's spend lives in one place only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.accounting.stores.filter_base import Read, Write, encode_spend
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["SEVERAL_WORKERS_HINT", "MemoryFilterStore"]

T = TypeVar("T")

SEVERAL_WORKERS_HINT = (
    "for several worker processes keep the index in a directory (SQLite: PrivateIndex(path='index-dir')) or in "
    "PostgreSQL (path='postgresql://...'), whose filter every worker shares"
)

Rows = dict[int, tuple[np.ndarray, float]]


class MemoryFilterStore:
    """Spend rows in a dictionary, behind one re-entrant lock; see the module docstring."""

    def __init__(self) -> None:
        self._rows: Rows = {}
        self._lock = threading.RLock()
        self._process = process_mark()  # refused in any other process
        self._retired: str | None = None  # why it may no longer be used
        self._releases: dict[str, int] = {}  # per release tag (the cover a release is recorded under)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def open(self, budget: IndividualBudget | None) -> IndividualBudget:
        if budget is None:
            raise ConfigurationError("an in-memory filter needs a budget")
        return budget

    def check_usable(self) -> None:
        """Refuse use in another process than the maker's (call before taking :attr:`lock`: a lock another thread
        held at ``fork()`` stays held in the child) or once retired (call again under the lock).

        Raises:
            ConfigurationError: another process, or retired.
        """
        if self._process != process_mark():
            raise ConfigurationError(
                f"this in-memory privacy filter was made in process {self._process[0]} and cannot be used in "
                f"another ({os.getpid()}): after a fork every worker would hold its own copy of every unit's spend "
                f"and let each record spend its budget once per worker; {SEVERAL_WORKERS_HINT}"
            )
        if self._retired is not None:
            raise ConfigurationError(self._retired)

    def create(
        self,
        budget: IndividualBudget,
        units: np.ndarray,
        spent: np.ndarray,
        spent_delta: np.ndarray,
        *,
        releases: dict[str, int] | None = None,
    ) -> IndividualBudget:
        self.check_usable()
        with self._lock:
            self.check_usable()
            if self._rows or self._releases:
                raise ConfigurationError("this in-memory filter exists already")
            self._write(units, spent, spent_delta)
            self._releases = dict(releases or {})
        return budget

    def atomically(
        self, orders: int, work: Callable[[Read, Write], T], *, write: bool = True, count_release: str | None = None
    ) -> Any:  # T, or (T, count) with count_release
        self.check_usable()
        with self._lock:
            self.check_usable()
            result = work(lambda ids: self._read(ids, orders), self._write)
            if count_release is None:
                return result
            self._releases[count_release] = self._releases.get(count_release, 0) + 1
            return result, self._releases[count_release]

    def release_counts(self) -> tuple[dict[str, int], bool]:
        self.check_usable()
        with self._lock:
            return dict(self._releases), True

    def adopt_releases(self, tag: str, count: int) -> None:
        self.check_usable()
        with self._lock:
            self._releases[tag] = max(self._releases.get(tag, 0), count)

    def all_rows(self) -> list[tuple[int, bytes, float]]:
        self.check_usable()
        with self._lock:
            self.check_usable()
            return [(unit, encode_spend(row), d) for unit, (row, d) in sorted(self._rows.items())]

    def retire(self, why: str) -> tuple[Rows, dict[str, int]]:
        """Refuse every use from now on, with ``why`` as the error; returns the rows and the release count it held
        (for :meth:`reinstate` when the move they went to did not happen)."""
        with self._lock:
            held = (self._rows, self._releases)
            self._rows, self._retired = {}, why
        return held

    def reinstate(self, held: tuple[Rows, dict[str, int]]) -> None:
        """Undo :meth:`retire`: the move did not happen, so this is again the only copy of ``held``."""
        with self._lock:
            (self._rows, self._releases), self._retired = held, None

    def close(self) -> None:
        return None

    def _read(self, ids: np.ndarray, orders: int) -> tuple[np.ndarray, np.ndarray]:
        spent = np.zeros((len(ids), orders))
        spent_delta = np.zeros(len(ids))
        for i, unit in enumerate(ids.tolist()):
            row = self._rows.get(unit)
            if row is not None:
                spent[i], spent_delta[i] = row
        return spent, spent_delta

    def _write(self, ids: np.ndarray, spent: np.ndarray, spent_delta: np.ndarray) -> None:
        for unit, row, d in zip(ids.tolist(), spent, spent_delta.tolist(), strict=True):
            self._rows[unit] = (row.copy(), d)
