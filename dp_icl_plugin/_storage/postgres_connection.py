"""One PostgreSQL connection per process for a dp-icl store (the ledger, a private index, its filter).

Autocommit with explicit transactions at READ COMMITTED, a ``lock_timeout`` so a host never waits forever on
another's row lock, reconnection after a lost connection or a ``fork()``, and psycopg failures mapped to the
package's typed errors with the password scrubbed (it never appears in a ``repr`` or a message).
"""

from __future__ import annotations

import re
import threading
from contextlib import suppress
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.errors import ConfigurationError, LedgerCorruptError, LedgerError, LedgerFormatError

__all__ = ["POSTGRES_SCHEMES", "PostgresConnection", "is_postgres_url", "mask_dsn", "psycopg"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_KV_PASSWORD = re.compile(r"(?i)\b(?:ssl)?password\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+)")


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(POSTGRES_SCHEMES)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its secrets (``password`` and ``sslpassword``: URL user info, query or ``key=value``)
    replaced by ``***``; the secrets libpq itself would parse are also removed wherever they appear (a URL
    password may hold a raw ``?`` or ``#``, which a URL parser cuts elsewhere)."""
    secrets = []
    try:
        import psycopg as pg

        parsed = pg.conninfo.conninfo_to_dict(dsn)
        secrets = [str(parsed[k]) for k in ("password", "sslpassword") if parsed.get(k)]
    except Exception:  # no psycopg, or not a valid DSN: the patterns below still apply
        pass
    masked = _mask_patterns(dsn)
    for secret in sorted(secrets, key=len, reverse=True):
        masked = masked.replace(secret, "***").replace(quote(secret, safe=""), "***")
    return masked


def _mask_patterns(dsn: str) -> str:
    if "://" not in dsn:
        return _KV_PASSWORD.sub(lambda m: m.group(0).split("=", 1)[0] + "=***", dsn)
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = re.sub(
        r"(?i)(^|&)(ssl)?password=[^&]*", lambda m: f"{m.group(1)}{m.group(2) or ''}password=***", parts.query
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def psycopg() -> Any:
    try:
        import psycopg as pg
    except ImportError:
        raise ImportError("PostgreSQL stores need psycopg 3: pip install 'dp-icl-plugin[postgres]'") from None
    return pg


class PostgresConnection:
    """The connection of one store in this process, made on first use.

    Args:
        dsn: a libpq connection string or URL.
        what: what the store holds, for messages (e.g. ``"ledger 'default'"``).
        kind: the tables' name in format errors (``"dp-icl ledger"``).
        connect_timeout: seconds to wait for the server when connecting.
        lock_timeout: seconds to wait for a lock.
    """

    def __init__(self, dsn: str, *, what: str, kind: str, connect_timeout: float, lock_timeout: float) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError("dsn must be a non-empty PostgreSQL connection string")
        self.pg = psycopg()
        self.dsn = dsn
        self.what = what
        self.kind = kind
        self.connect_timeout = float(connect_timeout)
        self.lock_timeout = float(lock_timeout)
        self.lock = threading.RLock()  # one connection: one thread at a time
        self._conn: Any = None
        self._process: tuple[int, int] | None = None  # (pid, forks): the process that opened _conn
        try:
            parsed = self.pg.conninfo.conninfo_to_dict(dsn)
            self._secrets = [str(parsed[k]) for k in ("password", "sslpassword") if parsed.get(k)]
        except self.pg.ProgrammingError:
            raise ConfigurationError(f"invalid PostgreSQL connection string {mask_dsn(dsn)!r}") from None

    def where(self) -> str:
        return f"{self.what} at {mask_dsn(self.dsn)}"

    def scrub(self, exc: Exception) -> str:
        diag = getattr(exc, "diag", None)  # the server's own message, without the echoed statement
        text = " ".join(str(getattr(diag, "message_primary", None) or exc).split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def fail(self, exc: Exception) -> LedgerError:
        """The typed error for a failed psycopg call (with the password scrubbed)."""
        text = self.scrub(exc)
        errors = self.pg.errors
        if isinstance(exc, errors.LockNotAvailable):
            return LedgerError(f"{self.where()} stayed locked for {self.lock_timeout:g}s: {text}")
        if isinstance(exc, (errors.UndefinedTable, errors.UndefinedColumn, errors.DatatypeMismatch)):
            return LedgerFormatError(f"the tables at {mask_dsn(self.dsn)} are not a {self.kind}: {text}")
        if isinstance(exc, (self.pg.DataError, self.pg.IntegrityError)):
            return LedgerCorruptError(f"{self.where()} is damaged: {text}")
        return LedgerError(f"PostgreSQL {self.where()} failed: {text}")

    def get(self) -> Any:
        """The connection (the caller holds :attr:`lock`)."""
        if self._conn is not None and self._process != process_mark():  # never across fork(), even on a reused pid
            self._conn = None  # psycopg leaves a connection made in another process open for its owner
        if self._conn is None or self._conn.closed:  # also after a lost connection: reconnect
            conn = None
            try:
                conn = self.pg.connect(self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))
                # READ COMMITTED: each statement after a row lock sees every write committed before it.
                conn.isolation_level = self.pg.IsolationLevel.READ_COMMITTED
                ms = f"{round(self.lock_timeout * 1000)}ms"
                conn.execute("SELECT set_config('lock_timeout', %s, false)", (ms,))
                # a host that stalls inside a transaction (frozen, partitioned) loses it, and its row locks
                conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (ms,))
                # floats read back exactly as written, whatever the server's or role's setting (a ledger entry's
                # time names its filter cover's release counts: RenyiFilter.check_releases)
                conn.execute("SELECT set_config('extra_float_digits', '3', false)")
            except self.pg.Error as exc:
                if conn is not None:
                    conn.close()
                raise LedgerError(f"cannot connect to PostgreSQL {self.where()}: {self.scrub(exc)}") from None
            self._conn, self._process = conn, process_mark()
        return self._conn

    def close(self) -> None:
        with self.lock:
            if self._conn is not None and self._process == process_mark():
                self._conn.close()
            self._conn = None

    def __del__(self) -> None:  # like an sqlite3 connection: an unclosed store closes quietly
        conn = getattr(self, "_conn", None)
        if conn is not None and getattr(self, "_process", None) == process_mark():
            with suppress(Exception):
                conn.close()
