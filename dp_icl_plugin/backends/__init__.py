"""Model access: the :class:`NextTokenBackend` protocol, a Hugging Face implementation and a fake for tests.

Neither ``HFBackend`` nor ``ServerBackend`` imports torch, transformers or httpx before it is used, so
``import dp_icl_plugin.backends`` needs none of them.
"""

from __future__ import annotations

from dp_icl_plugin.backends.base import ChatMessage, IncrementalSession, NextTokenBackend, Prompt
from dp_icl_plugin.backends.fake import FakeBackend
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.server import ServerBackend
from dp_icl_plugin.backends.server_settings import ServerSettings

__all__ = [
    "ChatMessage",
    "FakeBackend",
    "HFBackend",
    "IncrementalSession",
    "NextTokenBackend",
    "Prompt",
    "ServerBackend",
    "ServerSettings",
]
