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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A standard-suite class with ``standard_tests_kept`` runs only those of its inherited tests, and one with
    ``standard_tests_elsewhere`` all but those: they run in another class of the same suite, so here they are
    deselected, not skipped."""
    kept, dropped = [], []
    for item in items:
        cls = getattr(item, "cls", None)
        only = getattr(cls, "standard_tests_kept", None)
        elsewhere = getattr(cls, "standard_tests_elsewhere", ())
        name = getattr(item, "originalname", item.name)
        (dropped if (only is not None and name not in only) or name in elsewhere else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
