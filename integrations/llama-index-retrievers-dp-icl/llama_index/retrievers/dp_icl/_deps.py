"""Import guard: the adapter needs ``llama-index-core``; say which distribution installs it."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError:  # pragma: no cover - exercised in a subprocess test without the framework
    raise ImportError(
        "llama_index.retrievers.dp_icl needs llama-index-core: pip install llama-index-retrievers-dp-icl"
    ) from None
