"""A LlamaIndex LLM whose every answer is DP with respect to a decoder's private records.

Wraps a :class:`~dp_icl_plugin.decoding.contract.Decoder` (``MozoDecoder`` or ``ClipBlendDecoder``); each
completion and each chat is charged to the shared ledger before its first token is computed, and the charge
is emitted as a :class:`~llama_index.llms.dp_icl.events.DPSpendEvent`. The decoder and the noise source are
private attributes: ``to_dict()`` never contains them. The async methods run the decoder (its charge
included) in worker threads, so a slow answer never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection, default_completion_to_prompt
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.dp_icl.events import DPSpendEvent
from pydantic import BaseModel, Field, PrivateAttr

from dp_icl_plugin import (
    AnswerStream,
    BudgetManager,
    ConfigurationError,
    ConfigurationTypeError,
    Decoder,
    PrivateDataset,
    build_decoder,
)
from dp_icl_plugin.adapters import (
    Query,
    answer_limit,
    check_call_settings,
    iterate_in_threads,
    noise_source,
    parse_tool_call,
    released_payload,
    spend_payload,
    tool_call_schema,
    tool_call_text,
    tool_result_text,
)

__all__ = ["DPICL"]

dispatcher = get_dispatcher(__name__)


class DPICL(CustomLLM, FunctionCallingLLM):
    """DP completions and chats over a local model or an inference server.

    Each answer is generated token by token with DP decoding (DPS-MOZO or clip-blend) over the private
    records and charged to the shared ledger, for its worst case, before its first token is computed.

    Setup:
        ```bash
        pip install llama-index-llms-dp-icl     # with dp-icl-plugin[hf] for a local model
        ```

    Key init args:
        decoder: a :class:`~dp_icl_plugin.decoding.contract.Decoder` holding the private records, the backend
            and the budget share; or use :meth:`from_model_id`.
        max_tokens: the most tokens of one answer (at most the decoder's share: above it is refused; a call's
            ``max_tokens`` may lower it). Per call, ``max_tokens`` and ``stop`` only: ``temperature`` and
            other sampling settings are refused (the mechanism decides how tokens are drawn).
        is_chat_model: whether query engines send chats (laid out by the model's chat template); default:
            whether the model has one.
        context_window: default the model's positions.
        system_prompt, completion_to_prompt, query_wrapper_prompt: LlamaIndex's usual prompt shaping,
            applied to completions that are not ``formatted``.
        rng: the noise source (a ``numpy.random.Generator``); default a fresh OS-seeded one.
        seed: reproducible noise for tests and benchmarks (never in production: the seed reveals the noise).

    Instantiate:
        ```python
        from llama_index.llms.dp_icl import DPICL

        llm = DPICL.from_model_id("smollm2-135m-instruct", private_dataset, budget=ledger,
                                  epsilon=1.0, n_queries=100, max_tokens=32)
        ```

    Invoke:
        ```python
        llm.complete("Question: what is DP?\\nAnswer:")
        llm.chat([ChatMessage(role="user", content="What is DP?")])
        ```

    Stream:
        ```python
        for r in llm.stream_complete("What is DP?"):
            print(r.delta, end="")
        async for r in await llm.astream_chat(messages):   # the loop stays free
            print(r.delta, end="")
        ```

    Tools: a function-calling LLM (``chat_with_tools``, ``predict_and_call``, ``FunctionAgent``,
    ``FunctionCallingProgram``) when ``llguidance`` is installed (the ``structured`` extra): each answer is
    decoded under the JSON schema of one call of the tools (:mod:`dp_icl_plugin.decoding.tool_calls`; public, so
    no sensitivity changes), at most one call per answer; the call is in the message's
    ``additional_kwargs["tool_calls"]``. An agent's every step is a charged answer.

    Spend: every charge emits a :class:`DPSpendEvent` through LlamaIndex's instrumentation and is put into
    the response's ``additional_kwargs``. A decoder paid per token (``pay_per_token=True``) reports an answer's
    first draw on its allowance (expert decoding: its first token's filter release); its later draws are on the
    ledger (``BudgetManager.on_charge`` sees each one).
    """

    model_name: str = "dp-icl"
    max_tokens: int | None = Field(default=None, description="The most tokens of one answer.")
    is_chat_model: bool | None = Field(default=None, description="Default: whether the model has a chat template.")
    context_window: int | None = Field(default=None, description="Default: the model's positions.")
    # structured_predict decodes under the output class's own schema: fewer tokens than a tool call wrapping it
    pydantic_program_mode: PydanticProgramMode = PydanticProgramMode.LLM
    _decoder: Any = PrivateAttr()
    _rng: Any = PrivateAttr()
    _calls_tools: bool | None = PrivateAttr(default=None)

    def __init__(self, decoder: Decoder, *, rng: Any = None, seed: int | None = None, **kwargs: Any) -> None:
        if not isinstance(decoder, Decoder):
            raise ConfigurationError("decoder must be a dp_icl_plugin Decoder (MozoDecoder, ClipBlendDecoder)")
        generator = noise_source(rng, seed)
        super().__init__(**kwargs)
        answer_limit(decoder, self.max_tokens)
        if self.context_window is not None and (isinstance(self.context_window, bool) or self.context_window < 1):
            raise ConfigurationError("context_window must be a positive integer")
        self._decoder = decoder
        self._rng = generator

    @classmethod
    def from_model_id(
        cls,
        model_id: str,
        dataset: PrivateDataset,
        *,
        budget: BudgetManager,
        method: str = "mozo",
        rng: Any = None,
        seed: int | None = None,
        **settings: Any,
    ) -> DPICL:
        """The LLM over a local model or an inference server's URL (with ``tokenizer=``); ``settings`` go to
        :func:`~dp_icl_plugin.decoding.factory.build_decoder`."""
        decoder = build_decoder(model_id, dataset, budget=budget, method=method, **settings)
        return cls(decoder, rng=rng, seed=seed, model_name=model_id)

    @classmethod
    def class_name(cls) -> str:
        return "DPICL"

    @property
    def decoder(self) -> Decoder:
        """The DP decoder (its records, backend and budget share): hand ``decoder.backend`` to a retriever or
        an index so that an app loads the model once."""
        return self._decoder

    @property
    def metadata(self) -> LLMMetadata:
        window = self.context_window or self._decoder.context_window or DEFAULT_CONTEXT_WINDOW
        chat = self._decoder.has_chat_template if self.is_chat_model is None else self.is_chat_model
        return LLMMetadata(
            context_window=window,
            num_output=answer_limit(self._decoder, self.max_tokens),
            is_chat_model=chat,
            model_name=self.model_name,
            is_function_calling_model=self._can_call_tools(),
        )

    def _can_call_tools(self) -> bool:
        """Whether answers can keep to a tool call's schema: llguidance installed, and the decoder compiles a
        schema over its backend's tokenizer (not with fixed choices); found once (public: no answer, no charge).
        LlamaIndex picks its agents and programs by it."""
        if self._calls_tools is None:
            probe = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
            try:
                self._decoder.check("tool check", schema=probe)
            except Exception:  # no llguidance, a tokenizer it cannot read, a decoder with choices
                self._calls_tools = False
            else:
                self._calls_tools = True
        return self._calls_tools

    # -- translation --------------------------------------------------------------------------------
    def _prompt(self, prompt: str, formatted: bool) -> str:
        """LlamaIndex's prompt shaping for a completion that is not ``formatted`` yet."""
        if not isinstance(prompt, str):
            raise ConfigurationError("prompt must be a string")
        if formatted:
            return prompt
        if self.query_wrapper_prompt is not None:
            prompt = self.query_wrapper_prompt.format(query_str=prompt)
        if self.completion_to_prompt is not None and self.completion_to_prompt is not default_completion_to_prompt:
            return self.completion_to_prompt(prompt)
        return f"{self.system_prompt}\n\n{prompt}" if self.system_prompt else prompt

    @staticmethod
    def _chat(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        """The conversation as role/content messages: an assistant's tool calls written as the JSON the model
        answers them in, a tool's result as the user's next message."""
        if (
            isinstance(messages, (str, bytes))
            or not isinstance(messages, Sequence)
            or not all(isinstance(m, ChatMessage) for m in messages)
        ):
            raise ConfigurationError("messages must be a list of llama_index ChatMessage")
        out = []
        names: dict[str, str] = {}  # a call's id → its tool, for the result that answers it
        for m in messages:
            if m.role.value == "tool":
                call_id = str(m.additional_kwargs.get("tool_call_id", ""))
                name = m.additional_kwargs.get("name") or names.get(call_id, "")
                out.append({"role": "user", "content": tool_result_text(name, m.content or "")})
                continue
            calls = []
            for call in m.additional_kwargs.get("tool_calls") or ():
                name, arguments = _call_fields(call)
                names[str(call.get("id", ""))] = name
                calls.append(tool_call_text(name, arguments))
            out.append({"role": m.role.value, "content": "\n".join([*([m.content] if m.content else []), *calls])})
        return out

    @staticmethod
    def _tool_schema(kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The public schema of a call of the call's ``tools`` (function dicts or LlamaIndex tools), or the
        call's ``json_schema``, or None."""
        tools = kwargs.get("tools")
        if tools is None:
            return kwargs.get("json_schema")
        if kwargs.get("json_schema") is not None:
            raise ConfigurationError("give tools or a json_schema, not both")
        return tool_call_schema(_functions(tools), kwargs.get("tool_choice"))

    def _open(self, query: Query, kwargs: dict[str, Any]) -> AnswerStream:
        """The answer's stream; every check runs here, before anything is charged."""
        check_call_settings(kwargs, honoured=("max_tokens", "stop", "json_schema", "tools", "tool_choice"))
        limit = answer_limit(self._decoder, kwargs.get("max_tokens", self.max_tokens))
        return self._decoder.stream(
            query, rng=self._rng, max_tokens=limit, stop=kwargs.get("stop"), schema=self._tool_schema(kwargs)
        )

    @staticmethod
    def _spend(pieces: AnswerStream) -> dict[str, Any]:
        """Emit the charge as a DPSpendEvent (once charged); the same fields go into the response."""
        if pieces.charge is None:
            return {}
        payload = spend_payload(pieces.charge)
        dispatcher.event(DPSpendEvent(**payload))
        return payload

    def _texts(self, pieces: AnswerStream, spend: dict[str, Any]) -> Any:
        """(delta, text so far) per piece; the spend is reported once charged, even on an early stop."""
        text = ""
        try:
            for piece in pieces:
                if not spend:
                    spend.update(self._spend(pieces))
                text += piece
                yield piece, text
        finally:
            pieces.close()
            if not spend:
                spend.update(self._spend(pieces))

    def _whole(self, query: Query, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], AnswerStream]:
        """The whole answer, the spend and finish reason to report, and the answer's stream (spent)."""
        spend: dict[str, Any] = {}
        pieces = self._open(query, kwargs)
        text = "".join(delta for delta, _ in self._texts(pieces, spend))
        return text, {**spend, **released_payload(pieces), "finish_reason": pieces.finish_reason}, pieces

    async def _awhole(self, query: Query, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], AnswerStream]:
        """:meth:`_whole` stepped in worker threads: a caller that gives up before the answer began (queued
        for a fixed-latency window, say) leaves uncharged."""
        spend: dict[str, Any] = {}
        pieces = await asyncio.to_thread(self._open, query, kwargs)
        steps = iterate_in_threads(lambda: self._texts(pieces, spend), on_cancel=pieces.cancel)
        text = "".join([delta async for delta, _ in steps])
        return text, {**spend, **released_payload(pieces), "finish_reason": pieces.finish_reason}, pieces

    # -- structured output --------------------------------------------------------------------------
    def _schema_kwargs(self, output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """``llm_kwargs`` with ``output_cls``'s JSON schema: the answer's tokens keep to it
        (:mod:`dp_icl_plugin.decoding.structured`; a public support), so LlamaIndex's parser gets valid JSON. In
        another ``pydantic_program_mode`` LlamaIndex asks for a tool call instead, whose schema does the same."""
        if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
            raise ConfigurationTypeError("output_cls must be a Pydantic model class")
        if self.pydantic_program_mode != PydanticProgramMode.LLM:
            return dict(llm_kwargs or {})
        return {**(llm_kwargs or {}), "json_schema": output_cls.model_json_schema()}

    def structured_predict(
        self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Any:
        """LlamaIndex's structured prediction, decoded under ``output_cls``'s JSON schema (one charged answer)."""
        return super().structured_predict(
            output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs), **prompt_args
        )

    async def astructured_predict(
        self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Any:
        """:meth:`structured_predict`, the answer stepped in worker threads."""
        return await super().astructured_predict(
            output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs), **prompt_args
        )

    def stream_structured_predict(
        self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Any:
        """:meth:`structured_predict`, streamed as LlamaIndex streams partial objects."""
        return super().stream_structured_predict(
            output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs), **prompt_args
        )

    async def astream_structured_predict(
        self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Any:
        """:meth:`stream_structured_predict` for async callers."""
        kwargs = self._schema_kwargs(output_cls, llm_kwargs)
        return await super().astream_structured_predict(output_cls, prompt, kwargs, **prompt_args)

    # -- tools --------------------------------------------------------------------------------------
    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The chat's arguments: the history, the user's message and the tools as function descriptions (the
        call's schema is built, and a bad tool refused, here: before any charge). One call per answer whatever
        ``allow_parallel_tool_calls``; ``tool_required`` (or a ``tool_choice``) makes the answer a call."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                user_msg if isinstance(user_msg, ChatMessage) else ChatMessage(role="user", content=user_msg)
            )
        functions = _functions(tools)
        choice = kwargs.pop("tool_choice", None)
        if choice is None:
            choice = "required" if tool_required else "auto"
        tool_call_schema(functions, choice)
        return {"messages": messages, "tools": functions, "tool_choice": choice, **kwargs}

    def predict_and_call(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        error_on_no_tool_call: bool = True,
        error_on_tool_error: bool = False,
        **kwargs: Any,
    ) -> Any:
        """LlamaIndex's ``predict_and_call``; with ``error_on_no_tool_call`` (its default) the answer is made a
        call (``tool_required``) unless a ``tool_choice`` is given: a plain reply would be charged, then raise."""
        return super().predict_and_call(
            tools,
            user_msg,
            chat_history,
            verbose,
            allow_parallel_tool_calls,
            error_on_no_tool_call,
            error_on_tool_error,
            **self._call_required(error_on_no_tool_call, kwargs),
        )

    async def apredict_and_call(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        error_on_no_tool_call: bool = True,
        error_on_tool_error: bool = False,
        **kwargs: Any,
    ) -> Any:
        """:meth:`predict_and_call` for async callers."""
        return await super().apredict_and_call(
            tools,
            user_msg,
            chat_history,
            verbose,
            allow_parallel_tool_calls,
            error_on_no_tool_call,
            error_on_tool_error,
            **self._call_required(error_on_no_tool_call, kwargs),
        )

    @staticmethod
    def _call_required(error_on_no_tool_call: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
        if error_on_no_tool_call and kwargs.get("tool_choice") is None and "tool_required" not in kwargs:
            return {**kwargs, "tool_required": True}
        return kwargs

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The answer's tool call (at most one), as LlamaIndex's agents read it.

        Raises:
            ValueError: no tool call and ``error_on_no_tool_call`` (LlamaIndex's own contract).
        """
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            error = response.message.additional_kwargs.get("tool_call_error")
            raise ValueError(f"the answer made no tool call{f' ({error})' if error else ''}")
        return [ToolSelection(tool_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"]) for c in calls]

    @staticmethod
    def _calls(kwargs: dict[str, Any]) -> bool:
        """Whether the answer is decoded as a tool call (or a plain reply in its JSON): tools, not "none"."""
        return kwargs.get("tools") is not None and kwargs.get("tool_choice") not in ("none", False)

    @staticmethod
    def _message(text: str, pieces: AnswerStream, kwargs: dict[str, Any]) -> ChatMessage:
        """The assistant's message: the text, or, under tools, the reply or the call the answer decoded to."""
        if not DPICL._calls(kwargs) or not pieces.token_ids:
            return ChatMessage(role="assistant", content=text)
        parsed = parse_tool_call(text, pieces.finish_reason)
        extra: dict[str, Any] = {}
        if parsed.name is not None:
            extra["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "name": parsed.name, "arguments": parsed.arguments}
            ]
        elif parsed.error is not None:
            extra["tool_call_error"] = parsed.error
        return ChatMessage(role="assistant", content=parsed.content, additional_kwargs=extra)

    # -- completions --------------------------------------------------------------------------------
    def _complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        text, info, _ = self._whole(self._prompt(prompt, formatted), kwargs)
        return CompletionResponse(text=text, additional_kwargs=info)

    def _completions(self, pieces: AnswerStream) -> CompletionResponseGen:
        spend: dict[str, Any] = {}
        for delta, text in self._texts(pieces, spend):
            yield CompletionResponse(text=text, delta=delta, additional_kwargs=spend)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._completions(self._open(self._prompt(prompt, formatted), kwargs))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        text, info, _ = await self._awhole(self._prompt(prompt, formatted), kwargs)
        return CompletionResponse(text=text, additional_kwargs=info)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        pieces = await asyncio.to_thread(self._open, self._prompt(prompt, formatted), kwargs)
        return iterate_in_threads(lambda: self._completions(pieces), on_cancel=pieces.cancel)

    # -- chats --------------------------------------------------------------------------------------
    def _chats(self, pieces: AnswerStream, kwargs: dict[str, Any]) -> ChatResponseGen:
        """The chat's responses piece by piece; under tools one response, the call or the reply, at the end."""
        spend: dict[str, Any] = {}
        text = ""
        for delta, text in self._texts(pieces, spend):
            if not self._calls(kwargs):
                yield ChatResponse(
                    message=ChatMessage(role="assistant", content=text), delta=delta, additional_kwargs=spend
                )
        if self._calls(kwargs):
            message = self._message(text, pieces, kwargs)
            yield ChatResponse(message=message, delta=message.content, additional_kwargs=spend)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text, info, pieces = self._whole(self._chat(messages), kwargs)
        return ChatResponse(message=self._message(text, pieces, kwargs), additional_kwargs=info)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chats(self._open(self._chat(messages), kwargs), kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text, info, pieces = await self._awhole(self._chat(messages), kwargs)
        return ChatResponse(message=self._message(text, pieces, kwargs), additional_kwargs=info)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        pieces = await asyncio.to_thread(self._open, self._chat(messages), kwargs)
        return iterate_in_threads(lambda: self._chats(pieces, kwargs), on_cancel=pieces.cancel)


def _call_fields(call: Any) -> tuple[str, dict[str, Any]]:
    """A tool call in a chat history (this LLM's ``{"name", "arguments"}`` or OpenAI's ``{"function": {...}}``)
    as its tool's name and arguments.

    Raises:
        ConfigurationError: another shape (before any charge).
    """
    fields = call.get("function", call) if isinstance(call, dict) else None
    name = fields.get("name") if isinstance(fields, dict) else None
    arguments = fields.get("arguments") if isinstance(fields, dict) else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ConfigurationError("a tool call in the history needs a name and its arguments (an object)")
    return name, arguments


def _functions(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Tools (LlamaIndex tools, or function descriptions already) as OpenAI function descriptions."""
    return [t if isinstance(t, dict) else t.metadata.to_openai_tool(skip_length_check=True)["function"] for t in tools]
