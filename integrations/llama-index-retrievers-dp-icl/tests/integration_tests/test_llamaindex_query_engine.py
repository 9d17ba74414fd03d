"""The LlamaIndex DP retriever and DP LLM together in a query engine, sync and async: every release charged and
reported, no record text in the answer's sources (a tiny byte-level GPT-2 built here)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from adapter_fixtures import CANARY, backend, dataset, knn_core
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.dp_icl import DPICL, DPSpendEvent
from llama_index.retrievers.dp_icl import DPICLRetriever

from dp_icl_plugin import BudgetManager, PrivacyBudget
from dp_icl_plugin.decoding.decoders import MozoDecoder


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
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=6, beta=0.5, top_k=20)
    return DPICL(decoder, rng=np.random.default_rng(0)), ledger


def test_query_engine_with_the_dp_retriever_and_llm_sync_and_async() -> None:
    llm, ledger = llm_and_ledger()
    handler = Spends()
    get_dispatcher().add_event_handler(handler)
    retriever = DPICLRetriever(knn_core(), rng=np.random.default_rng(0))
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    before = len(ledger.history())
    response = engine.query("where did the cat sit?")
    assert isinstance(str(response), str)
    assert all(n.node.metadata["kind"] == "dp_expert_answer" for n in response.source_nodes)  # the default mode
    assert len(ledger.history()) > before  # the LLM's answer was charged
    response = asyncio.run(engine.aquery("where is the mat?"))
    assert isinstance(str(response), str)
    # every release, the retriever's and the LLM's, emitted its charge
    charged = [h.id for h in ledger.history()[before:]]
    assert {e.release for e in handler.events} == {"knn-decode", "mozo-answer"}
    assert [e.ledger_entry for e in handler.events if e.release == "mozo-answer"] == charged
    texts = " ".join(n.node.get_content() for n in response.source_nodes)
    assert CANARY not in texts
