"""Private nearest-neighbour DP-ICL: a private index with per-record Rényi filters, three DP releases and expert
decoding (:class:`KNNExpertDecoder`, the nearest records steering every token of an answer).

See :mod:`dp_icl_plugin.methods.knn.retriever` for the privacy argument. Needs the ``retrieval`` extra
(faiss, sentence-transformers) for the index; the releases need a backend only for LLM steps.
"""

from dp_icl_plugin.methods.knn.embedding import DEFAULT_EMBEDDER_NAME, default_embedder
from dp_icl_plugin.methods.knn.experts import KNNExpertDecoder
from dp_icl_plugin.methods.knn.index import PrivateIndex
from dp_icl_plugin.methods.knn.prompts import AnswerPrompt, ClassificationPrompt, KeywordAnswerPrompt
from dp_icl_plugin.methods.knn.retriever import (
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
    "Answer",
    "AnswerPrompt",
    "Classification",
    "ClassificationPrompt",
    "KNNConfig",
    "KNNExpertDecoder",
    "KeywordAnswerPrompt",
    "PrivateIndex",
    "PrivateKNN",
    "PrivateText",
    "Retrieval",
    "RetrievedRecord",
    "default_embedder",
    "noise_for_uses",
    "token_epsilon_for_uses",
]
