"""Tool calls by constrained decoding: one JSON schema for "call one of these functions", and the answer read back.

The frameworks' tool calling (LangChain ``bind_tools``, LlamaIndex ``chat_with_tools``) becomes a public JSON
schema the decoder's tokens are restricted to (:mod:`dp_icl_plugin.decoding.structured`): the answer is a JSON
document ``{"name": <a tool>, "arguments": {...}}``, or, when the model may choose not to call one,
``{"answer": "..."}``. The tools are the app's, public; the answer's privacy is the decoder's whatever the
schema (a public support changes no sensitivity). At most one call per answer. A tool's result comes back as
public text in the next prompt (:func:`tool_result_text`): a tool must return public data or its own DP
release. Framework-free: the adapters turn their tools into the OpenAI function form (``name``,
``description``, ``parameters``) and the parsed call into their messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["ANSWER_KEY", "ParsedToolCall", "parse_tool_call", "tool_call_schema", "tool_call_text", "tool_result_text"]

ANSWER_KEY = "answer"  # a plain reply, where the model may choose not to call a tool
_REPLY_START = re.compile(r'\s*\{\s*"' + ANSWER_KEY + r'"\s*:\s*"')
_REQUIRED = ("any", "required")


def tool_call_schema(functions: Sequence[Mapping[str, Any]], choice: object = None) -> dict[str, Any] | None:
    """The JSON schema of one call of one of ``functions``.

    Args:
        functions: OpenAI-style function descriptions (``name``, optional ``description`` and ``parameters``,
            a JSON schema of the arguments).
        choice: None or ``"auto"`` (a call or a plain reply ``{"answer": "..."}``), ``"any"``, ``"required"`` or
            True (a call), a function's name (a call of that one), ``"none"`` or False (no restriction: None).

    Returns:
        The schema, or None when ``choice`` asks for no tool.

    Raises:
        ConfigurationError: no functions, a function without a name, or a ``choice`` naming none of them.
    """
    if choice == "none" or choice is False:
        return None
    if not functions:
        raise ConfigurationError("tool calling needs at least one tool")
    names = [f.get("name") for f in functions]
    if not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError("every tool needs a name")
    chosen = list(functions)
    if isinstance(choice, str) and choice not in ("auto", *_REQUIRED):
        if choice not in names:
            raise ConfigurationError(f"tool_choice {choice!r} names no bound tool ({', '.join(map(str, names))})")
        chosen = [f for f in functions if f["name"] == choice]
    elif not (choice is None or choice is True or choice in ("auto", *_REQUIRED)):
        raise ConfigurationError(f"tool_choice {choice!r} is not 'auto', 'any', 'required', 'none' or a tool's name")
    calls: list[dict[str, Any]] = [
        {
            "type": "object",
            "description": f.get("description") or "",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in chosen
    ]
    if choice is None or choice == "auto":
        calls.append(
            {
                "type": "object",
                "description": "a reply without a tool",
                "properties": {ANSWER_KEY: {"type": "string"}},
                "required": [ANSWER_KEY],
                "additionalProperties": False,
            }
        )
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


@dataclass(frozen=True)
class ParsedToolCall:
    """An answer decoded under :func:`tool_call_schema`: a call (``name``, ``arguments``), a plain reply
    (``content``), or neither, with ``error`` saying why (``text`` keeps the answer).

    Attributes:
        content: the plain reply (empty for a call or an error).
        name: the called tool's name, or None.
        arguments: the call's arguments, or None.
        error: why the answer is neither a call nor a reply, or None.
        text: the answer as decoded.
    """

    content: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None
    text: str = ""


def parse_tool_call(text: str, finish_reason: str) -> ParsedToolCall:
    """Read an answer decoded under :func:`tool_call_schema`; never raises (a malformed answer is an error
    value, as the frameworks' invalid tool calls are).

    Args:
        text: the answer.
        finish_reason: the decoder's (``"length"``: the answer was cut before its JSON was complete; a plain
            reply cut so is still a reply, its text up to the cut).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        cut_reply = _REPLY_START.match(text) if finish_reason == "length" else None
        if cut_reply is not None:  # a plain reply cut by max_tokens: the paid-for words so far are the reply
            return ParsedToolCall(_partial_string(text[cut_reply.end() :]), text=text)
        why = (
            "the answer reached max_tokens before its JSON was complete"
            if finish_reason == "length"
            else "the answer is not JSON"
        )
        return ParsedToolCall("", error=why, text=text)
    if isinstance(value, dict) and ANSWER_KEY in value and "name" not in value:
        return ParsedToolCall(str(value[ANSWER_KEY]), text=text)
    if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("arguments"), dict):
        return ParsedToolCall("", name=value["name"], arguments=value["arguments"], text=text)
    return ParsedToolCall("", error="not a tool call", text=text)


def _partial_string(body: str) -> str:
    """The text of a JSON string cut before its closing quote (an escape cut in half is dropped)."""
    for end in range(len(body), max(len(body) - 6, 0) - 1, -1):
        try:
            return str(json.loads(f'"{body[:end]}"'))
        except json.JSONDecodeError:
            continue
    return ""


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """An earlier call in a chat history as the model answers calls (the JSON :func:`tool_call_schema` allows).

    Args:
        name: the tool's name.
        arguments: the call's arguments.
    """
    return json.dumps({"name": name, "arguments": dict(arguments)})


def tool_result_text(name: str, result: str) -> str:
    """A tool's result as the model reads it: the user's next message, naming the tool (the app's, public).

    Args:
        name: the tool's name (may be empty).
        result: what it returned (public).
    """
    return f"Result of the tool call {name}: {result}" if name else f"Result of the tool call: {result}"
