"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    """A path for a fresh SQLite ledger file."""
    return tmp_path / "ledger.db"


@pytest.fixture
def weak_keywords_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the refusal of keyword answers that could release no keyword (``MIN_KEYWORD_PASS``), for tests of
    the release's mechanics (who pays, what is charged) on the small budgets they use; the refusal itself is
    tested on its own."""
    from dp_icl_plugin.methods.knn import retriever

    monkeypatch.setattr(retriever, "MIN_KEYWORD_PASS", 0.0)
