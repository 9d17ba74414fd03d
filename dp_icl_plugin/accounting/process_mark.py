"""Which process this is, as in-memory private state records it: a forked copy must know it is one.

An in-memory ledger, privacy filter or index holds spend that must exist once. After ``fork()`` (a pre-forking
web server) each worker would hold its own copy and let every record spend its budget once per worker, so
such state records :func:`process_mark` when it is made and refuses use wherever the mark differs. The pid
alone is not enough: a grandchild may be given the pid of a grandparent that has exited, so the mark also
counts the forks of this process's lineage since import (``os.register_at_fork``: a child's count is its
parent's + 1).
"""

from __future__ import annotations

import os

__all__ = ["process_mark"]

_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def process_mark() -> tuple[int, int]:
    """(pid, forks since import) of the calling process."""
    return os.getpid(), _forks
