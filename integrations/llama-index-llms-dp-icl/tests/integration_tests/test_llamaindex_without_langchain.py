"""The LlamaIndex adapters' tests import nothing of LangChain: with it hidden, they still import (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from tests_support import REPO_ROOT


def test_llamaindex_tests_need_no_langchain() -> None:
    # These tests import nothing of LangChain: with it hidden, this module still imports.
    code = (
        "import sys\n"
        "class Block:\n    def find_spec(self, name, *a):\n        return None if not name.startswith('langchain') "
        "else (_ for _ in ()).throw(ImportError(name=name))\n"
        "sys.meta_path.insert(0, Block())\n"
        "import test_llamaindex_llm, test_llamaindex_retriever, llama_index.llms.dp_icl, llama_index.retrievers.dp_icl\n"
    )
    folders = [
        REPO_ROOT / "integrations" / "llama-index-llms-dp-icl" / "tests" / "unit_tests",
        REPO_ROOT / "integrations" / "llama-index-retrievers-dp-icl" / "tests" / "unit_tests",
        REPO_ROOT / "tests",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(f) for f in folders)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
