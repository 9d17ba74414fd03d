"""LangChain's standard integration suites (chat model, structured output, retriever) on the tiny model: the
framework's own end-to-end contract, each call a charged DP release."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("torch")

from adapter_fixtures import (
    STANDARD_PARAMS,
    knn_core,
    shared_decoder,
    terse_decoder,
)
from langchain_dp_icl import ChatDPICL, DPICLRetriever
from langchain_tests.integration_tests import ChatModelIntegrationTests, RetrieversIntegrationTests


def chat_params() -> dict[str, Any]:
    return {"decoder": shared_decoder(), "rng": np.random.default_rng(0), "model": "tiny-gpt2"}


STRUCTURED_OUTPUT_TESTS = (
    "test_structured_output",
    "test_structured_output_async",
    "test_structured_output_pydantic_2_v1",
    "test_structured_output_optional_param",
    "test_json_mode",
)


class TestDPChatModelIntegration(ChatModelIntegrationTests):
    standard_tests_elsewhere = STRUCTURED_OUTPUT_TESTS  # in TestDPChatModelStructuredOutput

    @property
    def chat_model_class(self) -> type[ChatDPICL]:
        return ChatDPICL

    # Structured output runs in TestDPChatModelStructuredOutput below (a model that ends its strings). The
    # standard tool-calling tests assert the argument the model picks ({"input": 3} for "magic_function(3)"), a
    # test of the model's skill, not the adapter's. Tool calls are tested in
    # tests/test_structured_output.py (the tiny model, and the real model with a routing tool).
    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return dict(STANDARD_PARAMS)

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return chat_params()


class TestDPChatModelStructuredOutput(ChatModelIntegrationTests):
    """LangChain's standard structured-output tests (Pydantic v1/v2, TypedDict, JSON schema, json_mode, an
    optional field; invoke, stream, async), on the tiny model biased to end its strings: a randomly initialised
    model does not close a free string within its share of tokens. The other standard tests run above."""

    standard_tests_kept = STRUCTURED_OUTPUT_TESTS

    @property
    def chat_model_class(self) -> type[ChatDPICL]:
        return ChatDPICL

    @property
    def has_tool_calling(self) -> bool:
        return False  # as TestDPChatModelIntegration

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {**STANDARD_PARAMS, "max_tokens": 48}

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"decoder": terse_decoder(), "rng": np.random.default_rng(0), "model": "tiny-gpt2-terse"}


class TestDPPrivateRetriever(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[DPICLRetriever]:
        return DPICLRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"knn": knn_core(), "rng": np.random.default_rng(0)}

    @property
    def retriever_query_example(self) -> str:
        return "where did the cat sit?"

    @pytest.mark.xfail(reason="a DP release returns fewer than k keywords when fewer pass its threshold", strict=True)
    def test_k_constructor_param(self) -> None:
        super().test_k_constructor_param()

    @pytest.mark.xfail(reason="a DP release returns fewer than k keywords when fewer pass its threshold", strict=True)
    def test_invoke_with_k_kwarg(self, retriever: Any) -> None:
        super().test_invoke_with_k_kwarg(retriever)
