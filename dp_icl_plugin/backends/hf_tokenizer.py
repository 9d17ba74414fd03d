"""The tokenizer half of a backend over a Hugging Face tokenizer: vocabulary, encoding, decoding, chat template.

Shared by :class:`~dp_icl_plugin.backends.hf.HFBackend` (model in this process) and
:class:`~dp_icl_plugin.backends.server.ServerBackend` (model behind an inference server): both tokenise
locally, so that prompts go to the model as token ids. Needs ``transformers``' tokenizer only, not torch.
Messages never contain prompt text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dp_icl_plugin.backends.base import ChatMessage, Prompt, prompt_ids
from dp_icl_plugin.errors import BackendError, ConfigurationError

__all__ = ["TokenizerBackendBase"]


class TokenizerBackendBase:
    """Vocabulary and text handling of a backend; subclasses set ``tokenizer``, ``_model_id``, ``_vocab_size``
    and ``max_length``."""

    tokenizer: Any
    max_length: int | None
    _model_id: str
    _vocab_size: int

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None

    @property
    def has_chat_template(self) -> bool:
        return getattr(self.tokenizer, "chat_template", None) is not None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (:meth:`~dp_icl_plugin.backends.base.NextTokenBackend.encode`).

        Args:
            text: the text.
            add_special_tokens: add the special tokens a prompt starts with.

        Raises:
            ConfigurationError: ``text`` is not a string, or the tokenizer rejected it.
        """
        if not isinstance(text, str):
            raise ConfigurationError(f"text must be a str, got {type(text).__name__}")
        return self._tokenize(text, add_special_tokens=bool(add_special_tokens))

    def decode(self, token_ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``token_ids``.

        Args:
            token_ids: the ids to decode.
        """
        return str(self.tokenizer.decode([int(t) for t in token_ids]))

    def apply_chat_template(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat, formatted by the tokenizer's template.

        Args:
            messages: the chat, ``{"role", "content"}`` mappings.
            add_generation_prompt: end with the template's opening of the assistant's turn.

        Raises:
            ConfigurationError: no chat template, or malformed messages.
            BackendError: the template failed.
        """
        if not self.has_chat_template:
            raise ConfigurationError(f"the tokenizer of {self.model_id} has no chat template")
        if not messages or not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in messages):
            raise ConfigurationError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
        try:
            out = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=True
            )
        except Exception as exc:  # template errors are jinja's own types
            raise BackendError(f"the chat template of {self.model_id} failed: {type(exc).__name__}") from exc
        ids = out["input_ids"] if isinstance(out, Mapping) else out
        return [int(t) for t in ids]

    def _tokenize(self, text: str, *, add_special_tokens: bool) -> list[int]:
        try:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        except Exception as exc:  # tokenizers raises plain Exception for unknown words
            kind = type(exc).__name__
            raise ConfigurationError(f"the tokenizer of {self.model_id} rejected a prompt ({kind})") from None

    def _prompt_ids(self, prompts: Sequence[Prompt] | np.ndarray) -> list[list[int]]:
        return prompt_ids(
            prompts,
            encode_prompt=lambda text: self._tokenize(text, add_special_tokens=True),
            vocab_size=self.vocab_size,
            max_length=self.max_length,
        )
