"""The LlamaIndex DP retriever: in a query engine (sync and async), its modes, spend events, private data kept out
of reprs and of the LLM's context; on a tiny byte-level GPT-2 built here (no server)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from adapter_fixtures import CANARY, backend, knn_core
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import MetadataMode
from llama_index.retrievers.dp_icl import DPICLRetriever
from llamaindex_fixtures import Spends

from dp_icl_plugin import BudgetManager, PrivacyBudget


def test_keyword_mode_returns_one_node_per_released_keyword() -> None:
    retriever = DPICLRetriever(knn_core(), rng=np.random.default_rng(0), mode="keywords", similarity_top_k=2)
    nodes = retriever.retrieve("where did the cat sit?")
    assert len(nodes) <= 2 and all(n.node.metadata["kind"] == "dp_keyword" for n in nodes)


def test_the_retriever_repr_names_no_count_of_private_records() -> None:
    """The record count is private under add/remove: the repr (in every trace and log) must not move with it."""
    core = knn_core()
    retriever = DPICLRetriever(core, rng=np.random.default_rng(0))
    before = repr(retriever)
    core.index.add([f"{CANARY} one more record"])
    assert repr(retriever) == before and CANARY not in before
    assert "40" not in before and "41" not in repr(retriever)


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_the_spend_reports_each_records_guarantee_for_a_person_grouped_index() -> None:
    """Per person, a record's guarantee is group privacy's (2ε, (1 + e^ε)δ), not the person's (ε, δ)."""
    import math

    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

    index = PrivateIndex(
        budget=IndividualBudget(epsilon=3.0, delta=1e-7),
        group_by_user=True,
        embedder=lambda texts: np.array([[1.0, t.count("cat"), 0.5] for t in texts]),
    )
    index.add(["the cat sat", "the cat ran"], answers=["cat", "cat"], user_ids=["ann", "bob"])
    core = PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(10.0, 1e-4, neighbouring="add_remove")),
        backend=backend(),
        config=KNNConfig(k=2, shards=2, min_similarity=0.5, max_answer_tokens=2),
    )
    (node,) = DPICLRetriever(core, rng=np.random.default_rng(0)).retrieve("where did the cat sit?")
    assert node.node.metadata["per_record_epsilon"] == pytest.approx(6.0)
    handler = Spends()
    get_dispatcher().add_event_handler(handler)
    DPICLRetriever(core, rng=np.random.default_rng(1)).retrieve("where did the cat sit?")
    assert handler.events[-1].per_record_delta == pytest.approx((1 + math.exp(3.0)) * 1e-7)


def test_aretrieve_leaves_the_event_loop_free() -> None:
    retriever = DPICLRetriever(knn_core(), rng=np.random.default_rng(0))
    loop_ran = threading.Event()
    release = retriever._experts.answer

    def answer(*args: Any, **kwargs: Any) -> Any:  # the release waits for the loop to run something else
        assert loop_ran.wait(120), "the event loop was blocked while the release ran"
        return release(*args, **kwargs)

    retriever._experts.answer = answer

    async def main() -> int:
        task = asyncio.create_task(retriever.aretrieve("where did the cat sit?"))
        await asyncio.sleep(0)  # the task starts its release; on the loop's thread it would block here for good
        loop_ran.set()
        return len(await task)

    assert asyncio.run(main()) == 1


def test_node_metadata_stays_out_of_the_llms_context() -> None:
    # the LLM received 'ledger_entry: 8\nper_record_epsilon: 2.0...' as context and answered with it
    for mode in ("experts", "answer"):
        (node,) = DPICLRetriever(knn_core(), rng=np.random.default_rng(0), mode=mode).retrieve("where is the cat?")
        assert "ledger_entry" in node.node.metadata
        for seen_by in (MetadataMode.LLM, MetadataMode.EMBED):
            assert node.node.get_content(metadata_mode=seen_by) == node.node.get_content()
