"""A :class:`NextTokenBackend` over a local Hugging Face causal language model.

**Row isolation.** Every row is computed in forwards whose shape comes from public settings and the row's
own length (:mod:`~dp_icl_plugin.backends.row_shapes`: rows per forward from the row's own width, at most
``micro_batch_size``, filler rows completing a micro-batch; new tokens and cached positions padded to public
buckets), so a row's
log-probabilities are the same bits whatever else is in the call, in whatever order, and whatever the prefix
cache held: in float32 and in bfloat16, on CPU (``tests/test_row_isolation.py``; on CUDA, run
``dp-icl isolation --device cuda`` on the machine: kernels are chosen per device). That is what the DP
analyses assume of a one-shot row, a shard's answer or the public zero-shot row. Positions are explicit and
padding masked, so a row's distribution is its prompt's up to float rounding (≤ 1e-4 in float32, tested).

Everything runs under ``torch.inference_mode``; torch and transformers failures surface as
:class:`BackendError`. torch and transformers are imported only when a backend is built
(``pip install 'dp-icl-plugin[hf]'``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends import gguf
from dp_icl_plugin.backends.base import Prompt, appended_ids
from dp_icl_plugin.backends.hf_prefix import PrefixKVCache, supports_prefix_cache
from dp_icl_plugin.backends.hf_rows import IsolatedForward, RowKV, RowState, RowTask, rows_coupled_by
from dp_icl_plugin.backends.hf_tokenizer import TokenizerBackendBase
from dp_icl_plugin.backends.model_reference import check_model_reference
from dp_icl_plugin.backends.row_shapes import RowShapes
from dp_icl_plugin.backends.shared_rows import prefix_members, suffix_members
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
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigurationError(f"not a torch device: {device!r}") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigurationError(
            f"device {device!r}: torch sees no CUDA GPU here (torch {torch.__version__}, {build}); use device='cpu' "
            "or 'auto'"
        )
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ConfigurationError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError(f"device {device!r}: MPS is not available here; use device='cpu' or 'auto'")
    return resolved


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
        micro_batch_size: rows in every forward pass (public; filler rows complete a micro-batch, so a call's
            number of rows never reaches a forward's shape). Small on a CPU (the default, 8), larger on a GPU.
            Must be 1 for models whose forward couples rows whatever the shape (mixture-of-experts routing,
            dynamic or LongRoPE rotary scaling, quantised layers:
            :func:`~dp_icl_plugin.backends.hf_rows.rows_coupled_by`).
        tokens_per_forward: new tokens a forward aims at: a forward of new width w has
            clamp(tokens_per_forward // w, 1, micro_batch_size) rows (public: from the width, which comes from
            the row itself), so a one-token step fills a micro-batch and a long prompt takes few rows.
        width_step: new tokens are padded to the next multiple of this strictly above their count
            (:class:`~dp_icl_plugin.backends.row_shapes.RowShapes`).
        device: ``"auto"`` (CUDA when available, else CPU), a device name, or a ``torch.device``.
        prefix_cache_tokens: how many prefix tokens' keys and values the ``*_shared_suffix`` and
            ``*_shared_prefix`` methods keep between calls (least recently used out first; 45 KiB a token for
            SmolLM2-135M, as ``benchmarks/decoding_floor.py`` prints); 0 turns the cache off (every prompt is
            computed whole). The cache holds keys and values of private records in this process's memory
            (never pickled: a copied cache is empty; the backend itself cannot be pickled) and makes a call
            faster when its prefixes were used before, by any caller of this backend: see the README's side
            channels. A cached prefix's keys and values are the bits a missing one's computation gives, so the
            cache changes timing only, never a row. Models with sliding-window attention never use it.

    Forward passes are serialised by a lock, so one backend can be shared by threads.

    Raises:
        ConfigurationError: a bad setting, a float16 model, or a model that couples rows with
            ``micro_batch_size`` above 1.
        BackendError: the model cannot be moved to ``device``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str | None = None,
        micro_batch_size: int = 8,
        tokens_per_forward: int = 256,
        width_step: int = 16,
        device: str | Any | None = "auto",
        prefix_cache_tokens: int = 8192,
    ) -> None:
        self.shapes = RowShapes(
            rows=check.positive_int("micro_batch_size", micro_batch_size),
            tokens=check.positive_int("tokens_per_forward", tokens_per_forward),
            step=check.positive_int("width_step", width_step),
        )
        self.micro_batch_size = self.shapes.rows
        self.prefix_cache = PrefixKVCache(prefix_cache_tokens)
        # whether a row's keys and values can be cut out and reused (not with sliding-window attention)
        self._kv_reusable = supports_prefix_cache(model.config)
        self._prefix_cache_on = self.prefix_cache.max_tokens > 0 and self._kv_reusable
        coupled = rows_coupled_by(model)
        if coupled is not None and self.shapes.rows != 1:
            raise ConfigurationError(
                f"{type(model).__name__}: {coupled}, so a row would depend on the others in its forward whatever its "
                "shape: build the backend with micro_batch_size=1 (one row per forward)"
            )
        if getattr(model, "dtype", None) is not None and str(model.dtype) == "torch.float16":
            raise ConfigurationError(
                "float16 overflows on some prompts (inf or NaN log-probabilities), so a release would fail for some "
                "records and not for others: load the model with dtype='bfloat16' or 'float32'"
            )
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
        self._scope = threading.local()  # public_rows(): this thread's calls hold public rows only
        self._rows = IsolatedForward(
            self.model,
            device=self.device,
            pad_token_id=self.pad_token_id,
            vocab_size=self._vocab_size,
            shapes=self.shapes,
        )

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        device: str | Any | None = "auto",
        dtype: str | Any = "auto",
        micro_batch_size: int = 8,
        tokens_per_forward: int = 256,
        width_step: int = 16,
        prefix_cache_tokens: int = 8192,
        trust_remote_code: bool = False,
        one_row_if_coupled: bool = False,
        **model_kwargs: Any,
    ) -> HFBackend:
        """Load a model directory, a hub id, a ``.gguf`` file or a named model (``gguf.MODELS``, e.g.
        ``"smollm2-135m-instruct"``) with ``AutoModelForCausalLM`` and ``AutoTokenizer``.

        A GGUF file is dequantised to float32 once and cached per user (:mod:`~dp_icl_plugin.backends.gguf`);
        a missing, truncated or unsupported file raises :class:`~dp_icl_plugin.errors.ModelFileError`.

        Args:
            path_or_id: a model directory, a hub id, a ``.gguf`` file or a named model.
            device: as the constructor.
            dtype: ``"auto"`` (the checkpoint's), a torch dtype, or its name (``"float32"``, ``"bfloat16"``).
                Rows are isolated in either (fixed shapes; see the module docstring); float16 is refused (it
                overflows on some prompts, a failure that would depend on the records).
            micro_batch_size: as the constructor.
            tokens_per_forward: as the constructor.
            width_step: as the constructor.
            prefix_cache_tokens: as the constructor.
            trust_remote_code: passed to transformers (runs the checkpoint's own code: only for trusted ones).
            one_row_if_coupled: a model whose forward couples rows (see ``micro_batch_size``) gets one row per
                forward instead of being refused (for callers that chose ``micro_batch_size`` for the user, as
                :func:`~dp_icl_plugin.backends.loading.load_backend` does).
            model_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (a quantisation config makes the
                model run one row per forward: see ``micro_batch_size``).

        Raises:
            ConfigurationError: float16, a device this machine lacks, a model that couples rows (see
                ``micro_batch_size``) with more than one row per forward, or a name that is no model here
                (:func:`~dp_icl_plugin.backends.model_reference.check_model_reference`).
            ModelFileError: a missing path, a folder that holds no model, a bad GGUF file.
            BackendError: transformers could not load the model or tokenizer.
        """
        _torch()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_id = os.fspath(path_or_id)
        _resolve_device(device)  # a device this machine lacks is refused before the model loads
        check_model_reference(path_or_id)
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
        if one_row_if_coupled and rows_coupled_by(model) is not None:
            micro_batch_size = 1
        return cls(
            model,
            tokenizer,
            model_id=model_id,
            micro_batch_size=micro_batch_size,
            device=device,
            tokens_per_forward=tokens_per_forward,
            width_step=width_step,
            prefix_cache_tokens=prefix_cache_tokens,
        )

    # ------------------------------------------------------------------ forward passes

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

    @contextmanager
    def public_rows(self) -> Iterator[None]:
        """Inside, this thread's calls hold public rows only (:mod:`~dp_icl_plugin.backends.public_rows` enters
        it around a step's public rows), so their forwards have as many rows as the call brings (a public
        number; at most the shape policy's) instead of :meth:`~dp_icl_plugin.backends.row_shapes.RowShapes.rows_for`
        filler-completed micro-batches: a lone zero-shot row is one row, not ``micro_batch_size``. A
        prefix's keys and values are computed as always (the cache's bits never depend on who asked). Never
        enter it around a call with a private row: that call's size would reach the shape."""
        previous = getattr(self._scope, "public", False)
        self._scope.public = True
        try:
            yield
        finally:
            self._scope.public = previous

    def _call_rows(self, n: int) -> int | None:
        """Rows per forward for a call of ``n`` rows: ``n`` inside :meth:`public_rows`, else the shape policy's."""
        return n if getattr(self._scope, "public", False) else None

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        """Log-probabilities of the next token after each prompt (:meth:`NextTokenBackend.next_token_logprobs`).

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt (:func:`~dp_icl_plugin.backends.base.prompt_ids`).
            BackendError: the forward pass failed.
        """
        ids = self._prompt_ids(prompts)
        with self._forwarding():
            result, _ = self._rows.run([RowTask(r) for r in ids], keep=False, rows=self._call_rows(len(ids)))
        return result

    def start(self, prompts: Sequence[Prompt] | np.ndarray) -> HFIncrementalSession:
        """Encode ``prompts`` once and return a session that appends tokens on their KV caches.

        Args:
            prompts: the prompts, each text or token ids.

        Raises:
            ConfigurationError: an invalid prompt.
            BackendError: the forward pass failed.
        """
        ids = self._prompt_ids(prompts)
        with self._forwarding():
            return self._session(ids, [RowTask(r) for r in ids])

    def next_token_logprobs_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
        """Next-token log-probabilities of ``rows`` (token ids). ``suffix`` is public and fixed by the caller
        (never read from the rows): each row that ends with it (and goes on before it) takes the keys and
        values of its part before the suffix from ``prefix_cache`` (computed once) and computes only the
        suffix; any other row is computed whole. Each row decides for itself, from its own tokens.

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        ids = self._prompt_ids(rows)  # next_token_logprobs' checks, length too
        with self._forwarding():
            result, _ = self._rows.run(self._suffix_tasks(ids, suffix), keep=False, rows=self._call_rows(len(ids)))
        return result

    def start_shared_suffix(self, rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> HFIncrementalSession:
        """An incremental session over ``rows`` (token ids), started as :meth:`next_token_logprobs_shared_suffix`
        computes them, then grown as :meth:`start`'s is (same distributions up to float rounding).

        Args:
            rows: the prompts, as token ids.
            suffix: public tokens that rows may end with.
        """
        ids = self._prompt_ids(rows)  # the checks of start, length included
        with self._forwarding():
            return self._session(ids, self._suffix_tasks(ids, suffix))

    def next_token_logprobs_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Next-token log-probabilities of ``rows`` (token ids); the rows that start with the public ``prefix``
        take its keys and values (computed once, kept in ``prefix_cache``), the others are computed whole.
        The prefix goes through the cache whether or not any row starts with it: the cache's use depends on
        the (public) prefix only.

        Args:
            prefix: public tokens, fixed by the caller, that rows may start with.
            rows: the prompts, as token ids.
        """
        ids = self._prompt_ids(rows)  # next_token_logprobs' checks, length too
        with self._forwarding():
            result, _ = self._rows.run(self._prefix_tasks(prefix, ids), keep=False, rows=self._call_rows(len(ids)))
        return result

    def start_shared_prefix(self, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> HFIncrementalSession:
        """An incremental session over ``rows`` (token ids), started as :meth:`next_token_logprobs_shared_prefix`
        computes them, then grown as :meth:`start`'s is (same distributions up to float rounding).

        Args:
            prefix: public tokens, fixed by the caller, that rows may start with.
            rows: the prompts, as token ids.
        """
        ids = self._prompt_ids(rows)  # the checks of start, length included
        with self._forwarding():
            return self._session(ids, self._prefix_tasks(prefix, ids))

    def _session(self, ids: list[list[int]], tasks: list[RowTask]) -> HFIncrementalSession:
        """The first forward of ``tasks`` and the session continuing it (the caller holds the lock)."""
        rows = self._call_rows(len(tasks))
        logprobs, states = self._rows.run(tasks, keep=True, rows=rows)
        if self._kv_reusable:  # rows of many lengths step together
            states = self._rows.regroup(states, len(tasks), rows)
        return HFIncrementalSession(self, ids, logprobs, states)

    def _suffix_tasks(self, ids: list[list[int]], suffix: Sequence[int]) -> list[RowTask]:
        tail = [int(t) for t in suffix]
        members = set(suffix_members(ids, tail)) if self._prefix_cache_on else set()
        heads = {i: tuple(ids[i][: len(ids[i]) - len(tail)]) for i in members}
        pasts = dict(zip(heads, self._prefix_kv(list(heads.values())), strict=True))
        return [
            RowTask(tail, pasts[i], len(heads[i]), exact=True) if i in members else RowTask(r)
            for i, r in enumerate(ids)
        ]

    def _prefix_tasks(self, prefix: Sequence[int], ids: list[list[int]]) -> list[RowTask]:
        head = tuple(int(t) for t in prefix)
        if not self._prefix_cache_on or not head:
            return [RowTask(r) for r in ids]
        (past,) = self._prefix_kv([head])  # whether or not a row starts with it: decided on the public prefix
        members = set(prefix_members(ids, head))
        return [RowTask(r[len(head) :], past, len(head)) if i in members else RowTask(r) for i, r in enumerate(ids)]

    def _prefix_kv(self, prefixes: list[tuple[int, ...]]) -> list[RowKV]:
        """Each prefix's keys and values: from the cache, or computed (isolated, so the same bits) and kept."""
        found: dict[tuple[int, ...], RowKV | None] = {p: self.prefix_cache.get(p) for p in prefixes}
        missing = [p for p, kv in found.items() if kv is None]
        if missing:
            _, states = self._rows.run([RowTask(list(p)) for p in missing], keep=True)
            for state in states:
                for row, i in enumerate(state.members):
                    found[missing[i]] = kv = self._rows.own_kv(state, row)
                    self.prefix_cache.put(missing[i], kv)
        return [found[p] for p in prefixes]  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"HFBackend(model_id={self.model_id!r}, device={str(self.device)!r}, vocab_size={self.vocab_size})"


class HFIncrementalSession:
    """Fixed prompts growing one token a step, each micro-batch on its KV cache (rows isolated as in
    :class:`HFBackend`); see :class:`~dp_icl_plugin.backends.base.IncrementalSession`.

    Args:
        backend: the backend that computed the first step.
        ids: each prompt's token ids.
        logprobs: the first step's log-probabilities.
        states: the micro-batches, with their caches.
    """

    def __init__(self, backend: HFBackend, ids: list[list[int]], logprobs: np.ndarray, states: list[RowState]) -> None:
        self._backend = backend
        self._n = len(ids)
        self._lengths = np.array([len(x) for x in ids], dtype=np.int64)
        self._logprobs = logprobs
        self._states = states
        self._open = True

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
        """Append one token to every prompt; returns the new log-probabilities.

        Args:
            token_ids: one id for every prompt, or one id per prompt.

        Raises:
            ConfigurationError: the session is closed, bad ids, or a prompt would exceed the model's positions.
            BackendError: the forward pass failed.
        """
        if not self._open:
            raise ConfigurationError("this incremental session is closed")
        backend = self._backend
        new = appended_ids(token_ids, n_prompts=self._n, vocab_size=backend.vocab_size)
        if backend.max_length is not None and self._lengths.max() + 1 > backend.max_length:
            raise ConfigurationError(f"a prompt would exceed the model's {backend.max_length} positions")
        with backend._forwarding():
            for state in self._states:
                self._logprobs[state.members] = backend._rows.append(state, new[state.members])
        self._lengths += 1
        return self._logprobs.copy()

    def close(self) -> None:
        """Drop the caches; the session takes no more tokens."""
        self._states = []
        self._open = False

    def __enter__(self) -> HFIncrementalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HFIncrementalSession(open={self._open})"  # no n_prompts: a subset's or shards' size is private
