"""Leakage surfaces: a canary in every private record must never appear in reprs, logs (any level),
exception messages, LangChain callback payloads, pickles of components, or CLI output."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dp_icl_plugin import BudgetManager, FakeBackend, PrivacyBudget, PrivateDataset, PrivateRecord, TangSynthesizer
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

CANARY = "qqcanary7qq"
WORDS = ["a", "b", "c", "pos", "neg", "Text:", "Label:", "<eos>", CANARY]


def dataset() -> PrivateDataset:
    return PrivateDataset(
        [PrivateRecord(f"a {CANARY} b", ("pos", "neg")[i % 2]) for i in range(40)], public_label_counts="observed"
    )


def backend() -> FakeBackend:
    return FakeBackend(WORDS, eos_token="<eos>", seed=2)


def embed(texts: list[str]) -> np.ndarray:
    return np.array([[1.0, t.count("a") + 0.5, len(t) % 3] for t in texts])


def test_reprs_logs_and_errors_never_show_private_text(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    ledger = BudgetManager(PrivacyBudget(50.0, 1e-3, neighbouring="add_remove"))
    data = dataset()
    method = TangSynthesizer(
        epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=2, shots_per_label=1, top_k=3
    )
    method.synthesize(data, backend=backend(), budget=ledger, rng=np.random.default_rng(0))
    shown += [repr(data), repr(data.records("pos")[0]), str(data.records("pos")[0]), repr(method)]
    index = PrivateIndex(budget=IndividualBudget(epsilon=5.0, delta=1e-5), embedder=embed)
    index.add([f"a {CANARY} {i}" for i in range(20)], labels=["pos"] * 20, answers=[CANARY] * 20)
    retriever = PrivateKNN(index, budget=ledger, labels=["pos", "neg"], config=KNNConfig(k=4, shards=2))
    retrieval = retriever.retrieve("a b", release="vote")
    shown += [repr(index), repr(retriever), repr(retrieval), repr(list(retrieval)), f"{retrieval[0].text}"]
    shown.append(repr(retriever.vote(retrieval, rng=np.random.default_rng(0))))
    replace_one = BudgetManager(PrivacyBudget(50.0, 1e-3))  # MOZO is analysed for replace-one neighbours
    decoder = MozoDecoder(data, backend=backend(), budget=replace_one, n_queries=2, max_tokens=2, beta=0.1, top_k=4)
    shown += [repr(decoder), repr(decoder.generate("a b", rng=np.random.default_rng(0)))]
    # Errors raised while private records are in use say where, never what.
    bad = PrivateDataset(
        [PrivateRecord(f"{CANARY}x unknown", "pos"), *data.records("neg")], public_label_counts="observed"
    )
    all_bad = PrivateDataset([PrivateRecord(f"{CANARY}x{i} unknown", "pos") for i in range(5)])
    for call in (
        lambda: TangSynthesizer(
            epsilon=2.0, delta=1e-3, n_prompts=1, records_per_prompt=1, max_tokens=1, shots_per_label=1, top_k=3
        ).synthesize(bad, backend=backend(), budget=ledger, rng=np.random.default_rng(0)),
        lambda: MozoDecoder(
            all_bad, backend=backend(), budget=replace_one, n_queries=1, max_tokens=1, beta=0.1, top_k=4, n_shots=1
        ).generate("a", rng=np.random.default_rng(0)),
    ):
        with pytest.raises(Exception) as info:
            for _ in range(20):
                call()
        shown.append(str(info.value))
    shown += [r.getMessage() for r in caplog.records]
    blob = "\n".join(shown)
    assert CANARY not in blob


def test_components_holding_private_records_refuse_to_pickle() -> None:
    ledger = BudgetManager(PrivacyBudget(50.0, 1e-3, neighbouring="add_remove"))
    decoder = ClipBlendDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        n_queries=1,
        subset_size=4,
        population_size=40,
        rng_subset=np.random.default_rng(0),
        max_tokens=2,
        temperature=2.0,
    )
    index = PrivateIndex(budget=IndividualBudget(epsilon=5.0, delta=1e-5), embedder=embed)
    index.add([f"a {CANARY}"])
    retriever = PrivateKNN(index, budget=ledger, labels=["pos", "neg"])
    for obj in (decoder, index, retriever, retriever.retrieve("a b", release="vote")):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
    pytest.importorskip("langchain_core")
    from langchain_dp_icl import DPICLLLM, DPICLExampleSelector

    with pytest.raises(TypeError):
        pickle.dumps(DPICLLLM(decoder=decoder, rng=np.random.default_rng(0)))
    selector = DPICLExampleSelector(
        synthesizer=TangSynthesizer(epsilon=1.0, delta=1e-3, top_k=5),
        dataset=dataset(),
        backend=backend(),
        budget=ledger,
        rng=np.random.default_rng(0),
    )
    with pytest.raises(TypeError):
        pickle.dumps(selector)


def test_cli_output_never_shows_private_text(tmp_path: Path) -> None:
    data = tmp_path / "records.csv"
    data.write_text("text,label\n" + "".join(f"a {CANARY} b,{('pos', 'neg')[i % 2]}\n" for i in range(60)))
    ledger = tmp_path / "ledger.db"
    cli = [sys.executable, "-m", "dp_icl_plugin.cli"]
    subprocess.run(
        [*cli, "budget", "init", "--ledger", str(ledger), "--epsilon", "5", "--delta", "1e-3"],
        check=True,
        capture_output=True,
    )
    for extra in ([], ["--label-column", "missing"]):
        done = subprocess.run(
            [
                *cli,
                "synthesize",
                "--method",
                "tang",
                "--data",
                str(data),
                "--text-column",
                "text",
                "--label-column",
                "label",
                "--model",
                "ginc",
                "--epsilon",
                "1",
                "--ledger",
                str(ledger),
                "--out",
                str(tmp_path / "demos.jsonl"),
                "--max-tokens",
                "2",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert CANARY not in done.stdout + done.stderr
