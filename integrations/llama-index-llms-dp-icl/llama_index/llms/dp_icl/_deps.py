"""Import guard: the adapter needs ``llama-index-core``; say which distribution installs it."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError:  # pragma: no cover - exercised in a subprocess test without the framework
    raise ImportError("llama_index.llms.dp_icl needs llama-index-core: pip install llama-index-llms-dp-icl") from None
