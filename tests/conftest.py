"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    """A path for a fresh SQLite ledger file."""
    return tmp_path / "ledger.db"
