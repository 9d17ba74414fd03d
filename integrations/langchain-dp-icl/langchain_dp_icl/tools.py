"""Tool calls and structured output for the DP chat model, by constrained decoding.

``bind_tools`` and ``with_structured_output`` become a public JSON schema the decoder's tokens are restricted
to (:mod:`dp_icl_plugin.methods.structured`): the answer is a JSON document naming one bound tool and its
arguments (or, when the model may choose, ``{"answer": ...}`` for a plain reply), which is turned into the
message's ``tool_calls`` here. The schema and the tools are the app's (public); the privacy of the answer is the
decoder's, whatever the schema.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["ANSWER_KEY", "message_fields", "tools_schema"]

ANSWER_KEY = "answer"  # a plain reply, where the model may choose not to call a tool


def tools_schema(tools: Sequence[Any], tool_choice: Any) -> dict[str, Any] | None:
    """The JSON schema of one call of one of ``tools`` (LangChain tools, Pydantic models, functions or OpenAI
    tool dicts); with ``tool_choice`` None or ``"auto"`` a plain reply ``{"answer": "..."}`` is allowed too,
    ``"any"``/``"required"``/``True`` require a call, a tool's name requires that one, ``"none"`` gives None
    (no restriction).

    Raises:
        ConfigurationError: no tools, a tool that cannot be converted, or a ``tool_choice`` naming no bound tool.
    """
    if tool_choice == "none" or tool_choice is False:
        return None
    if not tools:
        raise ConfigurationError("bind_tools needs at least one tool")
    functions = []
    for tool in tools:
        try:
            functions.append(convert_to_openai_tool(tool)["function"])
        except Exception as exc:  # LangChain raises ValueError or TypeError for what it cannot convert
            raise ConfigurationError(f"cannot turn {tool!r} into a tool schema: {exc}") from None
    names = [f["name"] for f in functions]
    if isinstance(tool_choice, dict):  # OpenAI form: {"type": "function", "function": {"name": ...}}
        tool_choice = tool_choice.get("function", {}).get("name")
    if isinstance(tool_choice, str) and tool_choice not in ("auto", "any", "required"):
        if tool_choice not in names:
            raise ConfigurationError(f"tool_choice {tool_choice!r} names no bound tool ({', '.join(names)})")
        functions = [f for f in functions if f["name"] == tool_choice]
    calls: list[dict[str, Any]] = [
        {"type": "object", "description": f.get("description", ""),
         "properties": {"name": {"const": f["name"]},
                        "arguments": f.get("parameters") or {"type": "object", "properties": {}}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for f in functions
    ]  # fmt: skip
    if tool_choice in (None, "auto"):
        calls.append({"type": "object", "description": "a reply without a tool",
                      "properties": {ANSWER_KEY: {"type": "string"}}, "required": [ANSWER_KEY],
                      "additionalProperties": False})  # fmt: skip
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def message_fields(text: str, finish_reason: str) -> dict[str, Any]:
    """The message's ``content`` and ``tool_calls`` (or ``invalid_tool_calls``) from an answer decoded under
    :func:`tools_schema`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        why = "the answer reached max_tokens before its JSON was complete" if finish_reason == "length" else \
            "the answer is not JSON"  # fmt: skip
        return {"content": "", "invalid_tool_calls": [
            {"name": None, "args": text, "id": _call_id(), "error": why, "type": "invalid_tool_call"}]}  # fmt: skip
    if isinstance(value, dict) and ANSWER_KEY in value and "name" not in value:
        return {"content": str(value[ANSWER_KEY])}
    named = isinstance(value, dict) and isinstance(value.get("name"), str)
    if not (named and isinstance(value.get("arguments"), dict)):
        why = "not a tool call"
        return {"content": "", "invalid_tool_calls": [
            {"name": None, "args": text, "id": _call_id(), "error": why, "type": "invalid_tool_call"}]}  # fmt: skip
    return {"content": "", "tool_calls": [{"name": value["name"], "args": value["arguments"], "id": _call_id(),
                                           "type": "tool_call"}]}  # fmt: skip


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
