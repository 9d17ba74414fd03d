"""The bad-input matrix: public entry points × {empty, huge, NaN/inf, wrong type, wrong shape, unicode edge
cases, non-positive privacy parameters, exhausted budget, corrupt files}. Each case must end in a typed
error of the library (a ``DPICLError``) with nothing charged and nothing released."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dp_icl_plugin import (
    BudgetExhaustedError,
    BudgetManager,
    DemoSet,
    DPICLError,
    FakeBackend,
    GaussianEvent,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PTASynthesizer,
    PureDPEvent,
    TangSynthesizer,
)
from dp_icl_plugin.accounting import IndividualBudget, ReleaseCost, RenyiFilter
from dp_icl_plugin.data.files import load_dataset
from dp_icl_plugin.decoding.decoders import MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

WORDS = ["a", "b", "c", "pos", "neg", "Text:", "Label:", "<eos>"]


class World:
    """Fresh components for one case, and a record of what was charged."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ledger = BudgetManager(PrivacyBudget(5.0, 1e-3), ledger=tmp / "ledger.db")
        self.backend = FakeBackend(WORDS, eos_token="<eos>", seed=1)
        self.data = PrivateDataset([PrivateRecord(f"a b {'abc'[i % 3]}", ("pos", "neg")[i % 2]) for i in range(40)])
        self.index = PrivateIndex(
            budget=IndividualBudget(epsilon=2.0, delta=1e-5),
            embedder=lambda t: np.array([[1.0, len(x), x.count("a")] for x in t]),
        )
        self.index.add([f"a b {i}" for i in range(10)], labels=["pos"] * 10)
        self.retriever = PrivateKNN(
            self.index, budget=self.ledger, labels=["pos", "neg"], config=KNNConfig(k=4, shards=2)
        )
        self.rng = np.random.default_rng(0)

    def charged(self) -> tuple[int, int]:
        return len(self.ledger.history()), len(self.index.filter.all_spent()[0])


def _file(tmp: Path, name: str, content: bytes) -> Path:
    path = tmp / name
    path.write_bytes(content)
    return path


NAN, INF, HUGE = math.nan, math.inf, 1e308

