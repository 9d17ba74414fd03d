"""One process at a time across a check-then-act on shared state: an ``fcntl`` lock on a file, or a PostgreSQL
session advisory lock. Both are released when the holder exits or dies (the file's descriptor is closed; the
database ends the session)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Iterator
from pathlib import Path

from dp_icl_plugin._storage.postgres_connection import mask_dsn, psycopg
from dp_icl_plugin.errors import LedgerError

__all__ = ["file_locked", "postgres_locked"]


@contextlib.contextmanager
def file_locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created, with its folder, if missing) for the ``with`` body.

    Args:
        lock_path: the lock file.
    """
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_path.open("a")
    except OSError as exc:
        raise LedgerError(f"cannot create the lock file {lock_path}: {exc.strerror or exc}") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def postgres_locked(
    dsn: str, name: str, *, connect_timeout: float = 10.0, lock_timeout: float = 300.0
) -> Iterator[None]:
    """Hold a PostgreSQL session advisory lock keyed by ``name`` for the ``with`` body, on a connection of its own.

    Args:
        dsn: the database's ``postgresql://`` URL.
        name: what is locked (hashed into the lock's key).
        connect_timeout: seconds to wait for the connection.
        lock_timeout: seconds to wait for another holder.

    Raises:
        LedgerError: the database cannot be reached, or the lock stayed held for ``lock_timeout``.
    """
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    try:
        conn = psycopg().connect(dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout)))
    except Exception as exc:
        raise LedgerError(f"cannot reach {mask_dsn(dsn)} to lock {name!r}: {type(exc).__name__}") from None
    with conn:
        try:
            conn.execute(f"SET lock_timeout = {int(lock_timeout * 1000)}")
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except Exception as exc:
            raise LedgerError(f"could not lock {name!r} in {mask_dsn(dsn)}: {type(exc).__name__}") from None
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
