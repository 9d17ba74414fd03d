"""Forwards of a ``transformers`` causal LM in which every row is computed in isolation.

:class:`IsolatedForward` runs :class:`RowTask` s (tokens to compute, optionally after one row's cached keys
and values) in forwards whose shape is fixed by :class:`~dp_icl_plugin.backends.row_shapes.RowShapes` from
public settings and the row's own lengths: rows of one key in micro-batches of exactly ``shapes.rows_for``
rows
(filler rows complete them), new tokens left-padded to their bucket, cached positions left-padded to
theirs. So a row's log-probabilities, and the keys and values it leaves, are the same bits whatever else is
in the call and whatever the prefix cache held before (a cached prefix's keys and values were computed by
the same isolated forward as a missing one's). ``tests/test_row_isolation.py`` checks it per backend.

Sessions (:class:`RowState`) keep each micro-batch's cache and grow every row by one token per step in a
forward of ``(shapes.rows, 1)`` tokens. After the first forward, rows are regrouped by the bucket of their
own cached length (the coarse past width), so that rows of many lengths step together.

Needs torch and transformers (imported by :mod:`~dp_icl_plugin.backends.hf`, which builds this).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp_icl_plugin.backends.row_shapes import RowShapes, micro_batches

__all__ = ["IsolatedForward", "RowKV", "RowState", "RowTask", "cache_from_layers", "cache_layers", "rows_coupled_by"]

RowKV = list[tuple[Any, Any]]
"""One row's keys and values per layer, each ``[1, kv_heads, length, head_dim]``: its own positions only."""


_BATCH_WIDE_ROPE = ("dynamic", "longrope")
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _rope_types(config: Any) -> set[str]:
    found: set[str] = set()
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if isinstance(params, dict):  # one dict, or one per layer type
            nested = [v for v in params.values() if isinstance(v, dict)]
            for p in [params, *nested]:
                kind = p.get("rope_type", p.get("type"))
                if isinstance(kind, str):
                    found.add(kind)
    return found


_QUANTISED_MODULES = (
    "torch.ao.nn.quantized",
    "torch.nn.quantized",
    "bitsandbytes",
    "auto_gptq",
    "gptqmodel",
    "awq",
    "optimum.quanto",
    "torchao",
    "hqq",
    "eetq",
    "fp_quant",
    "compressed_tensors",
)


def _quantised(model: Any) -> str | None:
    """What marks ``model`` as quantised: a quantisation config, a module from a quantisation library, or a
    weight stored as integers or 8-bit floats (None when nothing does)."""
    config = getattr(model, "config", model)
    if getattr(config, "quantization_config", None):
        return "its quantization_config"
    if getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None:
        return "transformers marks it quantised"
    modules = model.modules() if hasattr(model, "modules") else ()
    for module in modules:
        origin = type(module).__module__
        if origin.startswith(_QUANTISED_MODULES):
            return f"its {type(module).__name__} layers ({origin.split('.')[0]})"
    parameters = model.parameters() if hasattr(model, "parameters") else ()
    for parameter in parameters:
        if not parameter.dtype.is_floating_point or parameter.dtype.itemsize == 1:
            return f"its {parameter.dtype} weights"
        for kind in (type(parameter), type(getattr(parameter, "data", parameter))):  # tensor subclasses (torchao)
            if kind.__module__.startswith(_QUANTISED_MODULES):
                return f"its {kind.__name__} weights ({kind.__module__.split('.')[0]})"
    return None


def rows_coupled_by(model: Any) -> str | None:
    """Why a model's forward couples the rows of a batch whatever their shape (None when it does not).

    Fixed shapes isolate rows only if no layer reads across rows. These do: rotary scaling chosen from the
    longest position in the whole forward (``dynamic`` NTK and ``longrope``, as transformers applies them: one
    row passing the original context switches every row's frequencies); mixture-of-experts routing (each
    expert's matrix product is as large as the tokens of all rows routed to it); and quantised layers, whose
    activation scales or outlier columns may be chosen from the whole batch (``torch.ao`` dynamic
    quantisation: a row moved 0.016 nats with its batch-mate, ``tests/test_row_isolation.py``; bitsandbytes
    LLM.int8's outlier columns, FP8 with per-tensor dynamic scales). Quantisation schemes are too many to tell
    apart, so any quantised model counts (a GGUF file is dequantised on load and does not). Such a model runs
    one row per forward (``micro_batch_size=1``). The list is what is known, not a proof: ``dp-icl isolation``
    checks a deployment's model, and public rows never share a call with private ones anyway
    (:mod:`~dp_icl_plugin.backends.public_rows`).

    Args:
        model: a loaded causal LM (its ``config`` and modules are read), or a bare config.

    Returns:
        A clause naming the cause, or None.
    """
    config = getattr(model, "config", model)
    scaled = _rope_types(config) & set(_BATCH_WIDE_ROPE)
    if scaled:
        return f"its rotary scaling ({', '.join(sorted(scaled))}) is chosen from the longest row of each forward"
    experts = [n for n in _EXPERT_COUNTS if isinstance(getattr(config, n, None), int) and getattr(config, n) > 1]
    if experts:
        return "it routes tokens to experts, whose matrix products are sized by every row's tokens"
    quantised = _quantised(model)
    if quantised:
        return f"it is quantised ({quantised}): activation scales or outliers may be chosen from the whole batch"
    return None


