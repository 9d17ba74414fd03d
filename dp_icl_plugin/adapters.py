"""What the adapter distributions (``langchain-dp-icl``, ``llama-index-llms-dp-icl``, ``llama-index-retrievers-dp-icl``)
use of the core beyond its public API (:mod:`dp_icl_plugin`): the decoder contract's checks, spend payload and
released keywords, the layout of a chat prompt, tool calls in and out of a JSON schema, the noise source, the
thread stepping that async callers are served with, greedy decoding for the public zero-shot baseline, and the
embedder's batch call.

Stable for the adapters; an application has no need of it.
"""

from dp_icl_plugin._runtime.randomness import noise_source
from dp_icl_plugin._runtime.threaded import iterate_in_threads, wait_through_cancellations
from dp_icl_plugin.backends.generation import greedy_generate
from dp_icl_plugin.decoding.contract import (
    TEMPERATURE_REFUSED,
    Query,
    answer_limit,
    check_call_settings,
    check_query,
    released_payload,
    spend_payload,
)
from dp_icl_plugin.decoding.decoders import chat_ids
from dp_icl_plugin.decoding.tool_calls import (
    ANSWER_KEY,
    parse_tool_call,
    tool_call_schema,
    tool_call_text,
    tool_result_text,
)
from dp_icl_plugin.retrieval.embedding import embed_texts
from dp_icl_plugin.synthesis.method import load_saved

__all__ = [
    "ANSWER_KEY",
    "TEMPERATURE_REFUSED",
    "Query",
    "answer_limit",
    "chat_ids",
    "check_call_settings",
    "check_query",
    "embed_texts",
    "greedy_generate",
    "iterate_in_threads",
    "load_saved",
    "noise_source",
    "parse_tool_call",
    "released_payload",
    "spend_payload",
    "tool_call_schema",
    "tool_call_text",
    "tool_result_text",
    "wait_through_cancellations",
]
