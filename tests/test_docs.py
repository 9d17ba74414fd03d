"""The documentation: README.md is a short front page, the reference lives in docs/ and builds with MkDocs.

``mkdocs build --strict`` fails on any warning: a link to a missing page or anchor, a docstring griffe cannot
parse, a module mkdocstrings cannot find. So a renamed class or a moved section fails here, not on the web.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests_support import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# Names that were renamed when the adapters became their own distributions; the docs use the new ones.
OLD_NAMES = re.compile(
    r"\b(DPChatModel|DPLLM|DPPrivateRetriever|DPFewShotExampleSelector|DPRetriever|PrivateRetriever"
    r"|dp_icl_langchain|dp_icl_llamaindex)\b|\[langchain\]|\[llamaindex\]"
)


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _without_code(text: str) -> str:
    """The Markdown outside fenced code blocks (a link or heading inside code is not one)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """The anchor of a heading, as MkDocs' toc extension and GitHub both make it for ASCII headings."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", _without_code(page.read_text()), flags=re.M)}


def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")  # installed by `make setup` (the docs extra), so CI runs this
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not a build warning
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    for page in ("index.html", "integrations/index.html", "api/langchain/index.html", "api/llama_index/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # the namespace packages resolved: their classes are on the page, not an empty heading
    api = (tmp_path / "site" / "api" / "llama_index" / "index.html").read_text()
    assert 'id="llama_index.llms.dp_icl.DPICL"' in api and 'id="llama_index.retrievers.dp_icl.DPICLRetriever"' in api


def test_readme_links_into_docs_resolve() -> None:
    links = re.findall(r"\]\((docs/[^)\s]+)\)", _without_code(README.read_text()))
    assert len(links) >= 10, links  # the front page points at the reference
    for link in links:
        path, _, anchor = link.partition("#")
        target = REPO_ROOT / path
        assert target.is_file(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading in {path}"


def test_readme_is_a_short_front_page_naming_the_test_command() -> None:
    readme = README.read_text()
    assert len(readme.splitlines()) <= 150, "README.md is the front page: move reference material into docs/"
    assert "The test command: `make test`" in readme  # CI's .ci/run runs `make test` and nothing else
    assert "make setup" in readme and "make demo" in readme
    assert "mkdocs serve" in readme and "mkdocs build" in readme


def test_docs_use_the_current_names() -> None:
    for page in [README, *_pages()]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if page.name == "integrations.md" and line.startswith("| "):
                continue  # the table of renamed names lists the old ones on purpose
            assert not OLD_NAMES.search(line), f"{page.relative_to(REPO_ROOT)}:{number} uses an old name: {line}"


def test_every_synthesizers_signature_lists_its_settings() -> None:
    """Issue 41: help(PTASynthesizer) showed ``(config=None, **overrides)``, no setting."""
    import inspect
    from dataclasses import fields

    from dp_icl_plugin.synthesis import SynthesisMethod

    methods = [m for m in dir(__import__("dp_icl_plugin")) if m.endswith("Synthesizer")]
    assert len(methods) == 6
    for name in methods:
        method = getattr(__import__("dp_icl_plugin"), name)
        assert issubclass(method, SynthesisMethod)
        shown = inspect.signature(method).parameters
        assert [f.name for f in fields(method.config_type)] == list(shown)[1:], name
        assert method.config_type.__name__ in (method.__doc__ or "")