@dataclass
class RowTask:
    """One row of a forward: ``new`` tokens, after ``past`` (one row's cached keys and values) if given.

    ``exact``: the new tokens are the call's public suffix (the same for every row), computed at their exact
    width; only with a past, whose padding keeps a masked column in the row.

    Attributes:
        new: the tokens to compute.
        past: the row's cached keys and values, or None.
        past_length: the positions ``past`` holds.
        exact: compute ``new`` at its exact width (see above).
    """

    new: list[int]
    past: RowKV | None = None
    past_length: int = 0
    exact: bool = False

    def key(self, shapes: RowShapes) -> tuple[int, int]:
        """(past width, new width): the row's forward shape (its rows follow from the new width); from its own
        lengths.

        Args:
            shapes: the public shape policy.
        """
        if self.past is None:
            return 0, shapes.new_width(len(self.new))
        new_width = len(self.new) if self.exact else shapes.new_width(len(self.new))
        return shapes.past_width(self.past_length), new_width


@dataclass
class RowState:
    """One micro-batch of a session: its cache, mask and each row's next position (fillers after members).

    Attributes:
        members: the task indices of its rows, in row order (fillers after them).
        cache: the micro-batch's transformers cache.
        mask: its attention mask, ``[rows, width]``.
        lengths: each row's next position.
    """

    members: list[int]
    cache: Any
    mask: Any
    lengths: np.ndarray = field(repr=False)


