"""One entry point from a model name or a server URL to a backend (used by the CLI and both adapters)."""

from __future__ import annotations

import os
from typing import Any

from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.backends.server import ServerBackend
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["is_server_url", "load_backend"]


def is_server_url(model: str | os.PathLike[str]) -> bool:
    """True for ``http://...`` or ``https://...`` (an inference server), False for a model path or name.

    Args:
        model: a model path, name or URL.
    """
    return isinstance(model, str) and model.strip().lower().startswith(("http://", "https://"))


def load_backend(
    model: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    device: str | None = None,
    dtype: str | None = None,
    micro_batch_size: int | None = None,
    tokens_per_forward: int | None = None,
    **server_settings: Any,
) -> NextTokenBackend:
    """:class:`~dp_icl_plugin.backends.server.ServerBackend` for a server URL (``tokenizer``: the served model's,
    a folder, ``.gguf`` file, named model or tokenizer object; ``server_settings`` such as ``top_k``,
    ``allow_insecure_http``), else :class:`~dp_icl_plugin.backends.hf.HFBackend` over a local model (a folder,
    a hub id already cached, a ``.gguf`` file or a named model such as ``"smollm2-135m-instruct"``;
    ``micro_batch_size``: its rows per forward, default the backend's; 1 for a model whose forward couples
    rows).

    Args:
        model: a server URL, or a local model (folder, cached hub id, ``.gguf`` file or named model).
        tokenizer: the served model's tokenizer (server URLs only; required there).
        device: the local model's device (default ``"auto"``).
        dtype: the local model's dtype (default ``"auto"``).
        micro_batch_size: the local model's rows per forward.
        tokens_per_forward: the local model's new tokens a forward aims at (default the backend's).
        **server_settings: further :class:`~dp_icl_plugin.backends.server.ServerBackend` settings (server URLs only).

    Raises:
        ConfigurationError: a server URL without ``tokenizer`` or with a local model's ``device`` or ``dtype``,
            server settings for a local model, or what the backend refuses.
        ModelFileError: the local model cannot be read.
        BackendError: the model could not be loaded.
        ServerError: the server failed or does not match.
    """
    if is_server_url(model):
        local = [name for name, value in (("device", device), ("dtype", dtype)) if value is not None]
        if local:  # the server chose them: refused, never silently ignored
            raise ConfigurationError(f"{', '.join(local)} apply to a local model only, not to a server URL")
        if tokenizer is None:
            raise ConfigurationError(
                "a server URL needs tokenizer= (the served model's folder, .gguf file or name): "
                "prompts are tokenised here and sent as token ids"
            )

        return ServerBackend.from_url(str(model).strip(), tokenizer, **server_settings)
    if tokenizer is not None or server_settings:
        extra = sorted(["tokenizer"] * (tokenizer is not None) + list(server_settings))
        raise ConfigurationError(f"{extra} apply to a server URL only, not to a local model")

    rows: dict[str, Any] = {} if micro_batch_size is None else {"micro_batch_size": micro_batch_size}
    if tokens_per_forward is not None:
        rows["tokens_per_forward"] = tokens_per_forward
    # a model that couples rows (quantised, mixture-of-experts, ...) runs one row per forward
    return HFBackend.from_pretrained(model, device=device, dtype=dtype, one_row_if_coupled=True, **rows)
