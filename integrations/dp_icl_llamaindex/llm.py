"""A LlamaIndex LLM whose every answer is DP with respect to a decoder's private records.

Wraps a :class:`~dp_icl_plugin.methods.decoding.MozoDecoder` or ``ClipBlendDecoder``; each completion (and
each chat, formatted by the model's chat template) is charged to the shared ledger before its first token.
The decoder and the noise source are private attributes: ``to_dict()`` never contains them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from pydantic import PrivateAttr

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.methods.data import PrivateDataset
from dp_icl_plugin.methods.decoding import _Decoder, build_decoder

__all__ = ["DPLLM"]


class DPLLM(CustomLLM):
    """DP completions and chats over a local model or an inference server (see the module docstring)."""

    model_name: str = "dp-icl"
    max_tokens: int | None = None
    _decoder: Any = PrivateAttr()
    _rng: Any = PrivateAttr()

    def __init__(self, decoder: _Decoder, *, rng: np.random.Generator, **kwargs: Any) -> None:
        if not isinstance(decoder, _Decoder):
            raise ConfigurationError("decoder must be a MozoDecoder or ClipBlendDecoder")
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationError("rng must be a numpy.random.Generator")
        super().__init__(**kwargs)
        if self.max_tokens is not None:
            check.positive_int("max_tokens", self.max_tokens)
        self._decoder = decoder
        self._rng = rng

    @classmethod
    def from_model_id(
        cls, model_id: str, dataset: PrivateDataset, *, budget: BudgetManager, rng: np.random.Generator,
        method: str = "mozo", **settings: Any,
    ) -> DPLLM:  # fmt: skip
        """The LLM over a local model or an inference server's URL (with ``tokenizer=``); ``settings`` go to
        :func:`~dp_icl_plugin.methods.decoding.build_decoder`."""
        return cls(build_decoder(model_id, dataset, budget=budget, method=method, **settings), rng=rng)

    @classmethod
    def class_name(cls) -> str:
        return "DPLLM"

    @property
    def metadata(self) -> LLMMetadata:
        capacity = getattr(self._decoder.backend, "max_length", None) or 1024
        return LLMMetadata(context_window=capacity, num_output=self._limit(), is_chat_model=False,
                           model_name=self.model_name)  # fmt: skip

    @staticmethod
    def _chat(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) \
                or not all(isinstance(m, ChatMessage) for m in messages):  # fmt: skip
            raise ConfigurationError("messages must be a list of llama_index ChatMessage")
        return [{"role": m.role.value, "content": m.content or ""} for m in messages]

    def _limit(self) -> int:
        return self._decoder.max_tokens if self.max_tokens is None else min(self.max_tokens, self._decoder.max_tokens)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        answer = self._decoder.generate(prompt, rng=self._rng, max_tokens=self._limit(), stop=kwargs.get("stop"))
        return CompletionResponse(text=answer.text, additional_kwargs={"ledger_entry": answer.ledger_entry})

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        pieces = self._decoder.stream(prompt, rng=self._rng, max_tokens=self._limit(), stop=kwargs.get("stop"))

        def gen() -> CompletionResponseGen:
            text = ""
            try:
                for piece in pieces:
                    text += piece
                    yield CompletionResponse(text=text, delta=piece)
            finally:
                pieces.close()  # type: ignore[attr-defined]

        return gen()

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        chat = self._chat(messages)
        answer = self._decoder.generate(chat, rng=self._rng, max_tokens=self._limit(), stop=kwargs.get("stop"))
        return ChatResponse(message=ChatMessage(role="assistant", content=answer.text),
                            additional_kwargs={"ledger_entry": answer.ledger_entry})  # fmt: skip

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        chat = self._chat(messages)
        pieces = self._decoder.stream(chat, rng=self._rng, max_tokens=self._limit(), stop=kwargs.get("stop"))

        def gen() -> ChatResponseGen:
            text = ""
            try:
                for piece in pieces:
                    text += piece
                    yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=piece)
            finally:
                pieces.close()  # type: ignore[attr-defined]

        return gen()

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self.complete, prompt, formatted, **kwargs)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self.chat, messages, **kwargs)
