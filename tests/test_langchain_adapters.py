"""LangChain adapters: the standard suites (chat model unit + integration, retriever integration) and our own
tests of the selector, the DP LLM, charging, streaming and traces, on a tiny byte-level GPT-2 built here."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("torch")

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import (
    ChatPromptTemplate,
    FewShotChatMessagePromptTemplate,
    FewShotPromptTemplate,
    PromptTemplate,
)
from langchain_dp_icl import DPICLLLM, ChatDPICL, DPICLExampleSelector, DPICLRetriever
from langchain_tests.integration_tests import ChatModelIntegrationTests, RetrieversIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from tests_support import tiny_text_gpt2

from dp_icl_plugin import BudgetExhaustedError, BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.methods import DemoSet, PrivateDataset, PrivateRecord, Provenance, TangSynthesizer
from dp_icl_plugin.methods.data import Demonstration
from dp_icl_plugin.methods.decoding import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.methods.knn import KNNConfig, PrivateIndex, PrivateKNN

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
    return HFBackend.from_pretrained(tiny_text_gpt2(root / "gpt2", CORPUS * 5, n_positions=1024), device="cpu",
                                     dtype="float32")  # fmt: skip


def dataset(n: int = 24) -> PrivateDataset:
    fruit = ["apples", "oranges", "bananas"]
    return PrivateDataset([PrivateRecord(f"{CANARY}{i} likes {fruit[i % 3]}", fruit[i % 3]) for i in range(n)])


@functools.cache
def shared_ledger() -> BudgetManager:
    return BudgetManager(PrivacyBudget(1e6, 1e-3))


@functools.cache
def shared_decoder() -> MozoDecoder:
    return MozoDecoder(dataset(), backend=backend(), budget=shared_ledger(), n_queries=10_000, max_tokens=8,
                       beta=0.5, top_k=20)  # fmt: skip


def chat_params() -> dict[str, Any]:
    return {"decoder": shared_decoder(), "rng": np.random.default_rng(0), "model": "tiny-gpt2"}


class Recorder(BaseCallbackHandler):
    """Keeps the string form of everything every callback receives."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: self.seen.append(repr((name, args, kwargs)))
        return super().__getattribute__(name)


# ------------------------------------------------------------------------------------------ standard suites


class TestDPChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatDPICL]:
        return ChatDPICL

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return chat_params()


class TestDPChatModelIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatDPICL]:
        return ChatDPICL

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return chat_params()


def _knn_retriever() -> PrivateKNN:
    texts = [f"{CANARY} the cat sat on the mat number {i % 4}" for i in range(40)]

    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[t.count("cat") + 1.0, t.count("mat"), t.count("number") * 0.5] for t in batch])

    index = PrivateIndex(budget=IndividualBudget(epsilon=1e4, delta=1e-5), embedder=embed)
    index.add(texts, answers=["the cat"] * 40)
    # ε = 1e4 per record has no replace-one conversion (group privacy's δ would pass 1): an add/remove ledger
    knn_ledger = BudgetManager(PrivacyBudget(1e6, 1e-3, neighbouring="add_remove"))
    return PrivateKNN(index, budget=knn_ledger, backend=backend(),
                            config=KNNConfig(k=8, shards=4, min_similarity=0.5, uses=1, keywords=3,
                                             max_answer_tokens=4, ptr_noise_std=0.01))  # fmt: skip


class TestDPPrivateRetriever(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[DPICLRetriever]:
        return DPICLRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"knn": _knn_retriever(), "rng": np.random.default_rng(0)}

    @property
    def retriever_query_example(self) -> str:
        return "where did the cat sit?"

    @pytest.mark.xfail(reason="a DP release returns fewer than k keywords when the stability test fails", strict=False)
    def test_k_constructor_param(self) -> None:
        super().test_k_constructor_param()

    @pytest.mark.xfail(reason="a DP release returns fewer than k keywords when the stability test fails", strict=False)
    def test_invoke_with_k_kwarg(self, retriever: Any) -> None:
        super().test_invoke_with_k_kwarg(retriever)


# ------------------------------------------------------------------------------------------ our own tests


def _demos() -> DemoSet:
    prov = Provenance(method="tang", config={}, epsilon=1.0, delta=1e-5, event={}, ledger_entry_id=1,
                      ledger_label="synthesis", model_id="m")  # fmt: skip
    demos = [Demonstration(label=y, text=f"synthetic {y} {i}") for i in range(2) for y in ("pos", "neg")]
    return DemoSet(demos, prov)


def test_selector_serves_a_demoset_in_both_few_shot_templates_for_free() -> None:
    ledger = BudgetManager(PrivacyBudget(1.0, 1e-5))
    example_prompt = PromptTemplate.from_template("Text: {input}\nLabel: {output}")
    selector = DPICLExampleSelector(_demos(), k=2, example_prompt=example_prompt)
    prompt = FewShotPromptTemplate(example_selector=selector, example_prompt=example_prompt,
                                   suffix="Text: {input}\nLabel:", input_variables=["input"])  # fmt: skip
    text = prompt.format(input="a query")
    assert "synthetic pos 0" in text and "synthetic neg 0" in text and "synthetic pos 1" not in text
    chat = FewShotChatMessagePromptTemplate(
        example_selector=selector, input_variables=["input"],
        example_prompt=ChatPromptTemplate.from_messages([("human", "{input}"), ("ai", "{output}")]),
    )  # fmt: skip
    messages = chat.format_messages(input="a query")
    assert [m.content for m in messages] == ["synthetic pos 0", "pos", "synthetic neg 0", "neg"]
    assert ledger.history() == []


