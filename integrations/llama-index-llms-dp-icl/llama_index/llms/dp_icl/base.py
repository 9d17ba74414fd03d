"""A LlamaIndex LLM whose every answer is DP with respect to a decoder's private records.

Wraps a :class:`~dp_icl_plugin.methods.decoder.Decoder` (``MozoDecoder`` or ``ClipBlendDecoder``); each
completion and each chat is charged to the shared ledger before its first token is computed, and the charge
is emitted as a :class:`~llama_index.llms.dp_icl.events.DPSpendEvent`. The decoder and the noise source are
private attributes: ``to_dict()`` never contains them. The async methods run the decoder (its charge
included) in worker threads, so a slow answer never blocks the event loop.
"""

from __future__ import annotations

import asyncio
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
from llama_index.core.llms.llm import default_completion_to_prompt
from llama_index.llms.dp_icl.events import DPSpendEvent
from pydantic import BaseModel, Field, PrivateAttr

from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.methods.data import PrivateDataset
from dp_icl_plugin.methods.decoder import (
    AnswerStream,
    Decoder,
    Query,
    answer_limit,
    check_call_settings,
    spend_payload,
)
from dp_icl_plugin.methods.decoding import build_decoder
from dp_icl_plugin.methods.randomness import noise_source
from dp_icl_plugin.methods.threaded import iterate_in_threads

__all__ = ["DPICL"]

dispatcher = get_dispatcher(__name__)


class DPICL(CustomLLM):
    """DP completions and chats over a local model or an inference server.

    Each answer is generated token by token with DP decoding (DPS-MOZO or clip-blend) over the private
    records and charged to the shared ledger, for its worst case, before its first token is computed.

    Setup:
        ```bash
        pip install llama-index-llms-dp-icl     # with dp-icl-plugin[hf] for a local model
        ```

    Key init args:
        decoder: a :class:`~dp_icl_plugin.methods.decoder.Decoder` holding the private records, the backend
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

    Spend: every charge emits a :class:`DPSpendEvent` through LlamaIndex's instrumentation and is put into
    the response's ``additional_kwargs``.
    """

    model_name: str = "dp-icl"
    max_tokens: int | None = Field(default=None, description="The most tokens of one answer.")
    is_chat_model: bool | None = Field(default=None, description="Default: whether the model has a chat template.")
    context_window: int | None = Field(default=None, description="Default: the model's positions.")
    _decoder: Any = PrivateAttr()
    _rng: Any = PrivateAttr()

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
        cls, model_id: str, dataset: PrivateDataset, *, budget: BudgetManager, method: str = "mozo",
        rng: Any = None, seed: int | None = None, **settings: Any,
    ) -> DPICL:  # fmt: skip
        """The LLM over a local model or an inference server's URL (with ``tokenizer=``); ``settings`` go to
        :func:`~dp_icl_plugin.methods.decoding.build_decoder`."""
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
        return LLMMetadata(context_window=window, num_output=answer_limit(self._decoder, self.max_tokens),
                           is_chat_model=chat, model_name=self.model_name)  # fmt: skip

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
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) \
                or not all(isinstance(m, ChatMessage) for m in messages):  # fmt: skip
            raise ConfigurationError("messages must be a list of llama_index ChatMessage")
        return [{"role": m.role.value, "content": m.content or ""} for m in messages]

    def _open(self, query: Query, kwargs: dict[str, Any]) -> AnswerStream:
        """The answer's stream; every check runs here, before anything is charged."""
        check_call_settings(kwargs, honoured=("max_tokens", "stop", "json_schema"))
        limit = answer_limit(self._decoder, kwargs.get("max_tokens", self.max_tokens))
        return self._decoder.stream(query, rng=self._rng, max_tokens=limit, stop=kwargs.get("stop"),
                                    schema=kwargs.get("json_schema"))  # fmt: skip

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

    def _whole(self, query: Query, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        spend: dict[str, Any] = {}
        pieces = self._open(query, kwargs)
        text = "".join(delta for delta, _ in self._texts(pieces, spend))
        return text, {**spend, "finish_reason": pieces.finish_reason}

    async def _awhole(self, query: Query, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """:meth:`_whole` stepped in worker threads: a caller that gives up before the answer began (queued
        for a fixed-latency window, say) leaves uncharged."""
        spend: dict[str, Any] = {}
        pieces = await asyncio.to_thread(self._open, query, kwargs)
        steps = iterate_in_threads(lambda: self._texts(pieces, spend), on_cancel=pieces.cancel)
        text = "".join([delta async for delta, _ in steps])
        return text, {**spend, "finish_reason": pieces.finish_reason}

    # -- structured output --------------------------------------------------------------------------
    @staticmethod
    def _schema_kwargs(output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """``llm_kwargs`` with ``output_cls``'s JSON schema: the answer's tokens keep to it
        (:mod:`dp_icl_plugin.methods.structured`; a public support), so LlamaIndex's parser gets valid JSON."""
        if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
            raise ConfigurationError("output_cls must be a Pydantic model class")
        return {**(llm_kwargs or {}), "json_schema": output_cls.model_json_schema()}

    def structured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None,
                           **prompt_args: Any) -> Any:  # fmt: skip
        """LlamaIndex's structured prediction, decoded under ``output_cls``'s JSON schema (one charged answer)."""
        return super().structured_predict(output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs),
                                          **prompt_args)  # fmt: skip

    async def astructured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None,
                                  **prompt_args: Any) -> Any:  # fmt: skip
        """:meth:`structured_predict`, the answer stepped in worker threads."""
        return await super().astructured_predict(output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs),
                                                 **prompt_args)  # fmt: skip

    def stream_structured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None,
                                  **prompt_args: Any) -> Any:  # fmt: skip
        """:meth:`structured_predict`, streamed as LlamaIndex streams partial objects."""
        return super().stream_structured_predict(output_cls, prompt, self._schema_kwargs(output_cls, llm_kwargs),
                                                 **prompt_args)  # fmt: skip

    async def astream_structured_predict(
        self, output_cls: Any, prompt: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Any:
        """:meth:`stream_structured_predict` for async callers."""
        kwargs = self._schema_kwargs(output_cls, llm_kwargs)
        return await super().astream_structured_predict(output_cls, prompt, kwargs, **prompt_args)

    # -- completions --------------------------------------------------------------------------------
    def _complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        text, info = self._whole(self._prompt(prompt, formatted), kwargs)
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
        text, info = await self._awhole(self._prompt(prompt, formatted), kwargs)
        return CompletionResponse(text=text, additional_kwargs=info)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        pieces = await asyncio.to_thread(self._open, self._prompt(prompt, formatted), kwargs)
        return iterate_in_threads(lambda: self._completions(pieces), on_cancel=pieces.cancel)

    # -- chats --------------------------------------------------------------------------------------
    def _chat_whole(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponse:
        text, info = self._whole(self._chat(messages), kwargs)
        return ChatResponse(message=ChatMessage(role="assistant", content=text), additional_kwargs=info)

    def _chats(self, pieces: AnswerStream) -> ChatResponseGen:
        spend: dict[str, Any] = {}
        for delta, text in self._texts(pieces, spend):
            yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=delta,
                               additional_kwargs=spend)  # fmt: skip

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat_whole(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chats(self._open(self._chat(messages), kwargs))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text, info = await self._awhole(self._chat(messages), kwargs)
        return ChatResponse(message=ChatMessage(role="assistant", content=text), additional_kwargs=info)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        pieces = await asyncio.to_thread(self._open, self._chat(messages), kwargs)
        return iterate_in_threads(lambda: self._chats(pieces), on_cancel=pieces.cancel)
