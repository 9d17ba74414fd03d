"""A LlamaIndex retriever that returns only DP-released content from private records.

By default each query is answered by expert decoding, the nearest private records steering every token
(:class:`~dp_icl_plugin.retrieval.KNNExpertDecoder`); or keyword-space aggregation over them
(:meth:`~dp_icl_plugin.retrieval.PrivateKNN.answer`) releases keywords or the answer built from them. The
nodes hold only what was released, never record texts or ids. The spend is emitted as a
:class:`~llama_index.llms.dp_icl.events.DPSpendEvent` through LlamaIndex's instrumentation. ``aretrieve``
runs the release in a worker thread, so it does not block the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.dp_icl.events import DPSpendEvent

from dp_icl_plugin import ANSWER_PRESETS, ConfigurationError, KNNExpertDecoder, PrivateKNN
from dp_icl_plugin.adapters import noise_source

__all__ = ["DPICLRetriever"]

dispatcher = get_dispatcher(__name__)


class DPICLRetriever(BaseRetriever):
    """DP context nodes from a :class:`~dp_icl_plugin.retrieval.PrivateKNN` (private kNN over records).

    Each query is one DP release over the nearest private records, charged to each record's own filter and
    recorded in the shared ledger. By default (``mode="experts"``) it is expert decoding: the k nearest records
    steer every token of one answer, returned as one node; the keyword modes release keyword-space
    aggregation instead. Nodes hold only what was released. Build the core over an index kept beside the
    ledger (:func:`~dp_icl_plugin.retrieval.kept_index`) so that a restarted app does not pay its cover again.

    Setup:
        ```bash
        pip install llama-index-retrievers-dp-icl   # with dp-icl-plugin[retrieval]
        ```

    Key init args:
        knn: the private kNN core (its index, ledger, backend and settings).
        mode: ``"experts"`` (default: one node, the answer the nearest records decode, each paying its own
            budget), ``"answer"`` (one node with the DP answer built from released keywords, or the 0-shot
            answer when no keyword is released) or ``"keywords"`` (one node per released keyword). Keyword
            modes are refused before any charge when the budget lets no keyword pass (build the core with
            ``releases=("answer",)`` for that to be checked before its filter's cover is charged; ``("decode",)``
            for experts).
        similarity_top_k: how many keywords to release (default: the core's ``config.keywords``); the
            ``"experts"`` mode returns one node whatever it is (its experts are the core's ``config.k``).
        rng: the noise source (a ``numpy.random.Generator``); default a fresh OS-seeded one.
        seed: reproducible noise for tests and benchmarks only.

    Instantiate:
        ```python
        from llama_index.retrievers.dp_icl import DPICLRetriever

        retriever = DPICLRetriever(PrivateKNN(index, budget=ledger, backend=backend, releases=("decode",)))
        ```

    Invoke:
        ```python
        nodes = retriever.retrieve("How do I reset my password?")
        engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
        ```

    Spend: every release emits a ``DPSpendEvent`` (ledger entry, per-record ε and δ).
    """

    def __init__(
        self,
        knn: PrivateKNN,
        *,
        mode: Literal["experts", "answer", "keywords"] = "experts",
        similarity_top_k: int | None = None,
        rng: Any = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(knn, PrivateKNN):
            raise ConfigurationError("knn must be a dp_icl_plugin PrivateKNN")
        generator = noise_source(rng, seed)
        if mode not in ("experts", "answer", "keywords"):
            raise ConfigurationError("mode must be 'experts', 'answer' or 'keywords'")
        if similarity_top_k is not None and (
            isinstance(similarity_top_k, bool) or not isinstance(similarity_top_k, int) or similarity_top_k < 1
        ):
            raise ConfigurationError("similarity_top_k must be a positive integer")
        self._core = knn
        self._rng = generator
        self._mode = mode
        self._experts = KNNExpertDecoder(knn, template=ANSWER_PRESETS["question"]) if mode == "experts" else None
        self._keywords = similarity_top_k
        super().__init__(**kwargs)

    def __repr__(self) -> str:
        return f"DPICLRetriever(mode={self._mode!r}, {self._core!r})"

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._experts is not None:
            decoded = self._experts.answer(query_bundle.query_str, rng=self._rng)
            event = DPSpendEvent(
                ledger_entry=decoded.ledger_entry,
                release="knn-decode",
                per_record_epsilon=self._core.per_record_epsilon(),
                per_record_delta=self._core.per_record_delta(),
            )
            dispatcher.event(event)
            meta = {
                "ledger_entry": decoded.ledger_entry,
                "per_record_epsilon": event.per_record_epsilon,
                "kind": "dp_expert_answer",
            }
            return [_node(decoded.text.strip(), meta)]
        answer = self._core.answer(query_bundle.query_str, rng=self._rng, keywords=self._keywords)
        spend = DPSpendEvent(
            ledger_entry=answer.ledger_entry,
            release="knn-answer",
            per_record_epsilon=self._core.per_record_epsilon(),
            per_record_delta=self._core.per_record_delta(),
        )
        dispatcher.event(spend)
        meta = {
            "ledger_entry": answer.ledger_entry,
            "per_record_epsilon": spend.per_record_epsilon,
            "keywords_released": answer.keywords is not None,
        }
        if self._mode == "answer":
            return [_node(answer.text, {**meta, "kind": "dp_answer"})]
        return [_node(kw, {**meta, "kind": "dp_keyword"}) for kw in answer.keywords or ()]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def _node(text: str, metadata: dict[str, Any]) -> NodeWithScore:
    """A node of released text whose bookkeeping metadata (ledger entry, budget, kind) stays out of what the
    LLM and an embedding model read: LlamaIndex puts a node's metadata into the context unless excluded."""
    keys = list(metadata)
    node = TextNode(text=text, metadata=metadata, excluded_llm_metadata_keys=keys, excluded_embed_metadata_keys=keys)
    return NodeWithScore(node=node, score=1.0)
