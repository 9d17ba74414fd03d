"""The private index: exact search, stability, masking of exhausted units, persistence, bad input."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin import ConfigurationError, GaussianEvent, LedgerError, LedgerFormatError
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost
from dp_icl_plugin.errors import FilterMismatchError
from dp_icl_plugin.retrieval import PrivateIndex
from dp_icl_plugin.retrieval.embedding import embed_texts
from dp_icl_plugin.retrieval.index import FILTER_FILE


class TableEmbedder:
    """Texts of the form 'r<number>' map to fixed random vectors; anything else hashes its words."""

    name = "table-embedder"

    def __init__(self, dim: int = 8, seed: int = 0) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(seed)
        self.table: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = []
        for t in texts:
            if t not in self.table:
                self.table[t] = self.rng.normal(size=self.dim)
            out.append(self.table[t])
        return np.array(out)


BUDGET = IndividualBudget(epsilon=1.0, delta=1e-5)


def make_index(n: int = 30, **kwargs) -> tuple[PrivateIndex, TableEmbedder]:
    emb = TableEmbedder()
    index = PrivateIndex(budget=kwargs.pop("budget", BUDGET), embedder=emb, **kwargs)
    index.add([f"r{i}" for i in range(n)], labels=["x" if i % 2 else "y" for i in range(n)])
    return index, emb


class OneRecord:
    """An in-memory index of one record r0 with ``uses`` votes in its budget, a ledger, and how often an index
    lets r0 vote (0 where it is retired: a saved original)."""

    def __init__(self, uses: int) -> None:
        from dp_icl_plugin import BudgetManager, PrivacyBudget
        from dp_icl_plugin.retrieval import KNNConfig

        self.embedder = TableEmbedder()
        self.index = PrivateIndex(budget=BUDGET, embedder=self.embedder)
        self.index.add(["r0"], labels=["x"])
        self.ledger = BudgetManager(PrivacyBudget(10.0, 1e-4))
        self.config = KNNConfig(k=1, shards=1, min_similarity=0.9, uses=uses)

    def takes_part(self, ix: PrivateIndex) -> int:
        from dp_icl_plugin.retrieval import PrivateKNN

        try:
            return len(PrivateKNN(ix, budget=self.ledger, labels=["x", "y"], config=self.config).retrieve("r0"))
        except ConfigurationError as exc:
            assert "saved to" in str(exc)
            return 0

    def covers(self) -> int:
        return len([e for e in self.ledger.history() if e.label.startswith("knn-filter")])


def brute_force(vectors: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ (q / np.linalg.norm(q))
    return list(np.argsort(-sims, kind="stable")[:k])


def test_search_is_exact_and_within_keeps_everything_above_the_threshold() -> None:
    index, emb = make_index(50)
    vectors = np.array([emb.table[f"r{i}"] for i in range(50)])
    q = index.embed_query("some query")
    got = index.search(q, 7)
    assert [int(i) - 1 for i in got.ids] == brute_force(vectors, emb.table["some query"], 7)  # ids start at 1
    within = index.within(q, 0.2)
    sims = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)) @ q
    assert sorted(int(i) - 1 for i in within.ids) == sorted(np.flatnonzero(sims >= 0.2).tolist())
    assert np.all(np.diff(within.similarities) <= 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), victim=st.integers(0, 29))
def test_replacing_one_record_changes_the_top_k_set_by_at_most_one(seed: int, k: int, victim: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(30, 6))
    replaced = vectors.copy()
    replaced[victim] = rng.normal(size=6)
    q = rng.normal(size=6)

    def top(vs: np.ndarray) -> set[tuple[float, ...]]:
        table = {f"r{i}": v for i, v in enumerate(vs)}
        index = PrivateIndex(budget=BUDGET, embedder=lambda texts: np.array([table.get(t, np.ones(6)) for t in texts]))
        ids = index.add(list(table))
        got = index.search((q / np.linalg.norm(q)).astype(np.float32), k)
        return {tuple(np.round(vs[int(np.flatnonzero(ids == i)[0])], 6)) for i in got.ids}

    a, b = top(vectors), top(replaced)
    assert len(a - b) <= 1 and len(b - a) <= 1


def test_exhausted_records_are_never_returned_and_the_mask_survives_a_reopen(tmp_path: Path) -> None:
    emb = TableEmbedder()
    index = PrivateIndex(budget=BUDGET, embedder=emb, path=tmp_path / "ix")
    ids = index.add([f"r{i}" for i in range(20)])
    q = index.embed_query("query")
    heavy = ReleaseCost.of(
        GaussianEvent(1.0, neighbouring="add_remove"), BUDGET.orders
    )  # more than a record can ever pay
    light = ReleaseCost.of(GaussianEvent(30.0, neighbouring="add_remove"), BUDGET.orders)
    first = index.search(q, 5)
    admitted = index.charge(first, lambda c: light)
    assert len(admitted) == 5
    # Exhaust the 5 nearest with light charges until they cannot pay any more.
    while len(index.charge(first, lambda c: light)):
        pass
    nearest_now = index.search(q, 20)
    assert not set(first.ids.tolist()) & set(nearest_now.ids.tolist())
    assert len(nearest_now) == 15  # fewer than asked: nothing is padded
    assert not len(index.charge(first, lambda c: heavy))
    reopened = PrivateIndex.open(tmp_path / "ix", embedder=emb)
    np.testing.assert_array_equal(reopened.search(q, 20).ids, nearest_now.ids)
    np.testing.assert_array_equal(reopened.filter.spent(ids)[0], index.filter.spent(ids)[0])


def test_save_open_round_trip_and_removal(tmp_path: Path) -> None:
    index, _ = make_index(25)
    q = index.embed_query("query")
    index.charge(
        index.search(q, 3), lambda c: ReleaseCost.of(GaussianEvent(20.0, neighbouring="add_remove"), BUDGET.orders)
    )
    assert index.remove([1, 2, 999]) == 2
    assert len(index) == 23
    assert 1 not in index.search(q, 25).ids and 2 not in index.search(q, 25).ids
    nearest, units = index.search(q, 10).ids, np.arange(1, 26)
    spent = index.filter.spent(units)[0]
    saved = index.save(tmp_path / "copy")
    assert len(saved) == 23 and saved.id == index.id
    np.testing.assert_array_equal(saved.search(q, 10).ids, nearest)
    np.testing.assert_array_equal(saved.filter.spent(units)[0], spent)
    assert [r.label for r in saved.records(np.array([3, 4]))] == ["y", "x"]
    with sqlite3.connect(tmp_path / "copy" / "records.sqlite") as conn:  # deleted text is gone from disk
        assert conn.execute("SELECT count(*) FROM records WHERE id IN (1, 2)").fetchone()[0] == 0


def test_saving_moves_the_index_so_a_record_spends_its_budget_once(tmp_path: Path) -> None:
    """Issue 27: save() returned a copy with the same id and left the original usable (and savable again), so
    a record with uses = 1 took part in 3 votes under one ledger charge. Now the spend moves to the directory:
    the in-memory original refuses every use, naming where it went, and a second save is refused."""
    one = OneRecord(uses=1)
    index, takes_part = one.index, one.takes_part
    copies = [index]
    for name in ("a", "b"):
        try:
            copies.append(index.save(tmp_path / name))
        except ConfigurationError as exc:
            assert f"saved to {tmp_path / 'a'}" in str(exc)
    assert sum(takes_part(ix) for ix in copies) == 1  # was 3: the original and two copies each let it vote
    assert len(copies) == 2 and not (tmp_path / "b").exists()
    assert one.covers() == 1


def test_a_saved_in_memory_index_and_its_filter_refuse_every_use(tmp_path: Path) -> None:
    index, _ = make_index(5)
    q = index.embed_query("r0")
    memory_filter = index.filter
    saved = index.save(tmp_path / "ix")
    cost = ReleaseCost.of(GaussianEvent(20.0, neighbouring="add_remove"), BUDGET.orders)
    from dp_icl_plugin.retrieval.index import Candidates

    calls = [
        lambda: index.add(["r9"]),
        lambda: index.remove([1]),
        lambda: index.refresh(),
        lambda: len(index),
        lambda: index.search(q, 2),
        lambda: index.within(q, 0.0),
        lambda: index.embed_query("q"),
        lambda: index.records(np.array([1])),
        lambda: index.present(np.array([1])),
        lambda: index.units_of(np.array([1])),
        lambda: index.expect_release(cost),
        lambda: index.charge(Candidates(np.array([1]), np.ones(1, dtype=np.float32)), lambda c: cost),
        lambda: index.save(tmp_path / "again"),
        lambda: memory_filter.charge(np.array([1]), cost),
        lambda: memory_filter.spent(np.array([1])),
        lambda: memory_filter.all_spent(),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError, match=r"saved to .*ix.*use the"):
            call()
    assert "PrivateIndex(" in repr(index)  # still printable
    assert len(saved) == 5 and saved.filter.all_spent()[0].size == 0


@pytest.mark.parametrize("fails", ["filter copy", "publish"])
def test_a_save_that_fails_midway_leaves_no_index_and_the_original_in_use(
    tmp_path: Path, fails: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold review of issue 27: a save that failed after the records were written and the filter file created
    (a full disk, a kill) left a directory PrivateIndex.open accepted, same id, its filter without the spend:
    a record with uses = 1 voted again there under the one cover. Now nothing is published until complete."""
    from dp_icl_plugin.accounting.renyi_filter import RenyiFilter
    from dp_icl_plugin.retrieval import index as index_module

    one = OneRecord(uses=1)
    index, takes_part = one.index, one.takes_part
    assert takes_part(index) == 1 and takes_part(index) == 0  # r0 has spent its one use
    if fails == "filter copy":
        real = RenyiFilter._write_copy

        def write_copy(self: RenyiFilter, path: object, owner: str, **kwargs: object) -> RenyiFilter:
            real(self, path, owner, **kwargs)
            raise OSError("disk full (injected)")  # the file exists by now: as a full disk mid-write leaves it

        monkeypatch.setattr(RenyiFilter, "_write_copy", write_copy)
        error: type[Exception] = OSError
    else:
        monkeypatch.setattr(index_module.os, "rename", lambda *a: (_ for _ in ()).throw(OSError("injected")))
        error = LedgerError
    with pytest.raises(error):
        index.save(tmp_path / "ix")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # nothing at the path, no staging directory left
    with pytest.raises(LedgerError, match="no private index"):
        PrivateIndex.open(tmp_path / "ix", embedder=one.embedder)
    assert takes_part(index) == 0  # the original is the one live index, and still knows r0 is spent
    saved = index.save(tmp_path / "ix")  # a later save works
    assert takes_part(saved) == 0 and one.covers() == 1


