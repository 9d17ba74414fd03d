"""The LlamaIndex DP retriever and DP LLM together in a query engine, sync and async: every release charged and
reported, no record text in the answer's sources (a tiny byte-level GPT-2 built here)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from adapter_fixtures import CANARY, knn_core
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.retrievers.dp_icl import DPICLRetriever
from llamaindex_fixtures import Spends, llm_and_ledger


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
