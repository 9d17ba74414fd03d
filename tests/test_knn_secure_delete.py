"""Removed records leave no text on disk: neither in ``records.sqlite`` nor in its write-ahead log.

Issue 27, item 5: a removed record's text stayed in ``records.sqlite-wal`` (and, without ``secure_delete``, in
the freed space of the database file) while the index kept serving, though the docs said "deleted from disk".
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.retrieval import PrivateIndex

SECRET = "zq-distinctive-secret-7f3a9c"


def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, float(len(t) % 7), float(t.count("a"))] for t in texts])


def on_disk(directory: Path, text: str) -> list[str]:
    """The files of the index directory whose raw bytes hold ``text`` (UTF-8)."""
    needle = text.encode("utf-8")
    return sorted(p.name for p in directory.iterdir() if p.is_file() and needle in p.read_bytes())


@pytest.fixture(params=["this-build", "no-compiled-secure-delete"])
def sqlite_build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite as built here (Debian compiles SECURE_DELETE in), and as most builds ship it (macOS, Windows,
    many wheels): secure_delete off on every new connection unless the store turns it on."""
    if request.param == "no-compiled-secure-delete":
        real = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = real(*args, **kwargs)
            conn.execute("PRAGMA secure_delete = OFF")
            return conn

        monkeypatch.setattr(sqlite3, "connect", connect)


@pytest.mark.usefixtures("sqlite_build")
@pytest.mark.parametrize("long", [False, True], ids=["short", "overflow-pages"])
def test_a_removed_records_text_is_gone_from_the_database_and_its_wal(tmp_path: Path, long: bool) -> None:
    secret = SECRET + (" filler" * 2000 if long else "")  # a long text spills into overflow pages
    index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=embed, path=tmp_path / "ix")
    index.add([f"record {i}" for i in range(20)], labels=["x"] * 20)
    (victim,) = index.add([secret], labels=["the label of the secret"], answers=["its answer"])
    index.add([f"later {i}" for i in range(5)])
    assert on_disk(tmp_path / "ix", SECRET)  # it was written (to the WAL at least)
    index.remove([victim])
    for text in (SECRET, "the label of the secret", "its answer"):
        assert on_disk(tmp_path / "ix", text) == [], text
    assert len(index) == 25 and on_disk(tmp_path / "ix", "record 3")  # the others are still there
    reopened = PrivateIndex.open(tmp_path / "ix", embedder=embed)
    assert len(reopened) == 25 and not on_disk(tmp_path / "ix", SECRET)


def test_a_checkpoint_blocked_by_a_reader_says_the_text_stays_in_the_wal(tmp_path: Path) -> None:
    from dp_icl_plugin.retrieval.stores.base import IndexMeta
    from dp_icl_plugin.retrieval.stores.sqlite import SQLiteRecordStore

    store = SQLiteRecordStore(tmp_path / "records.sqlite", busy_timeout=0.2)
    store.create(IndexMeta("ix", False, "e", None, None))
    change = store.insert([SECRET, "other"], [None, None], [None, None], [None, None], np.ones((2, 3), np.float32))
    reader = sqlite3.connect(tmp_path / "records.sqlite")
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM records").fetchone()  # holds a snapshot from before the removal
    with pytest.warns(RuntimeWarning, match="stays in records.sqlite-wal"):
        store.delete(change.ids[:1])
    reader.execute("COMMIT")
    reader.close()
    store.delete(change.ids[1:])  # the next removal's checkpoint goes through
    assert not on_disk(tmp_path, SECRET)
    store.close()
