"""A throw-away PostgreSQL server for the ledger tests and the load benchmark.

``initdb`` into a temporary directory, trust authentication, listening on 127.0.0.1 on a free port (and a unix
socket in the same directory); stopped and removed afterwards, also on failure. PostgreSQL refuses to run as
root, so as root the server runs as the ``postgres`` user (``runuser``). Tests skip, with the reason, when the
binaries, that user or psycopg are missing.

Fixtures (import them into a test module): ``postgres_server_fixture`` (session scope, named
``postgres``: the server) and ``postgres_database_fixture`` (named ``pg_dsn``: a fresh database's DSN).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "find_binaries", "postgres_database_fixture", "postgres_server_fixture", "running"]

_databases = itertools.count()


def find_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (newest Debian cluster version first), or None."""
    on_path = shutil.which("pg_ctl")
    candidates = [Path(os.path.realpath(on_path)).parent] if on_path else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A running server; ``dsn(dbname)`` connects as the superuser ``postgres`` over TCP."""

    def __init__(self, root: Path, port: int, run_as: list[str], bindir: Path) -> None:
        self.root, self.port, self._run_as, self._bindir = root, port, run_as, bindir

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        import psycopg

        name = f"t{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*self._run_as, str(self._bindir / "pg_ctl"), "-D", str(self.root / "data"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@contextmanager
def running(*, fast: bool = True) -> Iterator[PostgresServer]:
    """Start a temporary server (``fast``: no fsync, for tests) and stop and remove it on exit.

    Raises:
        RuntimeError: the binaries are missing or the server did not start (the message says why).
    """
    bindir = find_binaries()
    if bindir is None:
        raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl) not found")
    run_as: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="dpicl-pg-"))
    try:
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no 'postgres' user to run the server") from None
            if shutil.which("runuser") is None:
                raise RuntimeError("running as root and runuser is missing")
            os.chown(root, user.pw_uid, user.pw_gid)
            run_as = ["runuser", "-u", "postgres", "--"]
        init = [
            *run_as,
            str(bindir / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]
        done = subprocess.run(init, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-2000:]}")
        options = f"-c listen_addresses=127.0.0.1 -k {root} -c max_connections=200 -c shared_buffers=32MB"
        if fast:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        for attempt in range(3):  # the free port may be taken between choosing and binding it
            server = PostgresServer(root, _free_port(), run_as, bindir)
            started = server.pg_ctl(
                "start", "-w", "-t", "30", "-l", str(root / "log"), "-o", f"-p {server.port} {options}"
            )
            if started.returncode == 0:
                break
            if attempt == 2:
                log = (root / "log").read_text(errors="replace")[-2000:] if (root / "log").exists() else ""
                raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()} {log}")
        try:
            yield server
        finally:
            server.pg_ctl("stop", "-m", "immediate", "-w")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", name="postgres")
def postgres_server_fixture() -> Iterator[PostgresServer]:
    """A server for the whole session; skips when PostgreSQL or psycopg is unavailable."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'dp-icl-plugin[postgres]'")
    try:
        context = running()
        server = context.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"no PostgreSQL server for the tests: {exc}")
    try:
        yield server
    finally:
        context.__exit__(None, None, None)


@pytest.fixture(name="pg_dsn")
def postgres_database_fixture(postgres: PostgresServer) -> str:
    """The DSN of a fresh, empty database on the session's server."""
    return postgres.create_database()
