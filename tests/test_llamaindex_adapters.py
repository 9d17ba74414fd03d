"""LlamaIndex adapters: the DP retriever in a query engine (sync and async), spend events, the DP LLM
(complete, stream, chat), and private data kept out of serialisation; on a tiny byte-level GPT-2."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.dp_icl import DPICL, DPSpendEvent
from llama_index.retrievers.dp_icl import DPICLRetriever
from test_langchain_adapters import CANARY, _knn_retriever, backend, dataset

from dp_icl_plugin import BudgetManager, ConfigurationError, PrivacyBudget
from dp_icl_plugin.methods.decoding import MozoDecoder


class Spends(BaseEventHandler):
    events: list[Any] = []  # noqa: RUF012  (a pydantic field: copied per instance)

    @classmethod
    def class_name(cls) -> str:
        return "Spends"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, DPSpendEvent):
            self.events.append(event)


@functools.cache
def llm_and_ledger() -> tuple[DPICL, BudgetManager]:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=6, beta=0.5,
                          top_k=20)  # fmt: skip
    return DPICL(decoder, rng=np.random.default_rng(0)), ledger


def test_query_engine_with_the_dp_retriever_and_llm_sync_and_async() -> None:
    llm, ledger = llm_and_ledger()
    handler = Spends()
    get_dispatcher().add_event_handler(handler)
    retriever = DPICLRetriever(_knn_retriever(), rng=np.random.default_rng(0))
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    before = len(ledger.history())
    response = engine.query("where did the cat sit?")
    assert isinstance(str(response), str)
    assert all(n.node.metadata["kind"] == "dp_answer" for n in response.source_nodes)
    assert len(ledger.history()) > before  # the LLM's answer was charged
    response = asyncio.run(engine.aquery("where is the mat?"))
    assert isinstance(str(response), str)
    # every release, the retriever's and the LLM's, emitted its charge
    charged = [h.id for h in ledger.history()[before:]]
    assert {e.release for e in handler.events} == {"knn-answer", "mozo-answer"}
    assert [e.ledger_entry for e in handler.events if e.release == "mozo-answer"] == charged
    texts = " ".join(n.node.get_content() for n in response.source_nodes)
    assert CANARY not in texts


def test_keyword_mode_returns_one_node_per_released_keyword() -> None:
    retriever = DPICLRetriever(_knn_retriever(), rng=np.random.default_rng(0), mode="keywords", similarity_top_k=2)
    nodes = retriever.retrieve("where did the cat sit?")
    assert len(nodes) <= 2 and all(n.node.metadata["kind"] == "dp_keyword" for n in nodes)


def test_llm_complete_stream_chat_each_charged_and_private_data_not_serialised() -> None:
    llm, ledger = llm_and_ledger()
    before = len(ledger.history())
    assert isinstance(llm.complete("Hello").text, str)
    pieces = list(llm.stream_complete("Hello there"))
    assert all(p.text.endswith(p.delta or "") for p in pieces)
    reply = llm.chat([ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="Hi")])
    assert reply.message.role == "assistant"
    assert len(ledger.history()) == before + 3
    assert CANARY not in str(llm.to_dict()) and CANARY not in repr(llm)
    assert llm.metadata.num_output == 6
    with pytest.raises(ConfigurationError, match="last message"):
        llm.chat([ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="Hello")])
    assert len(ledger.history()) == before + 3


def test_bad_construction() -> None:
    with pytest.raises(ConfigurationError):
        DPICLRetriever("not a retriever", rng=np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        DPICL("not a decoder", rng=np.random.default_rng(0))  # type: ignore[arg-type]


def test_aretrieve_leaves_the_event_loop_free() -> None:
    retriever = DPICLRetriever(_knn_retriever(), rng=np.random.default_rng(0))

    async def main() -> tuple[int, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        nodes = await retriever.aretrieve("where did the cat sit?")
        task.cancel()
        return ticks, len(nodes)

    ticks, n = asyncio.run(main())
    assert n == 1 and ticks > 1  # the loop kept running while the release ran in a worker thread


class _Tokenizer:  # enough of a tokenizer to reach the URL check
    def encode(self, text: str) -> list[int]:
        return [1]

    def decode(self, ids: list[int]) -> str:
        return "a"

    def __len__(self) -> int:
        return 10


def test_dpllm_from_a_server_url_needs_the_tokenizer_and_keeps_to_loopback() -> None:
    from dp_icl_plugin.methods import PrivateDataset

    data = PrivateDataset.from_pairs(["a question"] * 5, ["x"] * 5)
    budget = BudgetManager(PrivacyBudget(2.0, 1e-3))
    with pytest.raises(ConfigurationError, match="tokenizer="):
        DPICL.from_model_id("http://127.0.0.1:8000", data, budget=budget, rng=np.random.default_rng(0))
    with pytest.raises(ConfigurationError, match="plain http"):
        DPICL.from_model_id("http://10.0.0.7:8000", data, budget=budget, rng=np.random.default_rng(0),
                            tokenizer=_Tokenizer())  # fmt: skip
    assert budget.history() == []
