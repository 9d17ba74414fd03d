"""What a model reference names, checked before transformers is asked to load it.

A local model is named by a folder, a ``.gguf`` file, a named model (:data:`~dp_icl_plugin.backends.gguf.MODELS`)
or a hub id. transformers treats anything that is not an existing folder as a hub id: a missing folder gets
"Repo id must use alphanumeric chars", and a typo such as ``"smollm2-135m"`` keeps retrying a hub
this machine may not reach before it says "check your internet connection". :func:`check_model_reference`
says at once which of the four the reference is not, and what is close to it.
"""

from __future__ import annotations

import difflib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from dp_icl_plugin.backends import gguf
from dp_icl_plugin.errors import ConfigurationError, ModelFileError

__all__ = ["check_model_reference"]

HUB_PROBE_SECONDS = 3.0


def _looks_like_path(reference: str) -> bool:
    """A reference only a path can be: it starts at a root, home or the working folder, or has more than the
    one slash of ``owner/name``."""
    return (
        reference.startswith((".", "/", "~", "\\"))
        or reference.count("/") > 1
        or "\\" in reference
        or reference.endswith("/")
    )


def _cached_on_hub(reference: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return False
    try:
        return isinstance(try_to_load_from_cache(reference, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def _hub_reachable() -> bool:
    """Whether the hub (``HF_ENDPOINT`` or huggingface.co) answers a TCP connection within a few seconds;
    False when ``HF_HUB_OFFLINE`` is set."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS):
            return True
    except OSError:
        return False


def _alternatives(reference: str) -> str:
    close = difflib.get_close_matches(reference.lower(), list(gguf.MODELS), n=2, cutoff=0.6)
    named = ", ".join(gguf.MODELS)
    return (f"Did you mean {' or '.join(repr(c) for c in close)}? " if close else "") + (
        f"Named models: {named}; or a model folder (save_pretrained), a .gguf file, or a hub id already in the "
        "local cache"
    )


def check_model_reference(reference: str | os.PathLike[str]) -> None:
    """Refuse, before anything loads, a reference that names no model this machine can load.

    Args:
        reference: a folder, a ``.gguf`` file, a named model or a hub id.

    Raises:
        ModelFileError: a path that does not exist, or a folder without a model's ``config.json``.
        ConfigurationError: a name that is no named model and no hub id in the local cache, while the hub is
            unreachable (offline, or ``HF_HUB_OFFLINE``), with the close names.
    """
    text = os.fspath(reference)
    if gguf.is_gguf(text):
        return  # named models and .gguf files are checked by gguf.converted_folder
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise ModelFileError(
                f"{text!r} is a folder without a config.json: not a transformers model folder "
                "(write one with model.save_pretrained and tokenizer.save_pretrained)"
            )
        if path.is_file():
            raise ModelFileError(f"{text!r} is a file but not a .gguf one: give the model's folder instead")
        return
    if _looks_like_path(text):
        raise ModelFileError(f"no such model folder: {text!r}")
    if _cached_on_hub(text):
        return
    close = difflib.get_close_matches(text.lower(), list(gguf.MODELS), n=1, cutoff=0.6)
    if close or not _hub_reachable():
        offline = "" if close else " (and the hub is unreachable from here to download it)"
        raise ConfigurationError(
            f"{text!r} names no model here: not a folder, a .gguf file, a named model, or a hub id in the local "
            f"cache{offline}. " + _alternatives(text)
        )
