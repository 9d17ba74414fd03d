"""LangChain adapters for dp-icl-plugin (example selector, retriever, DP LLM and chat model).

Thin translations between LangChain's types and ``dp_icl_plugin.methods``; no privacy logic lives here.
The adapters arrive with the DP decoding issue; the package is importable now so that the distribution
layout is fixed.
"""

__all__: list[str] = []