def test_lazy_synthesis_charges_once() -> None:
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    method = TangSynthesizer(epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3,
                             shots_per_label=1, top_k=5)  # fmt: skip
    selector = DPICLExampleSelector(synthesizer=method, dataset=dataset().with_public_label_counts("observed"),
                                        backend=backend(), budget=ledger, rng=np.random.default_rng(0))  # fmt: skip
    assert ledger.history() == []
    first = selector.select_examples({"input": "q"})
    second = selector.select_examples({"input": "another"})
    assert first == second and len(first) == 3  # one per label
    assert len(ledger.history()) == 1
    assert CANARY not in repr(selector)


def test_selector_bad_input() -> None:
    with pytest.raises(ConfigurationError, match="budget"):
        DPICLExampleSelector(synthesizer=TangSynthesizer(epsilon=1.0, delta=1e-3), dataset=dataset(),
                                 backend=FakeBackend(["a"]), rng=np.random.default_rng(0))  # fmt: skip
    with pytest.raises(ConfigurationError, match="needs"):
        DPICLExampleSelector(_demos(), example_prompt=PromptTemplate.from_template("{question} {answer}"))
    with pytest.raises(ConfigurationError, match="fields"):
        DPICLExampleSelector(_demos(), fields={"input": "secret"})
    selector = DPICLExampleSelector(_demos())
    with pytest.raises(ConfigurationError, match="not differentially private"):
        selector.add_example({"input": "x", "output": "y"})
    selector.add_public_example({"input": "a public example", "output": "pos"})
    assert selector.select_examples({"input": "q"})[-1] == {"input": "a public example", "output": "pos"}


def test_dp_llm_charges_every_answer_before_any_token_and_honours_stop() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=3, max_tokens=6, beta=0.05,
                          top_k=20)  # fmt: skip
    llm = DPICLLLM(decoder=decoder, rng=np.random.default_rng(1))
    out = llm.invoke("Hello, how are you?")
    assert isinstance(out, str) and CANARY not in out
    assert len(ledger.history()) == 1 and ledger.history()[0].event == decoder.answer_event(6)
    pieces = list(llm.stream("What is the weather like?", stop=["e"]))
    assert "e" not in "".join(pieces)
    assert len(ledger.history()) == 2
    outs = llm.batch(["one", "two", "three"])
    assert len(outs) == 3 and len(ledger.history()) == 5


def test_a_refused_charge_releases_nothing() -> None:
    ledger = BudgetManager(PrivacyBudget(0.5, 1e-3))
    decoder = ClipBlendDecoder(dataset(), backend=backend(), budget=ledger, n_queries=1, subset_size=6,
                               rng_subset=np.random.default_rng(0), max_tokens=6, temperature=3.0)  # fmt: skip
    chat = ChatDPICL(decoder=decoder, rng=np.random.default_rng(0))
    stream = chat.stream([HumanMessage("Hello")])
    with pytest.raises(BudgetExhaustedError):
        next(stream)
    assert ledger.history() == []


def test_chat_history_must_end_with_the_user_and_empty_prompts_are_refused() -> None:
    chat = ChatDPICL(decoder=shared_decoder(), rng=np.random.default_rng(0))
    before = len(shared_ledger().history())
    with pytest.raises(ConfigurationError, match="last message"):
        chat.invoke([HumanMessage("hi"), AIMessage("hello")])
    with pytest.raises(ConfigurationError, match="empty"):
        chat.invoke([SystemMessage("be brief"), HumanMessage("   ")])
    with pytest.raises(ConfigurationError, match="empty"):
        DPICLLLM(decoder=shared_decoder(), rng=np.random.default_rng(0)).invoke("")
    assert len(shared_ledger().history()) == before


def test_private_text_stays_out_of_traces_reprs_and_serialization() -> None:
    recorder = Recorder()
    chat = ChatDPICL(decoder=shared_decoder(), rng=np.random.default_rng(0))
    chat.invoke([HumanMessage("Hello")], config={"callbacks": [recorder]})
    retriever = DPICLRetriever(knn=_knn_retriever(), rng=np.random.default_rng(0), mode="answer")
    docs = retriever.invoke("where did the cat sit?", config={"callbacks": [recorder]})
    assert len(docs) == 1 and docs[0].metadata["kind"] == "dp_answer"
    assert any("dp_icl_spend" in s for s in recorder.seen)
    blob = " ".join(recorder.seen) + repr(chat) + repr(retriever) + str(chat.model_dump()) + str(retriever.model_dump())
    assert CANARY not in blob
