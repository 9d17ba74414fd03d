"""Private nearest-neighbour DP-ICL: a private index with per-record Rényi filters and three DP releases (expert
decoding over the index, the nearest records steering every token of an answer, is
:class:`~dp_icl_plugin.decoding.KNNExpertDecoder`).

See :mod:`dp_icl_plugin.retrieval.retriever` for the privacy argument. Needs the ``retrieval`` extra
(faiss, sentence-transformers) for the index; the releases need a backend only for LLM steps.
"""

from dp_icl_plugin.retrieval.durable import DEFAULT_INDEX_NAME, index_beside, kept_index
from dp_icl_plugin.retrieval.embedding import DEFAULT_EMBEDDER_NAME, default_embedder
from dp_icl_plugin.retrieval.index import PrivateIndex
from dp_icl_plugin.retrieval.prompts import AnswerPrompt, ClassificationPrompt, KeywordAnswerPrompt
from dp_icl_plugin.retrieval.retriever import (
    Answer,
    Classification,
    KNNConfig,
    PrivateKNN,
    PrivateText,
    Retrieval,
    RetrievedRecord,
    noise_for_uses,
    token_epsilon_for_uses,
)

__all__ = [
    "DEFAULT_EMBEDDER_NAME",
    "DEFAULT_INDEX_NAME",
    "Answer",
    "AnswerPrompt",
    "Classification",
    "ClassificationPrompt",
    "KNNConfig",
    "KeywordAnswerPrompt",
    "PrivateIndex",
    "PrivateKNN",
    "PrivateText",
    "Retrieval",
    "RetrievedRecord",
    "default_embedder",
    "index_beside",
    "kept_index",
    "noise_for_uses",
    "token_epsilon_for_uses",
]
