"""A :class:`NextTokenBackend` over a local Hugging Face causal language model.

Batches are left-padded with attention masks and explicit position ids, so a prompt's distribution does not
depend on what it is batched with (up to float rounding: ≤ 1e-4 in float32, tested). Prompts are processed
in micro-batches of similar length, so hundreds of prompts fit in memory. Everything runs under
``torch.inference_mode``; torch and transformers failures surface as :class:`BackendError`. torch and
transformers are imported only when a backend is built (``pip install 'dp-icl-plugin[hf]'``).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.base import Prompt, appended_ids, check_logprobs
from dp_icl_plugin.backends.hf_tokenizer import TokenizerBackendBase
from dp_icl_plugin.backends.shared_suffix import prefix_members
from dp_icl_plugin.errors import BackendError, ConfigurationError, DPICLError

__all__ = ["HFBackend", "HFIncrementalSession"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("HFBackend needs torch and transformers: pip install 'dp-icl-plugin[hf]'") from exc
    return torch


def _resolve_device(device: str | Any | None) -> Any:
    torch = _torch()
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigurationError(f"not a torch device: {device!r}") from exc


def _resolve_dtype(dtype: str | Any) -> Any:
    torch = _torch()
    if dtype is None or dtype == "auto":
        return "auto"
    resolved = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ConfigurationError(f"dtype must be 'auto', a floating torch dtype or its name, got {dtype!r}")
    return resolved


class HFBackend(TokenizerBackendBase):
    """Next-token log-probabilities from a ``transformers`` causal LM (``AutoModelForCausalLM``).

    Args:
        model: a loaded causal LM (moved to ``device`` and put in eval mode).
        tokenizer: its tokenizer.
        model_id: a name for provenance (default: the model's ``name_or_path``).
        micro_batch_size: prompts per forward pass.
        device: ``"auto"`` (CUDA when available, else CPU), a device name, or a ``torch.device``.
        prefix_cache_tokens: how many prefix tokens' keys and values the ``*_shared_suffix`` and
            ``*_shared_prefix`` methods keep between calls (least recently used out first; 45 KiB a token for
            SmolLM2-135M, as ``benchmarks/decoding_floor.py`` prints); 0 turns the cache off (every prompt is
            computed whole). The cache holds keys and values of private records in this process's memory
            (never pickled: a copied cache is empty; the backend itself cannot be pickled) and makes a call
            faster when its prefixes were used before, by any caller of this backend: see the README's side
            channels. Models with sliding-window attention never use it.

    Forward passes are serialised by a lock, so one backend can be shared by threads.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str | None = None,
        micro_batch_size: int = 32,
        device: str | Any | None = "auto",
        prefix_cache_tokens: int = 8192,
    ) -> None:
        from dp_icl_plugin.backends.hf_prefix import PrefixKVCache, supports_prefix_cache

        self.micro_batch_size = check.positive_int("micro_batch_size", micro_batch_size)
        self.prefix_cache = PrefixKVCache(prefix_cache_tokens)
        self._prefix_cache_on = self.prefix_cache.max_tokens > 0 and supports_prefix_cache(model.config)
        self.device = _resolve_device(device)
        try:
            self.model = model.to(self.device).eval()
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"could not move the model to {self.device}: {type(exc).__name__}") from exc
        self.tokenizer = tokenizer
        self._model_id = model_id or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        output_width = int(model.get_output_embeddings().weight.shape[0])
        # Rows of padded embedding matrices beyond the tokenizer are not tokens: never offer them.
        self._vocab_size = min(output_width, len(tokenizer))
        self.max_length: int | None = getattr(model.config, "max_position_embeddings", None)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self._lock = threading.Lock()
        self._cache_keyword = _cache_keyword(model)
        # Only the last position's logits are read: models that can skip the others' output layer do.
        self._last_logits_only = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        device: str | Any | None = "auto",
        dtype: str | Any = "auto",
        micro_batch_size: int = 32,
        prefix_cache_tokens: int = 8192,
        trust_remote_code: bool = False,
        **model_kwargs: Any,
    ) -> HFBackend:
        """Load a model directory, a hub id, a ``.gguf`` file or a named model (``gguf.MODELS``, e.g.
        ``"smollm2-135m-instruct"``) with ``AutoModelForCausalLM`` and ``AutoTokenizer``.

        A GGUF file is dequantised to float32 once and cached per user (:mod:`~dp_icl_plugin.backends.gguf`);
        a missing, truncated or unsupported file raises :class:`~dp_icl_plugin.errors.ModelFileError`.

        Args:
            dtype: ``"auto"`` (the checkpoint's), a torch dtype, or its name (``"float32"``, ``"bfloat16"``).
        """
        _torch()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from dp_icl_plugin.backends import gguf

        model_id = os.fspath(path_or_id)
        if gguf.is_gguf(path_or_id):
            path_or_id = gguf.converted_folder(path_or_id)

        resolved_dtype = _resolve_dtype(dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(
                path_or_id, dtype=resolved_dtype, trust_remote_code=trust_remote_code, **model_kwargs
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendError(f"could not load a causal LM from {os.fspath(path_or_id)!r}: {exc}") from exc
        return cls(model, tokenizer, model_id=model_id, micro_batch_size=micro_batch_size, device=device,
                   prefix_cache_tokens=prefix_cache_tokens)  # fmt: skip

    # ------------------------------------------------------------------ forward passes

    def _micro_batches(self, ids: list[list[int]]) -> Iterator[np.ndarray]:
        """Indices of prompts grouped by length (less padding), ``micro_batch_size`` at a time."""
        order = np.argsort([len(x) for x in ids], kind="stable")
        for start in range(0, len(order), self.micro_batch_size):
            yield order[start : start + self.micro_batch_size]

    def _left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        torch = _torch()
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return input_ids.to(self.device), mask.to(self.device)

    @contextmanager
    def _forwarding(self) -> Iterator[None]:
        torch = _torch()
        with self._lock, torch.inference_mode():
            try:
                yield
            except DPICLError:
                raise
            except (RuntimeError, ValueError, IndexError, TypeError) as exc:
                raise BackendError(f"forward pass of {self.model_id} failed: {type(exc).__name__}") from exc

    def _forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any = None) -> tuple[np.ndarray, Any]:
        torch = _torch()
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None,
            **{self._cache_keyword: cache}, **self._last_logits_only,
        )  # fmt: skip
        last = out.logits[:, -1, : self.vocab_size].float()
        logprobs = torch.log_softmax(last, dim=-1).cpu().numpy()
        return check_logprobs(logprobs), getattr(out, self._cache_keyword)

    def _forward_rows(self, rows: list[list[int]]) -> tuple[np.ndarray, Any, Any]:
        """One left-padded forward of whole rows: (log-probabilities, KV cache, attention mask)."""
        from transformers import DynamicCache

        input_ids, mask = self._left_padded(rows)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logprobs, cache = self._forward(input_ids, mask, positions, DynamicCache(config=self.model.config))
        return logprobs, cache, mask

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        ids = self._prompt_ids(prompts)
        result = np.empty((len(ids), self.vocab_size), dtype=np.float32)
        with self._forwarding():
            for batch in self._micro_batches(ids):
                input_ids, mask = self._left_padded([ids[i] for i in batch])
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                result[batch], _ = self._forward(input_ids, mask, positions)
        return result

    def start(self, prompts: Sequence[Prompt] | np.ndarray) -> HFIncrementalSession:
        return HFIncrementalSession(self, self._prompt_ids(prompts))

    def next_token_logprobs_shared_suffix(self, prefixes: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        """Rows of ``prefix + suffix`` (token ids), the prefixes' KV caches kept in ``prefix_cache`` between
        calls: one forward of the suffix rows (:mod:`~dp_icl_plugin.backends.hf_prefix`)."""
        from dp_icl_plugin.backends.hf_prefix import shared_suffix_logprobs

        rows = self._prompt_ids([[*p, *suffix] for p in prefixes])  # next_token_logprobs' checks, length too
        if not self._prefix_cache_on:
            return self.next_token_logprobs(rows)
        return shared_suffix_logprobs(self, prefixes, suffix)

    def next_token_logprobs_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Next-token log-probabilities of ``rows`` (token ids); the rows that start with ``prefix`` take its KV
        cache (computed once, kept in ``prefix_cache``), the others are computed whole in the same forward (same
        distributions as :meth:`next_token_logprobs` up to float rounding; see :func:`shared_prefix_forward`).
        The prefix goes through the cache whether or not any row starts with it: the cache's use depends on
        the (public) prefix only."""
        ids = self._prompt_ids(rows)  # next_token_logprobs' checks, length too
        if not self._prefix_cache_on or len(prefix) == 0:
            return self.next_token_logprobs(ids)
        with self._forwarding():
            groups = self._shared_prefix_groups(prefix, ids)
        result = np.empty((len(ids), self.vocab_size), dtype=np.float32)
        for batch, logprobs, _, _ in groups:
            result[batch] = logprobs
        return result

    def start_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> HFIncrementalSession:
        """An incremental session over ``rows`` (token ids), started as :meth:`next_token_logprobs_shared_prefix`
        computes them, then grown as :meth:`start`'s is (same distributions up to float rounding)."""
        ids = self._prompt_ids(rows)  # the checks of start, length included
        if not self._prefix_cache_on or len(prefix) == 0:
            return self.start(ids)
        with self._forwarding():
            groups = self._shared_prefix_groups(prefix, ids)
        return HFIncrementalSession(self, ids, initial=groups)

    def _shared_prefix_groups(self, prefix: Sequence[int], ids: list[list[int]]) -> list[tuple[Any, ...]]:
        from dp_icl_plugin.backends.hf_prefix import shared_prefix_forward

        head = [int(t) for t in prefix]
        members = set(prefix_members(ids, head))
        tails = [r[len(head) :] if i in members else r for i, r in enumerate(ids)]
        return [(batch, *shared_prefix_forward(self, head, [ids[i] for i in batch]))
                for batch in self._micro_batches(tails)]  # fmt: skip

    def start_shared_suffix(self, prefixes: Sequence[Sequence[int]], suffix: Sequence[int]) -> HFIncrementalSession:
        """An incremental session over the rows ``prefix + suffix``, the prefixes' KV caches taken from (and
        kept in) ``prefix_cache``: the session starts with one forward of the suffix rows, then grows as
        :meth:`start`'s does (same distributions up to float rounding)."""
        from dp_icl_plugin.backends.hf_prefix import shared_suffix_forward

        ids = self._prompt_ids([[*p, *suffix] for p in prefixes])  # the checks of start, length included
        if not self._prefix_cache_on or not suffix or min(len(p) for p in prefixes) == 0:
            return self.start(ids)
        with self._forwarding():
            logprobs, cache, mask = shared_suffix_forward(self, prefixes, suffix)
        return HFIncrementalSession(self, ids, initial=[(np.arange(len(ids)), logprobs, cache, mask)])

    def __repr__(self) -> str:
        return f"HFBackend(model_id={self.model_id!r}, device={str(self.device)!r}, vocab_size={self.vocab_size})"


def _accepts(model: Any, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def _cache_keyword(model: Any) -> str:
    """The KV-cache argument (and output field) of ``model.forward``: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before (5.24 still accepts the old name, with a ``FutureWarning``)."""
    return "cache" if _accepts(model, "cache") else "past_key_values"


class HFIncrementalSession:
    """Fixed prompts with per-micro-batch KV caches; see :class:`~dp_icl_plugin.backends.base.IncrementalSession`."""

    def __init__(
        self,
        backend: HFBackend,
        ids: list[list[int]],
        *,
        initial: Sequence[tuple[np.ndarray, np.ndarray, Any, Any]] | None = None,
    ) -> None:
        self._backend = backend
        self._n = len(ids)
        self._lengths = np.array([len(x) for x in ids], dtype=np.int64)
        self._logprobs = np.empty((self._n, backend.vocab_size), dtype=np.float32)
        self._groups: list[dict[str, Any]] = []
        if initial is None:
            with backend._forwarding():
                initial = [(batch, *backend._forward_rows([ids[i] for i in batch]))
                           for batch in backend._micro_batches(ids)]  # fmt: skip
        for rows, logprobs, cache, mask in initial:  # (rows, log-probabilities, KV cache, mask) per micro-batch
            self._logprobs[rows] = logprobs
            self._groups.append({"rows": rows, "mask": mask, "cache": cache})

    @property
    def n_prompts(self) -> int:
        return self._n

    @property
    def lengths(self) -> np.ndarray:
        return self._lengths.copy()

    @property
    def logprobs(self) -> np.ndarray:
        return self._logprobs.copy()

    def append(self, token_ids: int | Sequence[int] | np.ndarray) -> np.ndarray:
        if not self._groups:
            raise ConfigurationError("this incremental session is closed")
        backend = self._backend
        new = appended_ids(token_ids, n_prompts=self._n, vocab_size=backend.vocab_size)
        if backend.max_length is not None and self._lengths.max() + 1 > backend.max_length:
            raise ConfigurationError(f"a prompt would exceed the model's {backend.max_length} positions")
        torch = _torch()
        with backend._forwarding():
            for group in self._groups:
                rows = group["rows"]
                one = torch.ones((len(rows), 1), dtype=torch.long, device=backend.device)
                mask = torch.cat([group["mask"], one], 1)
                positions = torch.as_tensor(self._lengths[rows], device=backend.device).unsqueeze(1)
                input_ids = torch.as_tensor(new[rows], device=backend.device).unsqueeze(1)
                self._logprobs[rows], group["cache"] = backend._forward(input_ids, mask, positions, group["cache"])
                group["mask"] = mask
        self._lengths += 1
        return self._logprobs.copy()

    def close(self) -> None:
        self._groups = []

    def __enter__(self) -> HFIncrementalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HFIncrementalSession(n_prompts={self._n}, open={bool(self._groups)})"