CASES: dict[str, Callable[[World], Any]] = {
    # privacy parameters
    "budget ε = 0": lambda w: PrivacyBudget(0.0, 1e-5),
    "budget ε = NaN": lambda w: PrivacyBudget(NAN, 1e-5),
    "budget δ = 1": lambda w: PrivacyBudget(1.0, 1.0),
    "budget ε wrong type": lambda w: PrivacyBudget("1", 1e-5),
    "event σ = −1": lambda w: GaussianEvent(-1.0, neighbouring="replace_one"),
    "event σ = inf": lambda w: GaussianEvent(INF, neighbouring="replace_one"),
    "σ = 1e-300 then spend (ε = inf, refused)": lambda w: w.ledger.spend(
        GaussianEvent(1e-300, neighbouring="replace_one"), label="x"
    ),
    "pure ε huge then spend": lambda w: w.ledger.spend(PureDPEvent(HUGE, neighbouring="replace_one"), label="x"),
    "spend not an event": lambda w: w.ledger.spend("epsilon=1", label="x"),
    "spend empty label": lambda w: w.ledger.spend(PureDPEvent(0.1, neighbouring="replace_one"), label=""),
    "spend label with control characters": lambda w: w.ledger.spend(
        PureDPEvent(0.1, neighbouring="replace_one"), label="a\x00b"
    ),
    "spend label of zero-width and bidi characters": lambda w: w.ledger.spend(
        PureDPEvent(0.1, neighbouring="replace_one"), label="\u200b\u202e"
    ),
    "spend label with a lone surrogate": lambda w: w.ledger.spend(
        PureDPEvent(0.1, neighbouring="replace_one"), label="a\ud800"
    ),
    "exhausted budget": lambda w: w.ledger.spend(PureDPEvent(6.0, neighbouring="replace_one"), label="too much"),
    "individual budget ε = 0": lambda w: IndividualBudget(epsilon=0.0, delta=1e-5),
    "filter cost of the wrong shape": lambda w: RenyiFilter(IndividualBudget(epsilon=1.0, delta=1e-5)).charge(
        np.array([1]), ReleaseCost(np.ones(3))
    ),
    "filter NaN cost": lambda w: RenyiFilter(IndividualBudget(epsilon=1.0, delta=1e-5)).charge(
        np.array([1]), ReleaseCost(np.full(19, NAN))
    ),
    # synthesis
    "synthesis ε = −1": lambda w: TangSynthesizer(epsilon=-1.0, delta=1e-3),
    "synthesis with an unknown label": lambda w: TangSynthesizer(epsilon=1.0, delta=1e-3).synthesize(
        w.data, labels=["nope"], backend=w.backend, budget=w.ledger, rng=w.rng
    ),
    "synthesis wrong dataset type": lambda w: PTASynthesizer(epsilon=1.0, delta=1e-3).synthesize(
        [("a", "pos")], backend=w.backend, budget=w.ledger, rng=w.rng
    ),
    "synthesis without rng": lambda w: PTASynthesizer(
        epsilon=1.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=1, shots_per_label=1, top_k=3
    ).synthesize(w.data, backend=w.backend, budget=w.ledger, rng=None),
    "empty record text": lambda w: PrivateDataset([PrivateRecord("", "pos")]),
    "whitespace record text": lambda w: PrivateDataset([PrivateRecord("\u2003\u00a0 ", "pos")]),
    "empty dataset": lambda w: PrivateDataset([]),
    # files
    "ledger file of random bytes": lambda w: BudgetManager.open(_file(w.tmp, "junk.db", b"\x00\xff" * 100)),
    "ledger file truncated": lambda w: BudgetManager.open(_file(w.tmp, "short.db", b"SQLite for")),
    "demo set corrupt": lambda w: DemoSet.load(_file(w.tmp, "demos.jsonl", b"{not json\n")),
    "demo set empty file": lambda w: DemoSet.load(_file(w.tmp, "empty.jsonl", b"")),
    "dataset file binary": lambda w: load_dataset(
        _file(w.tmp, "d.csv", b"\xff\xfe\x00garbage"), text_column="t", label_column="l"
    ),
    "dataset missing column": lambda w: load_dataset(
        _file(w.tmp, "d2.csv", b"text,label\na,pos\n"), text_column="body", label_column="label"
    ),
    # kNN
    "index add NaN embedding": lambda w: PrivateIndex(
        budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=lambda t: np.full((len(t), 3), NAN)
    ).add(["x"]),
    "index add wrong shape": lambda w: PrivateIndex(
        budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=lambda t: np.ones(len(t))
    ).add(["x"]),
    "index search inf query": lambda w: w.index.search(np.full(3, INF, dtype=np.float32), 2),
    "retriever query of zero-width spaces": lambda w: w.retriever.vote("\u200b\u200b", rng=w.rng),
    "decoder prompt of zero-width spaces": lambda w: MozoDecoder(
        w.data, backend=w.backend, budget=w.ledger, n_queries=1, beta=0.1
    ).generate("\u200b", rng=w.rng),
    "retriever query wrong type": lambda w: w.retriever.vote(b"bytes", rng=w.rng),
    "retriever k = 0": lambda w: w.retriever.retrieve("a b", release="vote", k=0),
    "knn config negative noise": lambda w: KNNConfig(noise_std=-1.0),
    "knn config NaN threshold": lambda w: KNNConfig(min_similarity=NAN),
    # decoding
    "decoder ε = 0": lambda w: MozoDecoder(w.data, backend=w.backend, budget=w.ledger, n_queries=1, epsilon=0.0),
    "decoder n_queries = 0": lambda w: MozoDecoder(w.data, backend=w.backend, budget=w.ledger, n_queries=0, beta=0.1),
    "decoder chat of the wrong shape": lambda w: MozoDecoder(
        w.data, backend=w.backend, budget=w.ledger, n_queries=1, beta=0.1
    ).generate([["user", "hi"]], rng=w.rng),
    "decoder stop not a list": lambda w: MozoDecoder(
        w.data, backend=w.backend, budget=w.ledger, n_queries=1, beta=0.1
    ).generate("a b", rng=w.rng, stop=7),
    "decoder prompt of unknown words": lambda w: MozoDecoder(
        w.data, backend=w.backend, budget=w.ledger, n_queries=1, beta=0.1
    ).generate("zzz", rng=w.rng),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_ends_in_a_typed_error_with_nothing_charged(tmp_path: Path, name: str) -> None:
    world = World(tmp_path)
    before = world.charged()
    with pytest.raises(DPICLError) as info:
        CASES[name](world)
    assert world.charged() == before, "a bad input must not charge anything"
    if name == "exhausted budget":
        assert isinstance(info.value, BudgetExhaustedError)


def test_documented_results_for_oversized_requests(tmp_path: Path) -> None:
    world = World(tmp_path)
    fresh = BudgetManager(PrivacyBudget(1.0, 1e-5))
    fresh.spend(
        GaussianEvent(1e300, neighbouring="replace_one"), label="σ = 1e300"
    )  # no overflow: a tiny, valid charge
    assert 0 <= fresh.spent().epsilon < 0.05
    found = world.index.search(world.index.embed_query("a"), 10**30)  # more than there are: fewer, never padded
    assert len(found) == 10
    retrieval = world.retriever.retrieve("a b", release="vote", k=10**6)
    assert len(retrieval) <= 10 and not retrieval.complete
