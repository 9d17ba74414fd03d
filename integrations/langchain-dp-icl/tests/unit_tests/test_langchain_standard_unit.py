"""LangChain's standard chat-model unit suite on ChatDPICL (a tiny byte-level GPT-2 built here, no server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("torch")

from adapter_fixtures import (
    STANDARD_PARAMS,
    shared_decoder,
)
from langchain_dp_icl import ChatDPICL
from langchain_tests.unit_tests import ChatModelUnitTests


def chat_params() -> dict[str, Any]:
    return {"decoder": shared_decoder(), "rng": np.random.default_rng(0), "model": "tiny-gpt2"}


class TestDPChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatDPICL]:
        return ChatDPICL

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return dict(STANDARD_PARAMS)

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return chat_params()
