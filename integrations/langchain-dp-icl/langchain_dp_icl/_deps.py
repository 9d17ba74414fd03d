"""Import guard: the adapters need ``langchain-core``; say which extra installs it."""

from __future__ import annotations

try:
    import langchain_core  # noqa: F401
except ImportError:  # pragma: no cover - exercised in a subprocess test without the extra
    raise ImportError("langchain_dp_icl needs langchain-core: pip install langchain-dp-icl") from None
