"""LlamaIndex retriever integration of dp-icl-plugin (distribution ``llama-index-retrievers-dp-icl``).

:class:`DPICLRetriever`: context nodes holding only DP releases (keywords or an answer) from private records.
"""

from llama_index.retrievers.dp_icl import _deps  # noqa: F401  (a clear ImportError without llama-index-core)
from llama_index.retrievers.dp_icl.base import DPICLRetriever

__all__ = ["DPICLRetriever"]