@pytest.mark.parametrize("after", ["an error", "an interrupt"])
def test_a_rename_that_took_effect_retires_the_original_whatever_it_reported(
    tmp_path: Path, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second cold review of issue 27: a rename that took effect and then reported an error (an NFS
    retransmission) or was followed by an interrupt left the original in use beside the saved copy: two live
    filters for one id (a record with uses = 2 used 3 times). The original is now retired before publishing,
    and put back in use only when nothing was published."""
    from dp_icl_plugin.retrieval import index as index_module

    one = OneRecord(uses=2)
    index, takes_part = one.index, one.takes_part
    assert takes_part(index) == 1  # one of r0's two uses
    real = index_module.os.rename
    failure: BaseException = OSError("ENOENT (a retransmitted rename)") if after == "an error" else KeyboardInterrupt()

    def rename(src: object, dst: object) -> None:
        real(src, dst)
        raise failure

    monkeypatch.setattr(index_module.os, "rename", rename)
    if after == "an error":
        saved = index.save(tmp_path / "ix")  # it took effect: a successful save
    else:
        with pytest.raises(KeyboardInterrupt):
            index.save(tmp_path / "ix")
        saved = PrivateIndex.open(tmp_path / "ix", embedder=one.embedder)
    monkeypatch.undo()
    assert takes_part(index) == 0 and takes_part(saved) == 1 and takes_part(saved) == 0  # 2 uses in all


def test_an_index_is_saved_to_a_new_or_empty_directory_only(tmp_path: Path) -> None:
    index, _ = make_index(3)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("someone's file")
    with pytest.raises(ConfigurationError, match="already holds files"):
        index.save(tmp_path / "busy")
    (tmp_path / "empty").mkdir()
    saved = index.save(tmp_path / "empty")
    assert len(saved) == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["busy", "empty"]


def test_persistence_refuses_mismatched_parts(tmp_path: Path) -> None:
    a, emb = make_index(5)
    b, _ = make_index(5)
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    (tmp_path / "a" / FILTER_FILE).replace(tmp_path / "spare.sqlite")
    (tmp_path / "b" / FILTER_FILE).replace(tmp_path / "a" / FILTER_FILE)
    with pytest.raises(FilterMismatchError, match="another index"):
        PrivateIndex.open(tmp_path / "a", embedder=emb)
    (tmp_path / "a" / FILTER_FILE).unlink()
    with pytest.raises(LedgerError, match="privacy spend is missing"):
        PrivateIndex.open(tmp_path / "a", embedder=emb)
    with pytest.raises(LedgerError, match="no private index"):
        PrivateIndex.open(tmp_path / "nothing", embedder=emb)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "records.sqlite").write_bytes(b"garbage that is not sqlite")
    with pytest.raises(LedgerFormatError):
        PrivateIndex.open(tmp_path / "c", embedder=emb)
    with pytest.raises(ConfigurationError, match="embedder"):
        PrivateIndex.open(tmp_path / "b", embedder=lambda texts: np.ones((len(texts), 8)))
    with pytest.raises(ConfigurationError, match="already holds"):
        make_index(5)[0].save(tmp_path / "b")


def test_bad_input_is_refused_and_nothing_is_added() -> None:
    index, emb = make_index(4)
    with pytest.raises(ConfigurationError, match="dimension"):
        index.search(np.ones(3, dtype=np.float32), 2)
    with pytest.raises(ConfigurationError, match="NaN"):
        index.search(np.full(8, np.nan, dtype=np.float32), 2)
    emb.table["nan"] = np.full(8, np.nan)
    emb.table["other dim"] = np.ones(5)
    with pytest.raises(ConfigurationError, match="NaN"):
        index.add(["nan"])
    with pytest.raises(ConfigurationError, match="8-d"):
        index.add(["other dim"])
    with pytest.raises(ConfigurationError, match="texts"):
        index.add("a single string")
    with pytest.raises(ConfigurationError, match=r"texts\[1\]"):
        index.add(["fine", "  "])
    with pytest.raises(ConfigurationError, match="labels"):
        index.add(["one", "two"], labels=["only one"])
    with pytest.raises(ConfigurationError, match="user id"):
        PrivateIndex(budget=BUDGET, embedder=emb, group_by_user=True).add(["r1"], user_ids=[None])
    with pytest.raises(ConfigurationError, match="k must be"):
        index.search(index.embed_query("q"), 0)
    with pytest.raises(ConfigurationError, match="min_similarity"):
        index.within(index.embed_query("q"), 1.5)
    assert len(index) == 4


def test_an_empty_index_returns_nothing() -> None:
    index = PrivateIndex(budget=BUDGET, embedder=TableEmbedder())
    q = np.ones(8, dtype=np.float32) / math.sqrt(8)
    assert len(index.search(q, 3)) == 0 and len(index.within(q, 0.0)) == 0


def test_reprs_name_no_count_of_private_records() -> None:
    """How many records an index holds (or are near a query) is private under add/remove: no repr shows it."""
    index = PrivateIndex(budget=BUDGET, embedder=TableEmbedder())
    empty = repr(index)
    index.add([f"r{i}" for i in range(7)], labels=["x"] * 7)
    assert repr(index) == empty and "7" not in empty
    q = index.embed_query("query")
    assert repr(index.within(q, -1.0)) == repr(index.within(q, 1.0))  # 7 candidates or none
    records = index.records(np.array([1, 2]))
    assert "x" not in repr(records) and "r1" not in repr(records) and "set" not in repr(records)


def test_user_grouping_charges_a_person_once_for_all_their_records() -> None:
    emb = TableEmbedder()
    index = PrivateIndex(budget=BUDGET, embedder=emb, group_by_user=True)
    ids = index.add(["r0", "r1", "r2"], user_ids=["ann", "ann", "bob"])
    units = index.units_of(ids)
    assert units[0] == units[1] != units[2]
    seen: list[int] = []

    def cost(c: int) -> ReleaseCost:
        seen.append(c)
        return ReleaseCost.of(GaussianEvent(40.0 / c, neighbouring="add_remove"), BUDGET.orders)

    from dp_icl_plugin.retrieval.index import Candidates

    admitted = index.charge(Candidates(ids, np.ones(3, dtype=np.float32)), cost)
    assert len(admitted) == 3 and sorted(seen) == [1, 2]
    spent = index.filter.spent(units)[0]
    np.testing.assert_allclose(spent[0], 4 * spent[2])  # two records: twice the sensitivity, 4× the RDP


def test_search_falls_back_to_the_bitmap_selector_when_the_nearest_are_all_masked() -> None:
    index, emb = make_index(100)
    q = index.embed_query("query")
    nearest = index.search(q, 60)
    full = ReleaseCost.of(GaussianEvent(30.0, neighbouring="add_remove"), BUDGET.orders)
    while len(index.charge(nearest, lambda c: full)):
        pass  # exhaust the 60 nearest
    got = index.search(q, 5)  # the unfiltered over-fetch (26) holds only masked records
    vectors = np.array([emb.table[f"r{i}"] for i in range(100)])
    expected = [i + 1 for i in brute_force(vectors, emb.table["query"], 100) if i + 1 not in set(nearest.ids.tolist())]
    assert got.ids.tolist() == expected[:5]
    assert not set(index.within(q, -1.0).ids.tolist()) & set(nearest.ids.tolist())


# ---------------------------------------------------------------- the embedder is known by what it computes


def test_another_embedder_is_refused_whatever_its_name(tmp_path: Path) -> None:
    def embed_a(texts: list[str]) -> np.ndarray:
        return np.array([[len(t), t.count("e") + 1.0, 1.0] for t in texts])

    def embed_b(texts: list[str]) -> np.ndarray:  # same shape, another "model"
        return np.array([[t.count("o") + 1.0, len(t), 2.0] for t in texts])

    index = PrivateIndex(budget=BUDGET, embedder=embed_a, path=tmp_path / "ix")
    index.add(["first record", "second record"])
    with pytest.raises(ConfigurationError, match="another embedder"):
        PrivateIndex.open(tmp_path / "ix", embedder=embed_b)

    class Named:  # a model that claims the index's name
        name = index.embedder_name

        def __call__(self, texts: list[str]) -> np.ndarray:
            return embed_b(texts)

    with pytest.raises(ConfigurationError, match="another embedder"):
        PrivateIndex.open(tmp_path / "ix", embedder=Named())
    reopened = PrivateIndex.open(tmp_path / "ix", embedder=embed_a)
    assert len(reopened) == 2 and reopened.embedder_name.endswith("embed_a")


@pytest.mark.parametrize("framework", ["langchain", "llama_index"])
def test_framework_embeddings_are_embedders(tmp_path: Path, framework: str) -> None:
    if framework == "langchain":
        pytest.importorskip("langchain_core")
        from langchain_core.embeddings import DeterministicFakeEmbedding

        make: Any = lambda: DeterministicFakeEmbedding(size=16)  # noqa: E731
    else:
        pytest.importorskip("llama_index.core")
        from llama_index.core.embeddings import MockEmbedding

        make = lambda: MockEmbedding(embed_dim=16)  # noqa: E731
    index = PrivateIndex(budget=BUDGET, embedder=make(), path=tmp_path / "ix")
    index.add(["alpha record", "beta record", "gamma record"])
    assert index.dim == 16 and len(index.search(embed_texts(make(), ["alpha record"])[0], 2).ids) == 2
    assert len(PrivateIndex.open(tmp_path / "ix", embedder=make())) == 3


def test_copies_sharing_a_directory_see_each_others_records(tmp_path: Path) -> None:
    emb = TableEmbedder()
    a = PrivateIndex(budget=BUDGET, embedder=emb, path=tmp_path / "ix")
    first = a.add([f"r{i}" for i in range(4)])
    b = PrivateIndex.open(tmp_path / "ix", embedder=emb)  # another process's copy
    added = b.add(["r4", "r5"])
    query = emb(["r4"])[0]
    assert set(added) <= set(a.search(query, 6).ids.tolist())  # a refreshed before searching
    a.remove(first[:2])
    assert not set(first[:2]) & set(b.within(query, -1.0).ids.tolist())
    assert len(a) == len(b) == 4
    assert [r.text for r in b.records(added)] == ["r4", "r5"]


def test_a_schema_1_index_is_upgraded_on_open(tmp_path: Path) -> None:
    import sqlite3

    index, emb = make_index(4)
    index.save(tmp_path / "ix")
    conn = sqlite3.connect(tmp_path / "ix" / "records.sqlite")  # back to the layout of schema 1
    with conn:
        conn.execute("ALTER TABLE records DROP COLUMN version")
        conn.execute("DROP TABLE deletions")
        conn.execute("DELETE FROM meta WHERE key = 'version'")
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    old = PrivateIndex.open(tmp_path / "ix", embedder=emb)
    assert len(old) == 4
    old.add(["r9"])
    old.remove(old.search(emb(["r0"])[0], 1).ids)
    assert len(PrivateIndex.open(tmp_path / "ix", embedder=emb)) == 4


def test_a_removal_of_nothing_never_skips_another_processs_change(tmp_path: Path) -> None:
    emb = TableEmbedder()
    a = PrivateIndex(budget=BUDGET, embedder=emb, path=tmp_path / "ix")
    a.add(["r0", "r1"])
    b = PrivateIndex.open(tmp_path / "ix", embedder=emb)
    new = b.add(["r2"])  # a change a has not seen
    assert a.remove([999]) == 0  # took the store's version as its own before: b's record was never applied
    assert set(new) <= set(a.within(emb(["r2"])[0], -1.0).ids.tolist()) and len(a) == 3
