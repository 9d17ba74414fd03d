"""Paths shared by tests (importable from test modules, unlike conftest)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
