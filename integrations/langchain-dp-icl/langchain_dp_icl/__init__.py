"""LangChain integration of dp-icl-plugin (distribution ``langchain-dp-icl``).

A DP chat model (:class:`ChatDPICL`), a DP completion LLM (:class:`DPICLLLM`), a DP retriever
(:class:`DPICLRetriever`), a few-shot example selector serving DP synthetic demonstrations
(:class:`DPICLExampleSelector`), and the same local model without private records (:class:`ChatZeroShot`,
the baseline). Thin translations between LangChain's types and ``dp_icl_plugin``; no privacy logic lives here.
"""

from langchain_dp_icl import _deps  # noqa: F401  (a clear ImportError without langchain-core)
from langchain_dp_icl.chat_model import DPICLLLM, ChatDPICL
from langchain_dp_icl.retriever import DPICLRetriever
from langchain_dp_icl.selector import DPICLExampleSelector, LazySynthesis
from langchain_dp_icl.zero_shot import ChatZeroShot

__all__ = ["DPICLLLM", "ChatDPICL", "ChatZeroShot", "DPICLExampleSelector", "DPICLRetriever", "LazySynthesis"]
