"""LangChain adapters for dp-icl-plugin: a DP few-shot example selector, a DP retriever, a DP chat model and LLM.

Thin translations between LangChain's types and ``dp_icl_plugin.methods``; no privacy logic lives here.
Needs the ``langchain`` extra (``pip install 'dp-icl-plugin[langchain]'``).
"""

from dp_icl_langchain import _deps  # noqa: F401  (a clear ImportError without the extra)
from dp_icl_langchain.chat_model import DPLLM, DPChatModel, build_decoder
from dp_icl_langchain.retriever import DPPrivateRetriever
from dp_icl_langchain.selector import DPFewShotExampleSelector

__all__ = ["DPLLM", "DPChatModel", "DPFewShotExampleSelector", "DPPrivateRetriever", "build_decoder"]