class IsolatedForward:
    """Row-isolated forwards of one model (see the module docstring).

    Args:
        model: the causal LM, on ``device``, in eval mode.
        device: its torch device.
        pad_token_id: the token filler rows and padding hold (always masked).
        vocab_size: the width of a returned row.
        shapes: the public shape policy.
    """

    def __init__(self, model: Any, *, device: Any, pad_token_id: int, vocab_size: int, shapes: RowShapes) -> None:
        self.model = model
        self.device = device
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.shapes = shapes
        parameters = inspect.signature(model.forward).parameters
        # transformers 5.24 renamed past_key_values to cache (the old name still works, with a FutureWarning)
        self._cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        # only the last position's logits are read: models that can skip the others' output layer do
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    # -- one forward --------------------------------------------------------------------------------
    def forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any) -> tuple[np.ndarray, Any]:
        """Log-probabilities after each row's last position (float32, all ``rows`` rows) and the new cache.

        Args:
            input_ids: token ids, ``[rows, width]``.
            mask: the attention mask over cached and new positions.
            positions: each new token's position.
            cache: a transformers cache, or None (no cache kept).
        """
        import torch

        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=cache is not None,
            **{self._cache_keyword: cache},
            **self._last_only,
        )
        last = out.logits[:, -1, : self.vocab_size].float()
        return torch.log_softmax(last, dim=-1).cpu().numpy(), getattr(out, self._cache_keyword)

    def run(
        self, tasks: Sequence[RowTask], *, keep: bool, rows: int | None = None
    ) -> tuple[np.ndarray, list[RowState]]:
        """Each task's next-token log-probabilities ``[len(tasks), vocab]`` and, with ``keep``, the micro-batches
        with their caches (to continue a session or to read a row's keys and values).

        ``rows``: the call's number of rows, when all are public (that number is then public too): forwards
        have min(``rows``, ``shapes.rows_for``) rows instead of ``shapes.rows_for`` (no filler rows beyond the
        call's).

        Args:
            tasks: the rows to compute.
            keep: keep the micro-batches' caches.
            rows: the call's number of rows when all are public, else None.
        """
        result = np.empty((len(tasks), self.vocab_size), dtype=np.float32)
        states: list[RowState] = []
        keys = [t.key(self.shapes) for t in tasks]

        def rows_of(key: tuple[int, int]) -> int:
            return self.shapes.rows_for(key[1]) if rows is None else min(rows, self.shapes.rows_for(key[1]))

        for (past_width, new_width), members in micro_batches(keys, rows_of):
            logprobs, state = self._micro_batch(
                [tasks[i] for i in members], members, past_width, new_width, keep, rows_of((past_width, new_width))
            )
            result[members] = logprobs[: len(members)]  # as computed: callers judge a bad row (module docstring)
            if keep:
                states.append(state)
        return result, states

    def _micro_batch(
        self, tasks: list[RowTask], members: list[int], past_width: int, new_width: int, keep: bool, rows: int
    ) -> tuple[np.ndarray, RowState]:
        import torch

        input_ids = torch.full((rows, new_width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((rows, past_width + new_width), dtype=torch.long)
        positions = torch.zeros((rows, new_width), dtype=torch.long)
        lengths = np.ones(rows, dtype=np.int64)  # a filler row: one pad token at the last column, position 0
        mask[:, -1] = 1
        for r, task in enumerate(tasks):
            n, start = len(task.new), task.past_length
            input_ids[r, new_width - n :] = torch.tensor(task.new, dtype=torch.long)
            mask[r, past_width + new_width - n :] = 1
            mask[r, past_width - start : past_width] = 1
            positions[r, new_width - n :] = torch.arange(start, start + n)
            lengths[r] = start + n
        cache = None
        if past_width:
            cache = self._padded_cache([t.past for t in tasks], [t.past_length for t in tasks], past_width, rows)
        elif keep:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
        mask = mask.to(self.device)
        logprobs, cache = self.forward(input_ids.to(self.device), mask, positions.to(self.device), cache)
        return logprobs, RowState(members, cache if keep else None, mask, lengths)

    # -- caches -------------------------------------------------------------------------------------
    def own_kv(self, state: RowState, row: int) -> RowKV:
        """The keys and values of ``state``'s row ``row`` at its own (unmasked) positions, copied.

        Args:
            state: a micro-batch kept by :meth:`run`.
            row: the row's index in it.
        """
        columns = state.mask[row].nonzero().flatten()
        return [
            (k[row : row + 1].index_select(2, columns).clone(), v[row : row + 1].index_select(2, columns).clone())
            for k, v in cache_layers(state.cache)
        ]

    def _padded_cache(self, pasts: Sequence[RowKV | None], lengths: Sequence[int], width: int, rows: int) -> Any:
        """A cache of ``rows`` rows: each past left-padded to ``width`` (fillers: zeros, masked)."""
        template = next(p for p in pasts if p is not None)
        layers = []
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((rows, k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((rows, v0.shape[1], width, v0.shape[3]))
            for r, (past, n) in enumerate(zip(pasts, lengths, strict=True)):
                if past is not None and n:
                    keys[r, :, width - n :] = past[layer][0][0]
                    values[r, :, width - n :] = past[layer][1][0]
            layers.append((keys, values))
        return cache_from_layers(layers)

    def regroup(self, states: list[RowState], n_rows: int, rows: int | None = None) -> list[RowState]:
        """Session micro-batches of the rows of ``states``: each row's own keys and values, grouped by the
        bucket of its own length (the coarse past width), so rows of many lengths step together. ``rows``: as
        in :meth:`run` (a session whose rows are all public).

        Args:
            states: the micro-batches kept by :meth:`run`.
            n_rows: the number of tasks they hold.
            rows: the call's number of rows when all are public, else None.
        """
        import torch

        kvs: list[RowKV] = [[] for _ in range(n_rows)]
        lengths = np.zeros(n_rows, dtype=np.int64)
        for state in states:
            for r, i in enumerate(state.members):
                kvs[i], lengths[i] = self.own_kv(state, r), state.lengths[r]
        regrouped = []
        widths = [self.shapes.past_width(int(n)) for n in lengths]
        rows = self.shapes.rows_for(1) if rows is None else min(rows, self.shapes.rows_for(1))  # one token a step
        for _, members in micro_batches(widths, lambda _: rows):
            width = widths[members[0]]
            cache = self._padded_cache([kvs[i] for i in members], [int(lengths[i]) for i in members], width, rows)
            mask = torch.zeros((rows, width), dtype=torch.long)
            row_lengths = np.ones(rows, dtype=np.int64)
            mask[:, -1] = 1  # fillers: one (zero) position, as in a forward
            for r, i in enumerate(members):
                mask[r, width - int(lengths[i]) :] = 1
                row_lengths[r] = lengths[i]
            regrouped.append(RowState(members, cache, mask.to(self.device), row_lengths))
        return regrouped

    def append(self, state: RowState, tokens: np.ndarray) -> np.ndarray:
        """Grow ``state``'s rows by one token each (``tokens`` one per member); their new log-probabilities.

        Args:
            state: a session micro-batch.
            tokens: one token id per member.
        """
        import torch

        rows = state.mask.shape[0]
        ids = torch.full((rows, 1), self.pad_token_id, dtype=torch.long)
        ids[: len(state.members), 0] = torch.as_tensor(tokens, dtype=torch.long)
        one = torch.ones((rows, 1), dtype=torch.long, device=self.device)
        mask = torch.cat([state.mask, one], 1)
        positions = torch.as_tensor(state.lengths, device=self.device).unsqueeze(1)
        logprobs, state.cache = self.forward(ids.to(self.device), mask, positions, state.cache)
        state.mask = mask
        state.lengths = state.lengths + 1
        return logprobs[: len(state.members)]


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer from a transformers cache.

    Args:
        cache: a transformers cache (any version).
    """
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def cache_from_layers(layers: list[tuple[Any, Any]]) -> Any:
    """A transformers cache holding ``layers`` ((keys, values) per layer).

    Args:
        layers: (keys, values) per layer.
    """
    from transformers import DynamicCache

    try:
        return DynamicCache(ddp_cache_data=layers)
    except TypeError:  # older transformers
        return DynamicCache.from_legacy_cache(tuple(layers))  # type: ignore[attr-defined]
