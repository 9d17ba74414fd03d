"""Import guard: the adapters need ``llama-index-core``; say which extra installs it."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError:  # pragma: no cover - exercised in a subprocess test without the extra
    raise ImportError("dp_icl_llamaindex needs llama-index-core: pip install 'dp-icl-plugin[llamaindex]'") from None
