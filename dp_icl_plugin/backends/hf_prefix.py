"""Prompts that share one suffix after different prefixes, with the prefixes' KV caches kept between calls.

DPS-MOZO's one-shot prompts are ``record part + query + answer so far``: the record parts recur across tokens
and answers, and the suffix is the same for every prompt of a step. :class:`PrefixKVCache` keeps each prefix's
keys and values (least recently used out first, bounded by a number of cached tokens), and
:func:`shared_suffix_logprobs` computes a step in one batched forward of the suffix only: the prefixes' caches
are left-padded to one length and the padding is masked, with each row's positions continuing its own prefix.
The distributions equal a full forward of ``prefix + suffix`` up to float rounding (tested).
:func:`shared_prefix_forward` is the other way round: one public prefix (a template's instruction) cached once
and expanded to every row, then one forward of each row's rest (rows without the prefix go whole, the prefix
masked out for them).

Privacy: the cache holds keys and values computed from private records, in this process's memory only (never
logged, written or pickled). A cache hit makes a step faster, so a call's time depends on which records
earlier calls used, whoever made them: decoders with ``fixed_latency`` release every answer at a fixed time,
which hides it from whoever receives the answers, but anyone else timing calls to the same backend (another
decoder, a synthesizer, a direct caller) can still see hits and misses. Give such callers their own backend,
or ``prefix_cache_tokens=0``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.shared_suffix import prefix_members
from dp_icl_plugin.errors import BackendError

if TYPE_CHECKING:
    from dp_icl_plugin.backends.hf import HFBackend

__all__ = [
    "PrefixKVCache",
    "shared_prefix_forward",
    "shared_suffix_forward",
    "shared_suffix_logprobs",
    "supports_prefix_cache",
]


def supports_prefix_cache(config: Any) -> bool:
    """Whether cached prefix keys and values can be reused: not with sliding-window attention (its cache keeps
    only the window, so a prefix's positions would not line up)."""
    if getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None):
        return False
    kinds = getattr(config, "layer_types", None) or ()
    return not any("sliding" in str(kind) or "chunked" in str(kind) for kind in kinds)


class PrefixKVCache:
    """Per-prefix key/value tensors of one model, least recently used evicted past ``max_tokens`` tokens.

    The keys are private token ids and the tensors are computed from them: a pickled or deep-copied cache
    carries neither (it arrives empty).
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = check.int_at_least("max_tokens", max_tokens, 0)
        self._entries: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()
        self._tokens = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens}  # never the private entries

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_tokens"])  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    @property
    def cached_bytes(self) -> int:
        return sum(int(k.nbytes) + int(v.nbytes) for layers in self._entries.values() for k, v in layers)

    def get(self, prefix: tuple[int, ...]) -> list[tuple[Any, Any]] | None:
        layers = self._entries.get(prefix)
        if layers is not None:
            self._entries.move_to_end(prefix)
        return layers

    def put(self, prefix: tuple[int, ...], layers: list[tuple[Any, Any]]) -> None:
        if prefix in self._entries or len(prefix) > self.max_tokens:
            return
        self._entries[prefix] = layers
        self._tokens += len(prefix)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0


def _layers_of(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer, each [1, kv_heads, length, head_dim], from a transformers cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def _cache_from(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(ddp_cache_data=layers)
    except TypeError:  # older transformers
        return DynamicCache.from_legacy_cache(tuple(layers))  # type: ignore[attr-defined]


def _prefix_layers(backend: HFBackend, prefixes: list[tuple[int, ...]]) -> list[list[tuple[Any, Any]]]:
    """Each prefix's (keys, values) per layer: cached ones reused, the missing ones in one left-padded forward."""
    from transformers import DynamicCache

    found = {p: backend.prefix_cache.get(p) for p in prefixes}
    missing = list(dict.fromkeys(p for p, layers in found.items() if layers is None))
    if missing:
        input_ids, mask = backend._left_padded([list(p) for p in missing])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        _, cache = backend._forward(input_ids, mask, positions, DynamicCache(config=backend.model.config))
        width = input_ids.shape[1]
        layers = _layers_of(cache)
        for row, prefix in enumerate(missing):  # a row's own positions: the padding's keys are dropped
            start = width - len(prefix)
            if any(k.shape[-2] != width for k, _ in layers):  # a cache that does not keep every position
                raise BackendError(f"{backend.model_id}: the KV cache does not keep every position; "
                                   "construct the backend with prefix_cache_tokens=0")  # fmt: skip
            own = [(k[row : row + 1, :, start:].clone(), v[row : row + 1, :, start:].clone()) for k, v in layers]
            found[prefix] = own
            backend.prefix_cache.put(prefix, own)
    return [found[p] for p in prefixes]  # type: ignore[misc]


