"""The prefix KV cache of :class:`~dp_icl_plugin.backends.hf.HFBackend`: keys and values of prompt prefixes
kept between calls.

DPS-MOZO's one-shot prompts are ``record part + query + answer so far``: the record parts recur across tokens
and answers. :class:`PrefixKVCache` keeps each prefix's keys and values (least recently used out first,
bounded by a number of cached tokens); the backend computes a missing prefix in the same row-isolated forward
(:mod:`~dp_icl_plugin.backends.hf_rows`) whatever else is missing, so a hit and a miss give the same bits.

Privacy: the cache holds keys and values computed from private records, in this process's memory only (never
logged, written or pickled). A cache hit makes a step faster, so a call's time depends on which records
earlier calls used, whoever made them: decoders with ``fixed_latency`` release every answer at a fixed time,
which hides it from whoever receives the answers, but anyone else timing calls to the same backend (another
decoder, a synthesizer, a direct caller) can still see hits and misses. Give such callers their own backend,
or ``prefix_cache_tokens=0``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from dp_icl_plugin import _validation as check

__all__ = ["PrefixKVCache", "supports_prefix_cache"]


def supports_prefix_cache(config: Any) -> bool:
    """Whether cached prefix keys and values can be reused: not with sliding-window attention (its cache keeps
    only the window, so a prefix's positions would not line up).

    Args:
        config: the model's ``transformers`` config.
    """
    if getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None):
        return False
    kinds = getattr(config, "layer_types", None) or ()
    return not any("sliding" in str(kind) or "chunked" in str(kind) for kind in kinds)


class PrefixKVCache:
    """Per-prefix key/value tensors of one model, least recently used evicted past ``max_tokens`` tokens.

    The keys are private token ids and the tensors are computed from them: a pickled or deep-copied cache
    carries neither (it arrives empty).

    Args:
        max_tokens: the most prefix tokens kept (0: nothing is kept).

    Raises:
        ConfigurationError: ``max_tokens`` is not a non-negative integer.
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
        """The keys and values of ``prefix`` (marked recently used), or None.

        Args:
            prefix: the prefix's token ids.
        """
        layers = self._entries.get(prefix)
        if layers is not None:
            self._entries.move_to_end(prefix)
        return layers

    def put(self, prefix: tuple[int, ...], layers: list[tuple[Any, Any]]) -> None:
        """Keep ``layers`` for ``prefix`` (unless it is there already or longer than ``max_tokens``), evicting the least
        recently used prefixes past ``max_tokens``.

        Args:
            prefix: the prefix's token ids.
            layers: its (keys, values) per layer.
        """
        if prefix in self._entries or len(prefix) > self.max_tokens:
            return
        self._entries[prefix] = layers
        self._tokens += len(prefix)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._tokens = 0
