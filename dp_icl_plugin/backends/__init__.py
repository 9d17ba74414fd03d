"""Model access: the :class:`NextTokenBackend` protocol, a Hugging Face implementation and a fake for tests.

``HFBackend`` is imported lazily, so ``import dp_icl_plugin.backends`` needs neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dp_icl_plugin.backends.base import ChatMessage, IncrementalSession, NextTokenBackend, Prompt
from dp_icl_plugin.backends.fake import FakeBackend

if TYPE_CHECKING:
    from dp_icl_plugin.backends.hf import HFBackend
    from dp_icl_plugin.backends.server import ServerBackend

__all__ = [
    "ChatMessage",
    "FakeBackend",
    "HFBackend",
    "IncrementalSession",
    "NextTokenBackend",
    "Prompt",
    "ServerBackend",
]


def __getattr__(name: str) -> Any:
    if name == "HFBackend":
        from dp_icl_plugin.backends.hf import HFBackend

        return HFBackend
    if name == "ServerBackend":
        from dp_icl_plugin.backends.server import ServerBackend

        return ServerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
