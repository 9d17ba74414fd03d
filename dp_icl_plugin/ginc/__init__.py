"""GINC (Xie et al. 2022): a synthetic language in which a small GPT-2 learns in context.

- :mod:`~dp_icl_plugin.ginc.language`: the HMM mixture, exact sampling and forward filtering (numpy);
- :mod:`~dp_icl_plugin.ginc.prompts`: ICL prompts with Bayes-optimal labels, and PTA's train/test split;
- :mod:`~dp_icl_plugin.ginc.training`: pretraining a GPT-2 on a CPU (torch, transformers);
- :mod:`~dp_icl_plugin.ginc.evaluation`: ICL accuracy through any backend, as JSON, Markdown and a plot.

The package ships the model trained by ``dp-icl bench ginc-train`` (see ``model/ginc.json`` for the exact
command, seeds and losses); :func:`load_model` opens it, or any directory that training wrote.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_icl_plugin.backends.hf import HFBackend
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.language import GincConfig, GincLanguage

if TYPE_CHECKING:
    from dp_icl_plugin.backends.hf import HFBackend

__all__ = ["GincConfig", "GincLanguage", "default_model_path", "load_model", "read_metadata"]


def default_model_path() -> Path:
    """The directory of the GINC model committed with the package."""
    return Path(str(resources.files("dp_icl_plugin.ginc") / "model"))


def read_metadata(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``ginc.json`` of a trained model directory: its language, training config, command and losses."""
    directory = Path(path) if path is not None else default_model_path()
    meta = directory / "ginc.json"
    if not meta.is_file():
        raise ConfigurationError(
            f"{directory} is not a GINC model directory (no ginc.json); train one with "
            "`dp-icl bench ginc-train --out DIR`"
        )
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"{meta} is unreadable: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("language"), dict):
        raise ConfigurationError(f"{meta} does not describe a GINC language")
    return data


def load_model(
    path: str | os.PathLike[str] | None = None, *, device: str | None = "auto", micro_batch_size: int = 32
) -> tuple[HFBackend, GincLanguage]:
    """Open a GINC model directory (default: the committed one) as an ``HFBackend`` with its language.

    ``micro_batch_size``: rows in every forward (public; filler rows complete one, so a DP step of a few
    prompts pays for this many rows: the small GINC model makes that cheap, and evaluations of thousands of
    prompts want a larger value)."""

    directory = Path(path) if path is not None else default_model_path()
    language = GincLanguage(GincConfig.from_dict(read_metadata(directory)["language"]))
    backend = HFBackend.from_pretrained(directory, device=device, dtype="float32", micro_batch_size=micro_batch_size)
    return backend, language
