"""Shared fixtures and collection rules of every test folder: ``tests/`` (the core) and each adapter distribution's
``integrations/*/tests/{unit_tests,integration_tests}``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# ATEN_CPU_CAPABILITY=avx2 runs torch's own kernels as on an AVX2-only CPU, but oneDNN still finds this machine's
# AVX-512 and packs bfloat16 weights for it, which ATen then refuses ("pack_vnni2 is only supported when avx512 is
# supported"): no real AVX2 machine does that. Cap oneDNN to the same ISA before torch is imported (subprocesses
# inherit it), so that the emulation is one machine.
if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() == "avx2":
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    """A path for a fresh SQLite ledger file."""
    return tmp_path / "ledger.db"


@pytest.fixture
def weak_keywords_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the refusal of keyword answers that could release no keyword (``MIN_KEYWORD_PASS``), for tests of
    the release's mechanics (who pays, what is charged) on the small budgets they use; the refusal itself is
    tested on its own."""
    from dp_icl_plugin.retrieval import retriever

    monkeypatch.setattr(retriever, "MIN_KEYWORD_PASS", 0.0)


# Modules whose tests need a server (PostgreSQL, vLLM), a real model file, a subprocess or the docs build: marked
# ``integration``, so that ``make test-fast`` (``-m "not slow and not integration"``) runs the unit layer alone.
INTEGRATION_MODULES = {
    "test_docs.py",
    "test_filter_postgres.py",
    "test_gguf.py",
    "test_ginc_training.py",
    "test_index_postgres.py",
    "test_knn_embedding_isolation.py",
    "test_ledger_concurrency.py",
    "test_ledger_postgres.py",
    "test_package.py",
    "test_vllm_server.py",
}
# Single tests of that kind in otherwise fast modules (a real embedding model, a CLI subprocess, worker processes).
INTEGRATION_TESTS = {
    "test_the_plan_reproduces_the_issue_and_recommends_synthesis_when_nothing_per_answer_can_help",
    "test_worker_processes_give_the_same_rows_in_the_same_order",
    "test_llamaindex_tests_need_no_langchain",
    "test_cli_output_never_shows_private_text",
    "test_console_script_runs_as_a_module",
    "test_processes_sharing_a_filter_file_admit_exactly_what_fits",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the integration tests (see :data:`INTEGRATION_MODULES`). A standard-suite class with
    ``standard_tests_kept`` runs only those of its inherited tests, and one with ``standard_tests_elsewhere`` all
    but those: they run in another class of the same suite, so here they are deselected, not skipped."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        if item.path.name in INTEGRATION_MODULES or name in INTEGRATION_TESTS or "integration_tests" in item.path.parts:
            item.add_marker(pytest.mark.integration)
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
