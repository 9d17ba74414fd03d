"""The SQLite ledger file: identity, corruption and budget checks give clear errors, never an empty budget."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dp_icl_plugin import (
    BudgetManager,
    BudgetMismatchError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
    PrivacyBudget,
    PureDPEvent,
)
from dp_icl_plugin.accounting import SQLiteStore

BUDGET = PrivacyBudget(5.0, 1e-6)


def _filled_ledger(path: Path, n: int = 300) -> None:
    m = BudgetManager(BUDGET, ledger=path)
    for i in range(n):
        m.spend(PureDPEvent(0.01, neighbouring="replace_one"), label=f"component-{i % 7}")
    m.close()


def test_wal_mode_and_identity(ledger_path: Path) -> None:
    _filled_ledger(ledger_path, 3)
    conn = sqlite3.connect(ledger_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x44504943
    conn.close()


def test_a_text_file_is_not_a_ledger(ledger_path: Path) -> None:
    ledger_path.write_text("epsilon,delta\n1,1e-5\n")
    with pytest.raises(LedgerFormatError, match="not a dp-icl ledger"):
        BudgetManager.open(ledger_path)
    with pytest.raises(LedgerFormatError):
        BudgetManager(BUDGET, ledger=ledger_path)
    assert ledger_path.read_text().startswith("epsilon")  # untouched


def test_another_applications_sqlite_file_is_refused_untouched(ledger_path: Path) -> None:
    conn = sqlite3.connect(ledger_path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = ledger_path.read_bytes()
    with pytest.raises(LedgerFormatError):
        BudgetManager(BUDGET, ledger=ledger_path)
    assert ledger_path.read_bytes() == before


def test_truncated_header_is_corrupt(ledger_path: Path) -> None:
    ledger_path.write_bytes(b"SQLite for")
    with pytest.raises(LedgerCorruptError, match="truncated"):
        BudgetManager.open(ledger_path)


def test_torn_pages_are_detected(ledger_path: Path) -> None:
    _filled_ledger(ledger_path)
    data = bytearray(ledger_path.read_bytes())
    assert len(data) > 4 * 4096
    data[4096 + 100 : 4096 * 3] = b"\xff" * (4096 * 2 - 100)
    ledger_path.write_bytes(bytes(data))
    with pytest.raises(LedgerCorruptError):
        BudgetManager.open(ledger_path)


def test_truncated_file_is_detected(ledger_path: Path) -> None:
    _filled_ledger(ledger_path)
    data = ledger_path.read_bytes()
    ledger_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LedgerCorruptError):
        BudgetManager.open(ledger_path)


def test_edited_entries_are_detected(ledger_path: Path) -> None:
    _filled_ledger(ledger_path, 5)
    conn = sqlite3.connect(ledger_path)
    conn.execute("DELETE FROM entries WHERE id = 2")  # someone tries to "refund" a charge
    conn.commit()
    conn.close()
    with pytest.raises(LedgerCorruptError, match="inconsistent"):
        BudgetManager.open(ledger_path)


def _set_schema_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {int(version)}")
    conn.commit()
    conn.close()


def test_newer_schema_is_refused(ledger_path: Path) -> None:
    _filled_ledger(ledger_path, 1)
    _set_schema_version(ledger_path, 99)
    with pytest.raises(LedgerFormatError, match="schema version 99"):
        BudgetManager.open(ledger_path)


def test_missing_ledger_needs_a_budget(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no ledger"):
        BudgetManager.open(tmp_path / "absent.db")
    with pytest.raises(LedgerError, match="does not exist"):
        BudgetManager(BUDGET, ledger=tmp_path / "no-such-dir" / "l.db")


def test_budget_changed_under_an_existing_ledger(ledger_path: Path) -> None:
    _filled_ledger(ledger_path, 2)
    with pytest.raises(BudgetMismatchError, match="refusing"):
        BudgetManager(PrivacyBudget(5.0, 1e-5), ledger=ledger_path)
    assert BudgetManager.open(ledger_path).spent().epsilon == pytest.approx(0.02, rel=1e-3)


def test_store_repr_shows_the_path_only(ledger_path: Path) -> None:
    assert repr(SQLiteStore(ledger_path)) == f"SQLiteStore({str(ledger_path)!r})"


def test_the_relation_is_stored_and_part_of_the_budget(ledger_path: Path) -> None:
    add_remove = PrivacyBudget(5.0, 1e-6, neighbouring="add_remove")
    BudgetManager(add_remove, ledger=ledger_path).close()
    reopened = BudgetManager.open(ledger_path)
    assert reopened.budget == add_remove and reopened.neighbouring == "add_remove"
    reopened.close()
    with pytest.raises(BudgetMismatchError, match="replace_one"):
        BudgetManager(PrivacyBudget(5.0, 1e-6), ledger=ledger_path)  # same ε, δ; another relation


def test_a_schema_1_ledger_from_before_relations_is_refused_with_the_reason(ledger_path: Path) -> None:
    _filled_ledger(ledger_path, 1)
    _set_schema_version(ledger_path, 1)
    with pytest.raises(LedgerFormatError, match="predates neighbouring relations"):
        BudgetManager.open(ledger_path)


def test_a_ledger_in_a_read_only_directory_is_no_damaged_ledger(
    ledger_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: an existing ledger in a directory the app cannot write was reported as "damaged or unreadable"
    (LedgerCorruptError). It is a plain LedgerError that says what to fix. Root ignores permissions, so the
    directory's mode is simulated where the test runs as root."""
    import os

    from dp_icl_plugin._storage.sqlite_file import SQLiteFile

    BudgetManager(PrivacyBudget(1.0, 1e-5), ledger=ledger_path).close()
    if os.geteuid() == 0:
        monkeypatch.setattr(SQLiteFile, "_writable", lambda self: False)
        error = SQLiteFile(ledger_path, kind="ledger", application_id=1, busy_timeout=1.0).fail(
            sqlite3.OperationalError("attempt to write a readonly database")
        )
        assert type(error) is LedgerError and "read-only" in str(error)
        return
    ledger_path.parent.chmod(0o555)
    try:
        with pytest.raises(LedgerError, match="read-only") as caught:
            BudgetManager.open(ledger_path).spend(PureDPEvent(0.1), label="x")
        assert not isinstance(caught.value, LedgerCorruptError)
    finally:
        ledger_path.parent.chmod(0o755)
