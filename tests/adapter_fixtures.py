"""What the adapter distributions' tests share, free of both frameworks: a tiny byte-level GPT-2 trained here, a
private dataset with a canary in every record, a private kNN core, a DemoSet, and the shared decoders and ledger
of the LangChain standard suites."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests_support import tiny_text_gpt2

from dp_icl_plugin import BudgetManager, DemoSet, MozoDecoder, PrivacyBudget, PrivateDataset, PrivateRecord, Provenance
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.data.records import Demonstration
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

CANARY = "zqxcanaryzqx"
CORPUS = [
    "Hello, how are you today? I am fine, thank you. What is the weather like?",
    "user: assistant: system: Please answer the question. Label: Text: Answer:",
    "The cat sat on the mat. Numbers: 1 2 3 4 5 6 7 8 9 0. What's 2 + 2? Four.",
    f"records: apples oranges bananas {CANARY} red green blue",
]


@functools.cache
def backend():
    import torch

    from dp_icl_plugin.backends.hf import HFBackend

    torch.set_num_threads(1)
    root = Path(__import__("tempfile").mkdtemp(prefix="dp-icl-lc-"))
    return HFBackend.from_pretrained(
        tiny_text_gpt2(root / "gpt2", CORPUS * 5, n_positions=1024), device="cpu", dtype="float32"
    )


def dataset(n: int = 24) -> PrivateDataset:
    fruit = ["apples", "oranges", "bananas"]
    return PrivateDataset([PrivateRecord(f"{CANARY}{i} likes {fruit[i % 3]}", fruit[i % 3]) for i in range(n)])


def unit_dataset(n: int = 24) -> PrivateDataset:
    """:func:`dataset` with its records in 8 units (people) of 3, unit counts declared as observed."""
    fruit = ["apples", "oranges", "bananas"]
    records = [
        PrivateRecord(f"{CANARY}{i} likes {fruit[i % 3]}", fruit[i % 3], unit=f"person-{i % 8}") for i in range(n)
    ]
    return PrivateDataset(records, public_label_counts="observed", public_unit_counts="observed")


def unit_ledger() -> BudgetManager:
    """A unit-level ledger: every charge holds for all records of one person."""
    return BudgetManager(PrivacyBudget(1e3, 1e-3, privacy_unit="unit"))


def unit_knn_core() -> PrivateKNN:
    """:func:`knn_core` per person: the index grouped by user (10 people of 4 records) on a unit-level ledger."""
    texts = [f"{CANARY} the cat sat on the mat number {i % 4}" for i in range(40)]

    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[t.count("cat") + 1.0, t.count("mat"), t.count("number") * 0.5] for t in batch])

    index = PrivateIndex(budget=IndividualBudget(epsilon=1e4, delta=1e-5), embedder=embed, group_by_user=True)
    index.add(texts, answers=["the cat"] * 40, user_ids=[f"person-{i % 10}" for i in range(40)])
    ledger = BudgetManager(PrivacyBudget(1e6, 1e-3, neighbouring="add_remove", privacy_unit="unit"))
    config = KNNConfig(
        k=8, shards=4, min_similarity=0.5, uses=1, keywords=3, max_answer_tokens=4, keyword_noise_std=0.05
    )
    return PrivateKNN(index, budget=ledger, backend=backend(), config=config)


def knn_core() -> PrivateKNN:
    texts = [f"{CANARY} the cat sat on the mat number {i % 4}" for i in range(40)]

    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[t.count("cat") + 1.0, t.count("mat"), t.count("number") * 0.5] for t in batch])

    index = PrivateIndex(budget=IndividualBudget(epsilon=1e4, delta=1e-5), embedder=embed)
    index.add(texts, answers=["the cat"] * 40)
    # ε = 1e4 per record has no replace-one conversion (group privacy's δ would pass 1): an add/remove ledger.
    # keyword_noise_std 0.05: a record can pay for an answer (at 0.01 none could: answers were made from 0 records,
    # and the ledger now refuses a release costing more than its cover)
    knn_ledger = BudgetManager(PrivacyBudget(1e6, 1e-3, neighbouring="add_remove"))
    return PrivateKNN(
        index,
        budget=knn_ledger,
        backend=backend(),
        config=KNNConfig(
            k=8, shards=4, min_similarity=0.5, uses=1, keywords=3, max_answer_tokens=4, keyword_noise_std=0.05
        ),
    )


def demo_set() -> DemoSet:
    prov = Provenance(
        method="tang",
        config={},
        epsilon=1.0,
        delta=1e-5,
        event={},
        ledger_entry_id=1,
        ledger_label="synthesis",
        model_id="m",
    )
    demos = [Demonstration(label=y, text=f"synthetic {y} {i}") for i in range(2) for y in ("pos", "neg")]
    return DemoSet(demos, prov)


class _ForwardWrapper:
    """A backend that changes what its inner backend's ``next_token_logprobs*`` calls do (:meth:`_forward`)
    and passes everything else through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not name.startswith("next_token_logprobs"):
            return found
        return lambda *args, **kwargs: self._forward(found, *args, **kwargs)

    def _forward(self, found: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class TerseBackend(_ForwardWrapper):
    """A backend that ends JSON strings and objects early: ``bias`` nats are added to the log-probabilities of
    the tokens of ``words`` (default a closing quote and brace) and each row is renormalised. Under a schema's
    grammar the randomly initialised model then answers ``{"setup":"","punchline":""}`` within a few tokens,
    so LangChain's standard structured-output tests check the adapter's plumbing, not the model's jokes."""

    def __init__(self, inner: Any, words: tuple[str, ...] = ('"', "}"), bias: float = 12.0) -> None:
        super().__init__(inner)
        self._bias = bias
        self._favoured = sorted({i for word in words for i in inner.encode(word)})

    def _forward(self, found: Any, *args: Any, **kwargs: Any) -> Any:
        logprobs = np.array(found(*args, **kwargs), dtype=np.float64)
        logprobs[..., self._favoured] += self._bias
        logprobs -= np.logaddexp.reduce(logprobs, axis=-1, keepdims=True)
        return logprobs.astype(np.float32)


class SlowBackend(_ForwardWrapper):
    """A backend whose every forward is made slow: an answer takes ``delay`` seconds per token."""

    def __init__(self, inner: Any, delay: float) -> None:
        super().__init__(inner)
        self._delay = delay

    def _forward(self, found: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self._delay)
        return found(*args, **kwargs)


@functools.cache
def shared_ledger() -> BudgetManager:
    return BudgetManager(PrivacyBudget(1e6, 1e-3))


@functools.cache
def shared_decoder() -> MozoDecoder:
    # max_tokens 10: the standard suite builds the model with max_tokens=10 (test_standard_params)
    return MozoDecoder(
        dataset(), backend=backend(), budget=shared_ledger(), n_queries=10_000, max_tokens=10, beta=0.5, top_k=20
    )


# LangChain's standard parameters, but temperature: a DP answer's sampling is the mechanism's (refused otherwise),
# and max_tokens within the decoder's share (above it is refused, not capped)
STANDARD_PARAMS = {"max_tokens": 8, "timeout": 60, "stop": [], "max_retries": 2}


@functools.cache
def terse_decoder() -> MozoDecoder:
    return MozoDecoder(
        dataset(),
        backend=TerseBackend(backend()),
        budget=shared_ledger(),
        n_queries=10_000,
        max_tokens=48,
        beta=0.5,
        top_k=20,
    )


def per_token_decoder() -> tuple[MozoDecoder, BudgetManager]:
    """A DPS-MOZO decoder paid per token (its own ledger): an allowance of ε = 6 for 2 answers of 4 tokens."""
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3))
    decoder = MozoDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        n_queries=2,
        max_tokens=4,
        epsilon=6.0,
        top_k=20,
        pay_per_token=True,
    )
    return decoder, ledger


def spend_allowance(answer: Any) -> None:
    """Call ``answer()`` until its decoder's allowance refuses (``AllowanceSpentError``)."""
    from dp_icl_plugin import AllowanceSpentError

    while True:
        try:
            answer()
        except AllowanceSpentError:
            return
