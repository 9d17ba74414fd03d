"""A LlamaIndex retriever that returns only DP-released content from private records.

Each query runs keyword-space aggregation over the nearest private records
(:meth:`~dp_icl_plugin.methods.knn.PrivateRetriever.answer`); the nodes hold the released keywords or the
DP answer, never record texts or ids. The spend is emitted as a :class:`DPSpendEvent` through LlamaIndex's
instrumentation. ``aretrieve`` runs the release in a worker thread, so it does not block the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import numpy as np
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.methods.knn import PrivateRetriever

__all__ = ["DPRetriever", "DPSpendEvent"]

dispatcher = get_dispatcher(__name__)


class DPSpendEvent(BaseEvent):
    """A release charged to the private index's filter and recorded in the shared ledger."""

    ledger_entry: int
    release: str
    per_record_epsilon: float
    per_record_delta: float

    @classmethod
    def class_name(cls) -> str:
        return "DPSpendEvent"


class DPRetriever(BaseRetriever):
    """DP context nodes from a :class:`~dp_icl_plugin.methods.knn.PrivateRetriever`.

    Args:
        retriever: the private kNN core.
        rng: the noise source.
        mode: ``"answer"`` (default: one node with the DP answer built from the released keywords, or the
            0-shot answer when the stability test fails) or ``"keywords"`` (one node per released keyword).
        keywords: how many keywords to release (default: the core's ``config.keywords``).
    """

    def __init__(
        self,
        retriever: PrivateRetriever,
        *,
        rng: np.random.Generator,
        mode: Literal["answer", "keywords"] = "answer",
        keywords: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(retriever, PrivateRetriever):
            raise ConfigurationError("retriever must be a dp_icl_plugin PrivateRetriever")
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationError("rng must be a numpy.random.Generator")
        if mode not in ("answer", "keywords"):
            raise ConfigurationError("mode must be 'answer' or 'keywords'")
        self._core = retriever
        self._rng = rng
        self._mode = mode
        self._keywords = keywords
        super().__init__(**kwargs)

    def __repr__(self) -> str:
        return f"DPRetriever(mode={self._mode!r}, {self._core!r})"

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        answer = self._core.answer(query_bundle.query_str, rng=self._rng, keywords=self._keywords)
        spend = DPSpendEvent(ledger_entry=answer.ledger_entry, release="knn-answer",
                             per_record_epsilon=self._core.per_record_epsilon(),
                             per_record_delta=self._core.index.filter.budget.delta)  # fmt: skip
        dispatcher.event(spend)
        meta = {"ledger_entry": answer.ledger_entry, "per_record_epsilon": spend.per_record_epsilon,
                "stability_test_passed": answer.keywords is not None}  # fmt: skip
        if self._mode == "answer":
            return [NodeWithScore(node=TextNode(text=answer.text, metadata={**meta, "kind": "dp_answer"}), score=1.0)]
        return [NodeWithScore(node=TextNode(text=kw, metadata={**meta, "kind": "dp_keyword"}), score=1.0)
                for kw in answer.keywords or ()]  # fmt: skip

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
