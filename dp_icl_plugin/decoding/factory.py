"""``build_decoder``: a DP decoder by name over a local model or an inference server, each backend sized to its
decoder's step (:func:`step_rows`).

The decoders themselves are in :mod:`~dp_icl_plugin.decoding.decoders` (DPS-MOZO, clip-blend) and
:mod:`~dp_icl_plugin.decoding.knn_experts` (kNN experts), :mod:`~dp_icl_plugin.decoding.knn_keywords` (kNN keyword
hints); this module sits above both, so neither imports it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.backends.loading import is_server_url, load_backend
from dp_icl_plugin.data.records import PrivateDataset
from dp_icl_plugin.decoding.contract import TEMPERATURE_REFUSED
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder, _Decoder
from dp_icl_plugin.decoding.knn_experts import build_expert_decoder
from dp_icl_plugin.decoding.knn_keywords import build_keyword_decoder
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["DECODING_METHODS", "build_decoder", "step_rows", "step_tokens"]


DECODING_METHODS = ("mozo", "clip-blend", "knn-experts", "knn-keywords")


def step_rows(method: str, settings: dict[str, Any]) -> int:
    """Rows per forward that fit one step of a decoder's records, from its public settings only: DPS-MOZO's
    ``n_shots`` records; clip-blend's subset of expected size s (each record joins with probability s/N, so its
    size is private: room for s + 2√s, which holds the draw 97.7 % of the time, the rest taking a second
    forward). The public row (zero-shot or public prompt) goes in a forward of its own
    (:mod:`~dp_icl_plugin.backends.public_rows`). Never the realised number of rows, which would make a row's
    shape depend on the others.

    Args:
        method: ``"mozo"``, ``"clip-blend"``, ``"knn-experts"`` or ``"knn-keywords"``.
        settings: the decoder's settings.
    """
    if method == "knn-keywords":  # the records vote without a forward; the answer is the public row alone
        return 1
    if method == "mozo":
        return int(settings.get("n_shots", 4))
    if method == "knn-experts":  # at most k experts, padded to k (how many there are is private)
        return int(settings.get("k", 40))
    subset = int(settings.get("subset_size", 1))
    return subset + math.ceil(2 * math.sqrt(subset))


def step_tokens(method: str, rows: int) -> int | None:
    """New tokens a forward of a step's rows may hold, from public settings (None: the backend's default).
    Expert decoding starts every answer with one forward of its k experts' query part on their cached records:
    room for a query part of up to 63 tokens in each of the k rows keeps that one forward (at the default 256,
    k = 40 rows of a 16-token query part took three forwards of 16 rows, 8 of them fillers)."""
    return rows * 64 if method == "knn-experts" else None


def _decoder_type(method: str) -> Callable[..., _Decoder]:
    if method == "knn-experts":
        return build_expert_decoder
    if method == "knn-keywords":
        return build_keyword_decoder
    return MozoDecoder if method == "mozo" else ClipBlendDecoder


def _check_settings(method: str, settings: dict[str, Any]) -> None:
    """Refuse a setting ``method``'s decoder does not take, naming those it does (a typed error, not a
    ``TypeError`` from deep inside, and before any model is loaded)."""
    parameters = {
        name: p
        for name, p in inspect.signature(_decoder_type(method)).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name not in ("backend", "budget")
    }
    taken = list(parameters)
    unknown = sorted(set(settings) - set(taken))
    if not unknown:
        missing = [name for name, p in parameters.items() if p.default is p.empty and name not in settings]
        if missing:
            raise ConfigurationError(f"{method} decoding needs {', '.join(missing)}")
        return
    if "temperature" in unknown:
        raise ConfigurationError(
            f"{TEMPERATURE_REFUSED} ({method}; clip-blend alone takes temperature, its own calibrated tau)"
        )
    raise ConfigurationError(
        f"{method} decoding takes no setting {', '.join(unknown)}; it takes {', '.join(sorted(taken))}"
    )


def build_decoder(
    model_id: str,
    dataset: PrivateDataset,
    *,
    budget: BudgetManager,
    method: str = "mozo",
    device: str | None = None,
    dtype: str | None = None,
    tokenizer: Any = None,
    server: dict[str, Any] | None = None,
    **settings: Any,
) -> _Decoder:
    """A DP decoder (``method``: ``"mozo"``, ``"clip-blend"``, ``"knn-experts"`` or ``"knn-keywords"``, the last
    two through :func:`~dp_icl_plugin.decoding.knn_experts.build_expert_decoder` and
    :func:`~dp_icl_plugin.decoding.knn_keywords.build_keyword_decoder`; ``settings`` go to them) over a local
    model or an inference server: ``model_id`` as :func:`~dp_icl_plugin.backends.loading.load_backend` takes it (a URL
    needs ``tokenizer``; ``server`` holds ServerBackend settings such as ``top_k``). A local model's backend
    computes as many rows per forward as a step of this decoder does (:func:`step_rows`).

    Args:
        model_id: a local model or a server URL.
        dataset: the private records.
        budget: the shared ledger.
        method: ``"mozo"``, ``"clip-blend"``, ``"knn-experts"`` or ``"knn-keywords"``.
        device: the local model's device.
        dtype: the local model's dtype.
        tokenizer: the served model's tokenizer (server URLs only).
        server: :class:`~dp_icl_plugin.backends.server.ServerBackend` settings (server URLs only).
        **settings: the decoder's settings (``n_queries``, ``epsilon``, ...).

    Returns:
        A :class:`~dp_icl_plugin.decoding.decoders.MozoDecoder`,
        :class:`~dp_icl_plugin.decoding.decoders.ClipBlendDecoder`,
        :class:`~dp_icl_plugin.decoding.knn_experts.KNNExpertDecoder` or
        :class:`~dp_icl_plugin.decoding.knn_keywords.KNNKeywordDecoder`.

    Raises:
        ConfigurationError: an unknown method, a setting the decoder does not take or lacks (checked before the
            model loads), or what the backend or decoder refuses.
        BudgetExhaustedError: a kNN-experts decoder's filter charge does not fit the ledger.
        BackendError: the model could not be loaded.
    """
    if method not in DECODING_METHODS:
        raise ConfigurationError(f"method must be one of {', '.join(DECODING_METHODS)}, got {method!r}")
    _check_settings(method, settings)  # before the model loads
    rows = None if is_server_url(model_id) else step_rows(method, settings)
    backend = load_backend(
        model_id,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        micro_batch_size=rows,
        tokens_per_forward=None if rows is None else step_tokens(method, rows),
        **(server or {}),
    )
    if method in ("knn-experts", "knn-keywords"):
        return _decoder_type(method)(backend, dataset, budget=budget, **settings)
    return _decoder_type(method)(dataset, backend=backend, budget=budget, **settings)
