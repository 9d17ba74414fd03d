"""LlamaIndex LLM integration of dp-icl-plugin (distribution ``llama-index-llms-dp-icl``).

:class:`DPICL`: completions and chats whose every answer is DP with respect to a decoder's private records;
:class:`DPSpendEvent`: the instrumentation event every DP release emits. No privacy logic lives here.
"""

from llama_index.llms.dp_icl import _deps  # noqa: F401  (a clear ImportError without llama-index-core)
from llama_index.llms.dp_icl.base import DPICL
from llama_index.llms.dp_icl.events import DPSpendEvent

__all__ = ["DPICL", "DPSpendEvent"]
