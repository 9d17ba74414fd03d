"""LlamaIndex adapters for dp-icl-plugin: a DP retriever and a DP LLM.

Thin translations between LlamaIndex's types and ``dp_icl_plugin.methods``; no privacy logic lives here.
Needs the ``llamaindex`` extra (``pip install 'dp-icl-plugin[llamaindex]'``).
"""

from dp_icl_llamaindex import _deps  # noqa: F401  (a clear ImportError without the extra)
from dp_icl_llamaindex.llm import DPLLM
from dp_icl_llamaindex.retriever import DPRetriever, DPSpendEvent

__all__ = ["DPLLM", "DPRetriever", "DPSpendEvent"]