def shared_suffix_forward(
    backend: HFBackend, prefixes: Sequence[Sequence[int]], suffix: Sequence[int]
) -> tuple[np.ndarray, Any, Any]:
    """One forward of the suffix after every prefix's cached keys and values.

    Returns (next-token log-probabilities per row, the KV cache of every ``prefix + suffix`` row, left-padded to
    one width, and its attention mask): what an incremental session continues from. Prefixes and suffix must
    be non-empty; the caller holds ``backend._forwarding()``.
    """
    import torch

    keys = [tuple(int(t) for t in p) for p in prefixes]
    tail = [int(t) for t in suffix]
    per_prefix = _prefix_layers(backend, keys)
    width = max(len(k) for k in keys)
    layers = []
    for layer in range(len(per_prefix[0])):
        padded_k, padded_v = [], []
        for k_len, entry in zip((len(k) for k in keys), per_prefix, strict=True):
            k, v = entry[layer]
            pad = width - k_len
            padded_k.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            padded_v.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        layers.append((torch.cat(padded_k), torch.cat(padded_v)))  # new tensors: the cached entries stay as they are
    rows = len(keys)
    mask = torch.zeros((rows, width + len(tail)), dtype=torch.long, device=backend.device)
    for i, k in enumerate(keys):
        mask[i, width - len(k) :] = 1
    lengths = torch.tensor([len(k) for k in keys], device=backend.device).unsqueeze(1)
    positions = lengths + torch.arange(len(tail), device=backend.device).unsqueeze(0)
    input_ids = torch.tensor([tail] * rows, dtype=torch.long, device=backend.device)
    logprobs, cache = backend._forward(input_ids, mask, positions, _cache_from(layers))
    return logprobs, cache, mask


def shared_prefix_forward(backend: HFBackend, prefix: Sequence[int], rows: Sequence[Sequence[int]]) -> tuple[Any, ...]:
    """One forward of ``rows`` after ``prefix``'s keys and values (from the cache, computed once, expanded to
    every row). A row that starts with the prefix and goes on past it sends only its rest, left-padded after
    the prefix, its positions continuing it; any other row is sent whole, the prefix masked out for it and its
    positions from 0. Padding is masked, so each row's distribution is its own prompt's (float rounding aside).

    Returns (next-token log-probabilities, the rows' KV cache, its attention mask): what an incremental session
    continues from. ``prefix`` must be non-empty (no row needs to start with it); the caller holds
    ``backend._forwarding()``. A row sent whole has keys beyond its own length (the masked prefix): the model
    must take positions from ``position_ids`` and masks from the attention mask, as transformers 5 does (the
    extra's floor; tests/test_backend_hf.py checks a row longer than the model's positions with the prefix).
    """
    import torch

    key = tuple(int(t) for t in prefix)
    start = len(key)
    ids = [[int(t) for t in r] for r in rows]
    members = set(prefix_members(ids, key))
    tails = [r[start:] if i in members else r for i, r in enumerate(ids)]
    n, width = len(tails), max(len(t) for t in tails)
    (layers,) = _prefix_layers(backend, [key])
    cache = _cache_from([(k.expand(n, -1, -1, -1).contiguous(), v.expand(n, -1, -1, -1).contiguous())
                         for k, v in layers])  # fmt: skip
    input_ids = torch.full((n, width), backend.pad_token_id, dtype=torch.long)
    mask = torch.ones((n, start + width), dtype=torch.long)
    positions = torch.zeros((n, width), dtype=torch.long)
    for i, tail in enumerate(tails):
        pad, first = width - len(tail), start if i in members else 0
        input_ids[i, pad:] = torch.tensor(tail, dtype=torch.long)
        mask[i, start : start + pad] = 0
        if i not in members:
            mask[i, :start] = 0
        positions[i, pad:] = torch.arange(first, first + len(tail))
    device = backend.device
    mask = mask.to(device)
    logprobs, cache = backend._forward(input_ids.to(device), mask, positions.to(device), cache)
    return logprobs, cache, mask


def shared_suffix_logprobs(backend: HFBackend, prefixes: Sequence[Sequence[int]], suffix: Sequence[int]) -> np.ndarray:
    """Next-token log-probabilities of ``prefix + suffix`` for each prefix: one forward of the suffix rows."""
    if not suffix or not prefixes or min(len(p) for p in prefixes) == 0:
        return backend.next_token_logprobs([[*p, *suffix] for p in prefixes])
    with backend._forwarding():
        logprobs, _, _ = shared_suffix_forward(backend, prefixes, suffix)
    return logprobs
