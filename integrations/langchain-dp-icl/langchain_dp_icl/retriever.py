"""A LangChain retriever that returns only DP-released content from private records.

Anything a retriever returns reaches every tracer (``on_retriever_end``) and the LLM prompt, so raw private
records never leave: by default each query is answered by expert decoding, the nearest private records
steering every token (:class:`~dp_icl_plugin.retrieval.KNNExpertDecoder`), and the retriever returns that
DP answer as one ``Document``; or a keyword-space aggregation over them
(:meth:`~dp_icl_plugin.retrieval.PrivateKNN.answer`) releases keywords (one ``Document`` each, up to ``k``)
or the answer built from them. Metadata: the release kind, the
ledger entry and the per-record budget; never record ids, texts or how many records took part (that count
depends on the private data). The budget spend is reported as a custom callback event ``dp_icl_spend``.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr

from dp_icl_plugin import ANSWER_PRESETS, ConfigurationError, KNNExpertDecoder, PrivateKNN
from dp_icl_plugin.adapters import noise_source

__all__ = ["DPICLRetriever"]


class DPICLRetriever(BaseRetriever):
    """DP context for RAG from a :class:`~dp_icl_plugin.retrieval.PrivateKNN` (private kNN over records).

    Each query is one DP release over the nearest private records, charged to each record's own filter and
    recorded in the shared ledger. By default (``mode="experts"``) it is expert decoding: the k nearest records
    steer every token of one answer, returned as one ``Document``; the keyword modes release keyword-space
    aggregation instead. Documents hold only what was released. Build the core over an index kept beside the
    ledger (:func:`~dp_icl_plugin.retrieval.kept_index`) so that a restarted app does not pay its cover again.

    Setup:
        ```bash
        pip install langchain-dp-icl            # with dp-icl-plugin[retrieval]
        ```

    Key init args:
        knn: the private kNN core (its index, ledger, backend and settings).
        mode: ``"experts"`` (default: one Document, the answer the nearest records decode, each paying its
            own budget; the records' answers, or labels, are what they teach), ``"keywords"`` (one Document
            per released keyword, at most ``k``; none when no keyword is released) or ``"answer"`` (one
            Document: the DP answer generated from the keywords, or the 0-shot answer when none is released).
            Keyword modes are refused before any charge when the budget lets no keyword pass (build the core with
            ``releases=("answer",)`` for that to be checked before its filter's cover is charged; ``("decode",)``
            for experts).
        k: keywords to release (default: the core's ``config.keywords``); a call's ``k`` overrides it. The
            ``"experts"`` mode returns one Document whatever ``k`` (its experts are the core's ``config.k``).
        rng: the noise source (a ``numpy.random.Generator``); default a fresh OS-seeded one.
        seed: reproducible noise for tests and benchmarks only.

    Instantiate:
        ```python
        from langchain_dp_icl import DPICLRetriever

        retriever = DPICLRetriever(knn=PrivateKNN(index, budget=ledger, backend=backend, releases=("decode",)))
        ```

    Invoke:
        ```python
        docs = retriever.invoke("How do I reset my password?")
        chain = {"context": retriever, "question": RunnablePassthrough()} | prompt | llm
        ```

    Spend: every release emits the custom callback event ``dp_icl_spend`` (ledger entry, per-record ε and
    δ); the Documents' metadata carries the same.
    """

    knn: Any = Field(exclude=True, repr=False)
    _experts: Any = PrivateAttr(default=None)
    rng: Any = Field(default=None, exclude=True, repr=False)
    seed: int | None = Field(default=None, exclude=True, repr=False)
    mode: Literal["experts", "keywords", "answer"] = "experts"
    k: int | None = None
    model_config = ConfigDict(arbitrary_types_allowed=True)

    def model_post_init(self, context: Any) -> None:
        if not isinstance(self.knn, PrivateKNN):
            raise ConfigurationError("knn must be a dp_icl_plugin PrivateKNN")
        self.rng = noise_source(self.rng, self.seed)
        experts = self.mode == "experts"
        self._experts = KNNExpertDecoder(self.knn, template=ANSWER_PRESETS["question"]) if experts else None
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            raise ConfigurationError("k must be a positive integer")

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return False

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        if self._experts is not None:
            decoded = self._experts.answer(query, rng=self.rng)
            spend = {
                "ledger_entry": decoded.ledger_entry,
                "release": "knn-decode",
                "per_record_epsilon": self.knn.per_record_epsilon(),
                "per_record_delta": self.knn.per_record_delta(),
            }
            run_manager.get_child().on_custom_event("dp_icl_spend", spend, run_id=run_manager.run_id)
            return [Document(page_content=decoded.text.strip(), metadata={**spend, "kind": "dp_expert_answer"})]
        wanted = k if k is not None else self.k
        answer = self.knn.answer(query, rng=self.rng, keywords=wanted)
        spend = {
            "ledger_entry": answer.ledger_entry,
            "release": "knn-answer",
            "per_record_epsilon": self.knn.per_record_epsilon(),
            "per_record_delta": self.knn.per_record_delta(),
        }
        run_manager.get_child().on_custom_event("dp_icl_spend", spend, run_id=run_manager.run_id)
        meta = {**spend, "keywords_released": answer.keywords is not None}
        if self.mode == "answer":
            return [Document(page_content=answer.text, metadata={**meta, "kind": "dp_answer"})]
        return [Document(page_content=kw, metadata={**meta, "kind": "dp_keyword"}) for kw in answer.keywords or ()]
