"""Tool calls for the DP chat model, by constrained decoding (:mod:`dp_icl_plugin.decoding.tool_calls`).

``bind_tools`` and ``with_structured_output`` become a public JSON schema the decoder's tokens are restricted
to (:mod:`dp_icl_plugin.decoding.structured`): the answer is a JSON document naming one bound tool and its
arguments (or, when the model may choose, ``{"answer": ...}`` for a plain reply), which is turned into the
message's ``tool_calls`` here. The schema and the tools are the app's (public); the privacy of the answer is the
decoder's, whatever the schema.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool

from dp_icl_plugin import ConfigurationError
from dp_icl_plugin.adapters import ANSWER_KEY, parse_tool_call, tool_call_schema

__all__ = ["ANSWER_KEY", "message_fields", "tools_schema"]


def tools_schema(tools: Sequence[Any], tool_choice: Any) -> dict[str, Any] | None:
    """The JSON schema of one call of one of ``tools`` (LangChain tools, Pydantic models, functions or OpenAI
    tool dicts): :func:`~dp_icl_plugin.decoding.tool_calls.tool_call_schema` with ``tool_choice`` None/``"auto"``
    (a plain reply allowed), ``"any"``/``"required"``/True, a tool's name (also in OpenAI's dict form) or
    ``"none"`` (None: no restriction).

    Raises:
        ConfigurationError: no tools, a tool that cannot be converted, or a ``tool_choice`` naming no bound tool.
    """
    if tool_choice == "none" or tool_choice is False:
        return None
    functions = []
    for tool in tools:
        try:
            functions.append(convert_to_openai_tool(tool)["function"])
        except Exception as exc:  # LangChain raises ValueError or TypeError for what it cannot convert
            raise ConfigurationError(f"cannot turn {tool!r} into a tool schema: {exc}") from None
    if isinstance(tool_choice, dict):  # OpenAI form: {"type": "function", "function": {"name": ...}}
        tool_choice = tool_choice.get("function", {}).get("name")
    return tool_call_schema(functions, tool_choice)


def message_fields(text: str, finish_reason: str) -> dict[str, Any]:
    """The message's ``content`` and ``tool_calls`` (or ``invalid_tool_calls``) from an answer decoded under
    :func:`tools_schema`."""
    parsed = parse_tool_call(text, finish_reason)
    if parsed.error is not None:
        invalid = {"name": None, "args": text, "id": _call_id(), "error": parsed.error, "type": "invalid_tool_call"}
        return {"content": "", "invalid_tool_calls": [invalid]}
    if parsed.name is None:
        return {"content": parsed.content}
    return {
        "content": "",
        "tool_calls": [{"name": parsed.name, "args": parsed.arguments, "id": _call_id(), "type": "tool_call"}],
    }


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
