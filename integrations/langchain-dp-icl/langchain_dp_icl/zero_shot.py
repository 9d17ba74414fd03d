"""The same local model without private records: greedy answers for what the app has without them.

A DP answer is worth its budget only against what the app gets for free: the same model, no records,
greedy. :class:`ChatZeroShot` is that model as a LangChain chat model over a backend (for instance a DP
decoder's ``decoder.backend``, loaded once), so a chain can put the baseline beside the DP answer, or use the
model where no private record is involved (a RAG chain's generator over DP-released context). It reads no
private data and charges nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

from dp_icl_plugin import AnswerChoices, ConfigurationError, NextTokenBackend
from dp_icl_plugin.adapters import chat_ids, check_call_settings, check_query, greedy_generate
from langchain_dp_icl.chat_model import _messages

__all__ = ["ChatZeroShot"]


def _limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError("max_tokens must be a positive integer")
    return value


class ChatZeroShot(BaseChatModel):
    """Greedy answers of a local model with no private records (the zero-shot baseline; charges nothing).

    Key init args:
        backend: a :class:`~dp_icl_plugin.backends.base.NextTokenBackend` (e.g. ``chat.decoder.backend`` of a
            :class:`~langchain_dp_icl.ChatDPICL`, so the model is loaded once).
        max_tokens: the most tokens of an answer (default 32).
        choices: public answers: the greedy answer is then restricted to them, as a DP decoder's with the same
            choices is (:class:`~dp_icl_plugin.decoding.choices.AnswerChoices`).
        model: a display name for traces.

    Instantiate:
        ```python
        baseline = ChatZeroShot(backend=chat.decoder.backend, choices=types)
        baseline.invoke("Who wrote Hamlet?")
        ```
    """

    backend: Any = Field(exclude=True, repr=False)
    max_tokens: int = 32
    choices: list[str] | None = None
    model_name: str = Field(default="zero-shot", alias="model")
    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    def model_post_init(self, context: Any) -> None:
        if not isinstance(self.backend, NextTokenBackend):
            raise ConfigurationError("backend must be a dp_icl_plugin NextTokenBackend (e.g. chat.decoder.backend)")
        _limit(self.max_tokens)
        self._answers = None if self.choices is None else AnswerChoices(self.backend, self.choices)

    @property
    def _llm_type(self) -> str:
        return "dp-icl-zero-shot"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "max_tokens": self.max_tokens}

    def get_token_ids(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False))

    def _prompt(self, messages: Sequence[BaseMessage]) -> list[int]:
        """The chat's prompt ids, laid out as the DP decoders lay out theirs (no record)."""
        return chat_ids(self.backend, check_query(_messages(messages)))

    def _answer(self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> AIMessage:
        check_call_settings(kwargs, honoured=("max_tokens", "stream"))  # streamed whole by LangChain: it is public
        limit = _limit(kwargs.get("max_tokens", self.max_tokens))
        prompt = self._prompt(messages)
        if self._answers is not None:
            text = self._answers.greedy(self.backend, prompt)
            produced = len(self.backend.encode(text, add_special_tokens=False))
        else:
            ids = greedy_generate(self.backend, [prompt], max_new_tokens=limit, stop=tuple(stop or ()))[0]
            text, produced = self.backend.decode(ids), len(ids)
        usage = UsageMetadata(input_tokens=len(prompt), output_tokens=produced, total_tokens=len(prompt) + produced)
        return AIMessage(content=text, usage_metadata=usage, response_metadata={"model_name": self.model_name})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages, stop, kwargs))])
