"""The bad-input matrix over the framework adapters and the ``dp-icl`` CLI (issue 7; the core's is in
``test_bad_input_matrix.py``).

Rows: the public entry points: LangChain ``DPICLExampleSelector`` (construction, ``select_examples``,
``add_example``/``add_public_example``), ``DPICLRetriever``, ``ChatDPICL`` and ``DPICLLLM``
(invoke / stream / batch); LlamaIndex ``DPICLRetriever`` and ``DPICL`` (complete / stream / chat / async);
every ``dp-icl`` subcommand, run in-process through ``main(argv)``.

Columns (the kind of bad input): empty; huge; NaN/inf; wrong type; wrong shape; unicode edge cases (only
zero-width characters, RTL marks, NUL, lone surrogates); zero/negative privacy and size parameters;
exhausted budget; missing, empty, binary, corrupt or misplaced files.

Each cell ends in one of:

- a typed error, a ``DPICLError`` (``ConfigurationError`` for bad input, ``BudgetExhaustedError`` for a
  refused charge);
- ``pydantic.ValidationError`` where the framework validates before our code runs (the contract of pydantic
  models: LangChain components' constructors, whose ``model_post_init`` errors pydantic wraps, and
  LlamaIndex's instrumentation events, which validate a ``retrieve`` query's type);
- a documented result (the ``test_documented_*`` tests, each citing the docstring that promises it);
- for the CLI: a non-zero exit (2 bad input, 3 refused, 1 unexpected), exactly one ``dp-icl...: error``
  line on stderr and no traceback anywhere.

and in every cell: nothing charged (ledger rows and the per-record filter unchanged), nothing released
(no streamed piece, no output file). ``MESSAGES``/``CLI_MESSAGES`` pin each case's reason, so that a case
cannot pass because an unrelated check failed first.

Cases that found a bug (an untyped crash, a hang, a charge before failing), fixed in the adapter or CLI:
selector ``fields``/``embed``/``save_to``/``synthesizer``/``input_variables``/``add_public_example`` of the
wrong type or shape; retriever queries with a lone surrogate or too long for the model (charged, then
failed); ``stop`` not a list (split into characters, or ``TypeError``); ``max_tokens`` NaN/inf/str/float
(``ValueError``/``OverflowError``, or silently truncated) and ≤ 0 at construction; a LangChain batch with one
bad input (the good ones charged, then discarded); a LlamaIndex chat of dicts; ``--grid 1e-300``
(would not end), ``audit --samples 0`` (ran the full audit), ``--shots -1``, NUL characters and surrogates
in arguments, outputs that are folders or files (tracebacks; ``synthesize`` charged before failing), and an
accountant overflow at σ = 1e300 (traceback; now a valid tiny ε, fixed in the RDP accountant).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

import langchain_dp_icl as lc
import llama_index.llms.dp_icl as li
import llama_index.retrievers.dp_icl as li_ret
from adapter_fixtures import backend, dataset, demo_set
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.schema import QueryBundle
from pydantic import ValidationError
from tests_support import write_ginc_csv

from dp_icl_plugin import (
    BudgetExhaustedError,
    BudgetManager,
    ConfigurationError,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PureDPEvent,
    ShareExhaustedError,
    TangSynthesizer,
)
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.cli import main
from dp_icl_plugin.decoding.decoders import MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

NAN, INF = math.nan, math.inf
HUGE_TEXT = "the cat sat " * 4000  # far beyond the tiny model's 1024 positions
WORDS = ["a", "b", "c", "pos", "neg", "Text:", "Label:", "<eos>"]


def _embed(batch: list[str]) -> np.ndarray:
    return np.array([[t.count("cat") + 1.0, t.count("mat"), t.count("number") * 0.5] for t in batch])


class World:
    """Fresh components over one SQLite ledger, and a record of what was charged and released."""

    def __init__(self, tmp: Path) -> None:
        self.ledger = BudgetManager(PrivacyBudget(1e4, 1e-3), ledger=tmp / "ledger.db")
        self.decoder = MozoDecoder(
            dataset(), backend=backend(), budget=self.ledger, n_queries=100, max_tokens=4, beta=0.5, top_k=20
        )
        # (5, 1e-9) per record: the replace-one ledger holds (10, 2.2e-5) for it
        index = PrivateIndex(budget=IndividualBudget(epsilon=5.0, delta=1e-9), embedder=_embed)
        index.add([f"the cat sat on the mat number {i % 4}" for i in range(40)], answers=["the cat"] * 40)
        self.index = index
        self.core = PrivateKNN(
            index,
            budget=self.ledger,
            backend=backend(),
            config=KNNConfig(k=8, shards=4, min_similarity=0.5, uses=2, keywords=3, max_answer_tokens=4),
        )
        rng = np.random.default_rng(0)
        self.lc_chat = lc.ChatDPICL(decoder=self.decoder, rng=rng)
        self.lc_llm = lc.DPICLLLM(decoder=self.decoder, rng=rng)
        self.lc_retriever = lc.DPICLRetriever(knn=self.core, rng=rng, mode="keywords")
        self.li_llm = li.DPICL(self.decoder, rng=rng)
        self.li_retriever = li_ret.DPICLRetriever(self.core, rng=rng, mode="keywords")
        self.released: list[Any] = []

    def charged(self) -> tuple[int, float, int, float]:
        ids, spent, _ = self.index.filter.all_spent()
        return len(self.ledger.history()), self.ledger.spent().epsilon, len(ids), float(np.sum(spent))

    def drain(self, pieces: Iterable[Any]) -> None:
        """Consume a stream, keeping every piece it releases (there must be none)."""
        for piece in pieces:
            self.released.append(piece)

    def exhaust(self) -> World:
        """Spend all but a sliver of the ledger: any further answer is refused."""
        lo, hi = 0.0, self.ledger.remaining().epsilon * (1 + 1e-3)  # composition is not additive: bisect
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.ledger.would_fit(PureDPEvent(mid, neighbouring="replace_one")) else (lo, mid)
        self.ledger.spend(PureDPEvent(lo, neighbouring="replace_one"), label="fill")
        return self


def _selector(w: World, **kwargs: Any) -> lc.DPICLExampleSelector:
    return lc.DPICLExampleSelector(demo_set(), **kwargs)


def _lazy(w: World, **kwargs: Any) -> lc.DPICLExampleSelector:
    data = PrivateDataset(
        [PrivateRecord(f"a b {'abc'[i % 3]}", ("pos", "neg")[i % 2]) for i in range(40)], public_label_counts="observed"
    )
    method = TangSynthesizer(
        epsilon=1.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=1, shots_per_label=1, top_k=3
    )
    settings = {
        "synthesizer": method,
        "dataset": data,
        "backend": FakeBackend(WORDS, eos_token="<eos>"),
        "budget": w.ledger,
        "rng": np.random.default_rng(0),
        **kwargs,
    }
    return lc.DPICLExampleSelector(**settings)


def _vectors(shape: tuple[int, ...] | None = None, fill: float = 1.0) -> Callable[[list[str]], Any]:
    return lambda texts: np.full(shape or (len(texts), 3), fill)


def _fake_embeddings() -> Any:
    from langchain_core.embeddings import DeterministicFakeEmbedding

    return DeterministicFakeEmbedding(size=8)


def _user(text: Any) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


CE, BE, VE = ConfigurationError, BudgetExhaustedError, ValidationError

# name -> (the error expected, the call). VE marks the frameworks' own pydantic validation (see the docstring).
ADAPTER_CASES: dict[str, tuple[type[Exception], Callable[[World], Any]]] = {
    # LangChain few-shot selector: construction
    "selector fields not a mapping": (CE, lambda w: _selector(w, fields=["input"])),
    "selector fields a string": (CE, lambda w: _selector(w, fields="input")),
    "selector fields empty": (CE, lambda w: _selector(w, fields={})),
    "selector fields naming a private attribute": (CE, lambda w: _selector(w, fields={"input": "records"})),
    "selector k = 0": (CE, lambda w: _selector(w, k=0)),
    "selector k = NaN": (CE, lambda w: _selector(w, k=NAN)),
    "selector k = True": (CE, lambda w: _selector(w, k=True)),
    "selector demos a file name": (CE, lambda w: lc.DPICLExampleSelector("demos.jsonl")),
    "selector embeddings a number": (CE, lambda w: _selector(w, embeddings=42)),
    "selector mmr without embeddings": (CE, lambda w: _selector(w, selection="mmr")),
    "selector unknown selection": (CE, lambda w: _selector(w, embeddings=_fake_embeddings(), selection="best")),
    "selector fetch_k = 0": (CE, lambda w: _selector(w, embeddings=_fake_embeddings(), fetch_k=0)),
    "selector save_to a folder": (CE, lambda w: _lazy(w, save_to=str(Path.cwd()))),
    "selector lazy without budget": (CE, lambda w: _lazy(w, budget=None)),
    "selector lazy rng not a Generator": (CE, lambda w: _lazy(w, rng=0)),
    "selector lazy synthesizer a string": (CE, lambda w: _lazy(w, synthesizer="tang")),
    # ... select_examples and add_example
    "select input variables None": (CE, lambda w: _selector(w, label_key="y").select_examples(None)),
    "select input variables a list": (CE, lambda w: _selector(w, label_key="y").select_examples(["y"])),
    "select query not a string": (
        CE,
        lambda w: _selector(w, embeddings=_fake_embeddings()).select_examples({"input": 5}),
    ),
    "select lazy synthesis, exhausted budget": (BE, lambda w: _lazy(w).select_examples({"input": "q"})),
    "add_example (not DP)": (NotImplementedError, lambda w: _selector(w).add_example({"input": "x", "output": "y"})),
    "add_public_example a list": (CE, lambda w: _selector(w).add_public_example(["input", "output"])),
    "add_public_example None": (CE, lambda w: _selector(w).add_public_example(None)),
    "add_public_example non-string value": (CE, lambda w: _selector(w).add_public_example({"input": 1, "output": "y"})),
    # LangChain retriever
    "lc retriever construction k = 0": (VE, lambda w: lc.DPICLRetriever(knn=w.core, rng=np.random.default_rng(0), k=0)),
    "lc retriever construction not a core": (
        VE,
        lambda w: lc.DPICLRetriever(knn="index", rng=np.random.default_rng(0)),
    ),
    "lc retriever construction unknown mode": (
        VE,
        lambda w: lc.DPICLRetriever(retriever=w.core, rng=np.random.default_rng(0), mode="records"),
    ),
    "lc retriever empty query": (CE, lambda w: w.lc_retriever.invoke("")),
    "lc retriever zero-width query": (CE, lambda w: w.lc_retriever.invoke("\u200b\u200c\u200d\ufeff")),
    "lc retriever RTL marks only": (CE, lambda w: w.lc_retriever.invoke("\u200f\u202e\u2067")),
    "lc retriever lone surrogate only": (CE, lambda w: w.lc_retriever.invoke("\ud800")),
    "lc retriever text with a lone surrogate": (CE, lambda w: w.lc_retriever.invoke("where did the cat \udfff sit")),
    "lc retriever huge query": (CE, lambda w: w.lc_retriever.invoke(HUGE_TEXT)),
    "lc retriever query an int": (CE, lambda w: w.lc_retriever.invoke(123)),
    "lc retriever query bytes": (CE, lambda w: w.lc_retriever.invoke(b"the cat")),
    "lc retriever query None": (CE, lambda w: w.lc_retriever.invoke(None)),
    "lc retriever k = 0": (CE, lambda w: w.lc_retriever.invoke("the cat", k=0)),
    "lc retriever k = −1": (CE, lambda w: w.lc_retriever.invoke("the cat", k=-1)),
    "lc retriever k = NaN": (CE, lambda w: w.lc_retriever.invoke("the cat", k=NAN)),
    "lc retriever k a string": (CE, lambda w: w.lc_retriever.invoke("the cat", k="3")),
    # LangChain chat model and LLM
    "lc chat construction max_tokens = 0": (
        VE,
        lambda w: lc.ChatDPICL(decoder=w.decoder, rng=np.random.default_rng(0), max_tokens=0),
    ),
    "lc chat construction not a decoder": (VE, lambda w: lc.ChatDPICL(decoder="gpt2", rng=np.random.default_rng(0))),
    "lc llm construction stop a string": (
        VE,
        lambda w: lc.DPICLLLM(decoder=w.decoder, rng=np.random.default_rng(0), stop="\n"),
    ),
    "lc llm empty prompt": (CE, lambda w: w.lc_llm.invoke("")),
    "lc llm zero-width prompt": (CE, lambda w: w.lc_llm.invoke("\u200b\u2060")),
    "lc llm lone surrogate": (CE, lambda w: w.lc_llm.invoke("hello \ud83d")),
    "lc llm stop a string": (CE, lambda w: w.lc_llm.invoke("Hello", stop="ab")),
    "lc llm stop an int": (CE, lambda w: w.lc_llm.invoke("Hello", stop=5)),
    "lc llm stop with an empty string": (CE, lambda w: w.lc_llm.invoke("Hello", stop=[""])),
    "lc llm max_tokens = 0": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=0)),
    "lc llm max_tokens = −1": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=-1)),
    "lc llm max_tokens = NaN": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=NAN)),
    "lc llm max_tokens = inf": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=INF)),
    "lc llm max_tokens a string": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens="3")),
    "lc llm max_tokens a float": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=2.5)),
    "lc llm max_tokens True": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=True)),
    "lc llm exhausted budget": (BE, lambda w: w.lc_llm.invoke("Hello")),
    "lc llm stream empty prompt": (CE, lambda w: w.drain(w.lc_llm.stream(""))),
    "lc llm stream exhausted budget": (BE, lambda w: w.drain(w.lc_llm.stream("Hello"))),
    "lc llm batch with one empty prompt": (CE, lambda w: w.lc_llm.batch(["Hello", "there", ""])),
    "lc llm batch exhausted budget": (BE, lambda w: w.lc_llm.batch(["Hello", "there"])),
    "lc chat ends in an AI message": (CE, lambda w: w.lc_chat.invoke([HumanMessage("hi"), AIMessage("hello")])),
    "lc chat only a system message": (CE, lambda w: w.lc_chat.invoke([SystemMessage("be brief")])),
    "lc chat no messages": (CE, lambda w: w.lc_chat.invoke([])),
    "lc chat blank user message": (CE, lambda w: w.lc_chat.invoke([HumanMessage("\u200e \u3000")])),
    "lc chat NUL-only user message": (CE, lambda w: w.lc_chat.invoke([HumanMessage("\x00\x00")])),
    "lc chat non-text content": (
        CE,
        lambda w: w.lc_chat.invoke([HumanMessage(content=[{"type": "image", "url": "x"}])]),
    ),
    "lc chat lone surrogate": (CE, lambda w: w.lc_chat.invoke([HumanMessage("hi \udc80")])),
    "lc chat stop a string": (CE, lambda w: w.lc_chat.invoke("Hello", stop="ab")),
    "lc chat max_tokens = NaN": (CE, lambda w: w.lc_chat.invoke("Hello", max_tokens=NAN)),
    "lc chat max_tokens = 0": (CE, lambda w: w.lc_chat.invoke("Hello", max_tokens=0)),
    "lc chat exhausted budget": (BE, lambda w: w.lc_chat.invoke("Hello")),
    "lc chat stream ends in an AI message": (CE, lambda w: w.drain(w.lc_chat.stream([AIMessage("x")]))),
    "lc chat stream exhausted budget": (BE, lambda w: w.drain(w.lc_chat.stream("Hello"))),
    "lc chat batch with one bad chat": (CE, lambda w: w.lc_chat.batch(["Hello", [AIMessage("x")]])),
    "lc chat abatch with one empty prompt": (CE, lambda w: asyncio.run(w.lc_chat.abatch(["Hello", ""]))),
    # LlamaIndex retriever
    "li retriever construction not a core": (
        CE,
        lambda w: li_ret.DPICLRetriever("index", rng=np.random.default_rng(0)),
    ),
    "li retriever construction rng a seed": (CE, lambda w: li_ret.DPICLRetriever(w.core, rng=0)),
    "li retriever construction unknown mode": (
        CE,
        lambda w: li_ret.DPICLRetriever(w.core, rng=np.random.default_rng(0), mode="records"),
    ),
    "li retriever empty query": (CE, lambda w: w.li_retriever.retrieve("")),
    "li retriever zero-width query": (CE, lambda w: w.li_retriever.retrieve("\u200b")),
    "li retriever RTL marks only": (CE, lambda w: w.li_retriever.retrieve(QueryBundle("\u202b\u200f"))),
    "li retriever text with a lone surrogate": (CE, lambda w: w.li_retriever.retrieve("the cat \ud800")),
    "li retriever huge query": (CE, lambda w: w.li_retriever.retrieve(HUGE_TEXT)),
    "li retriever query an int": (VE, lambda w: w.li_retriever.retrieve(123)),
    "li retriever query None": (VE, lambda w: w.li_retriever.retrieve(None)),
    "li retriever keywords = 0": (
        CE,
        lambda w: li_ret.DPICLRetriever(w.core, rng=np.random.default_rng(0), similarity_top_k=0).retrieve("the cat"),
    ),
    "li retriever keywords a string": (
        CE,
        lambda w: li_ret.DPICLRetriever(w.core, rng=np.random.default_rng(0), similarity_top_k="2").retrieve("the cat"),
    ),
    "li retriever aretrieve empty": (CE, lambda w: asyncio.run(w.li_retriever.aretrieve(""))),
    # LlamaIndex LLM
    "li llm construction not a decoder": (CE, lambda w: li.DPICL("gpt2", rng=np.random.default_rng(0))),
    "li llm construction max_tokens = 0": (
        CE,
        lambda w: li.DPICL(w.decoder, rng=np.random.default_rng(0), max_tokens=0),
    ),
    "li llm construction max_tokens = −3": (
        CE,
        lambda w: li.DPICL(w.decoder, rng=np.random.default_rng(0), max_tokens=-3),
    ),
    "li llm construction max_tokens a word": (
        VE,
        lambda w: li.DPICL(w.decoder, rng=np.random.default_rng(0), max_tokens="many"),
    ),
    "li llm complete empty": (CE, lambda w: w.li_llm.complete("")),
    "li llm complete zero-width": (CE, lambda w: w.li_llm.complete("\u200b\u200d")),
    "li llm complete an int": (CE, lambda w: w.li_llm.complete(123)),
    "li llm complete lone surrogate": (CE, lambda w: w.li_llm.complete("hi \ud800")),
    "li llm complete stop a string": (CE, lambda w: w.li_llm.complete("Hello", stop="x")),
    "li llm complete stop an int": (CE, lambda w: w.li_llm.complete("Hello", stop=3)),
    "li llm complete exhausted budget": (BE, lambda w: w.li_llm.complete("Hello")),
    "li llm acomplete empty": (CE, lambda w: asyncio.run(w.li_llm.acomplete(""))),
    "li llm stream empty": (CE, lambda w: w.drain(w.li_llm.stream_complete(""))),
    "li llm stream exhausted budget": (BE, lambda w: w.drain(w.li_llm.stream_complete("Hello"))),
    "li llm chat ends with the assistant": (
        CE,
        lambda w: w.li_llm.chat([*_user("hi"), ChatMessage(role="assistant", content="hello")]),
    ),
    "li llm chat no messages": (CE, lambda w: w.li_llm.chat([])),
    "li llm chat of dicts": (CE, lambda w: w.li_llm.chat([{"role": "user", "content": "hi"}])),
    "li llm chat a string": (VE, lambda w: w.li_llm.chat("hi")),
    "li llm chat empty content": (CE, lambda w: w.li_llm.chat(_user(None))),
    "li llm chat function role": (CE, lambda w: w.li_llm.chat([ChatMessage(role="function", content="hi")])),
    "li llm chat lone surrogate": (CE, lambda w: w.li_llm.chat(_user("hi \udfff"))),
    "li llm chat exhausted budget": (BE, lambda w: w.li_llm.chat(_user("Hello"))),
    "li llm achat ends with the assistant": (
        CE,
        lambda w: asyncio.run(w.li_llm.achat([ChatMessage(role="assistant", content="x")])),
    ),
    "li llm stream chat exhausted budget": (BE, lambda w: w.drain(w.li_llm.stream_chat(_user("Hi")))),
    # settings a DP answer cannot honour: refused, not ignored or capped (issue 29)
    "lc chat construction temperature": (VE, lambda w: lc.ChatDPICL(decoder=w.decoder, temperature=0.0, seed=0)),
    "lc chat temperature per call": (CE, lambda w: w.lc_chat.invoke("Hello", temperature=0.2)),
    "lc chat top_p per call": (CE, lambda w: w.lc_chat.invoke("Hello", top_p=0.9)),
    "lc chat max_tokens above the share": (CE, lambda w: w.lc_chat.invoke("Hello", max_tokens=10**12)),
    "lc chat construction max_tokens above the share": (
        VE,
        lambda w: lc.ChatDPICL(decoder=w.decoder, seed=0, max_tokens=5),
    ),
    "lc chat stream temperature": (CE, lambda w: w.drain(w.lc_chat.stream("Hello", temperature=0.0))),
    "lc llm temperature per call": (CE, lambda w: w.lc_llm.invoke("Hello", temperature=0.0)),
    "lc llm max_tokens above the share": (CE, lambda w: w.lc_llm.invoke("Hello", max_tokens=10**12)),
    "li llm complete temperature": (CE, lambda w: w.li_llm.complete("Hello", temperature=0.0)),
    "li llm chat seed": (CE, lambda w: w.li_llm.chat(_user("Hello"), seed=3)),
    "li llm max_tokens above the share": (CE, lambda w: w.li_llm.complete("Hello", max_tokens=10**12)),
    "li llm construction max_tokens above the share": (CE, lambda w: li.DPICL(w.decoder, seed=0, max_tokens=5)),
    "lc from_model_id temperature": (
        CE,
        lambda w: lc.ChatDPICL.from_model_id(
            "no-such-model", dataset(), budget=w.ledger, epsilon=1.0, n_queries=2, temperature=0.2
        ),
    ),
    "li from_model_id unknown setting": (
        CE,
        lambda w: li.DPICL.from_model_id("no-such-model", dataset(), budget=w.ledger, epsilon=1.0, n_queries=2, topk=5),
    ),
}

# What each error says: a case passes only for its own reason, not because an earlier check failed.
MESSAGES: dict[str, str] = {
    "selector fields not a mapping": "fields must be a mapping",
    "selector fields a string": "fields must be a mapping",
    "selector fields empty": "fields must map",
    "selector fields naming a private attribute": "fields must map",
    "selector k = 0": "k must be a positive integer",
    "selector k = NaN": "k must be a positive integer",
    "selector k = True": "k must be a positive integer",
    "selector demos a file name": "demos must be a DemoSet",
    "selector embeddings a number": "embeddings must be a LangChain Embeddings, a SentenceTransformer",
    "selector mmr without embeddings": "needs embeddings",
    "selector unknown selection": "selection must be",
    "selector fetch_k = 0": "fetch_k must be a positive integer",
    "selector save_to a folder": "save_to must be a file path",
    "selector lazy without budget": "needs budget=BudgetManager",
    "selector lazy rng not a Generator": "rng must be a numpy.random.Generator",
    "selector lazy synthesizer a string": "synthesizer must be",
    "select input variables None": "input_variables must be a mapping",
    "select input variables a list": "input_variables must be a mapping",
    "select query not a string": "similarity selection needs",
    "select lazy synthesis, exhausted budget": "charge refused",
    "add_example (not DP)": "not differentially private",
    "add_public_example a list": "a public example needs",
    "add_public_example None": "a public example needs",
    "add_public_example non-string value": "a public example needs",
    "lc retriever construction k = 0": "k must be a positive integer",
    "lc retriever construction not a core": "knn must be a dp_icl_plugin PrivateKNN",
    "lc retriever construction unknown mode": "Input should be 'experts', 'keywords' or 'answer'",
    "lc retriever empty query": "query must be a non-empty string",
    "lc retriever zero-width query": "query must be a non-empty string",
    "lc retriever RTL marks only": "query must be a non-empty string",
    "lc retriever lone surrogate only": "query must be a non-empty string",
    "lc retriever text with a lone surrogate": "rejected a prompt",
    "lc retriever huge query": "the query is too long",
    "lc retriever query an int": "query must be a non-empty string",
    "lc retriever query bytes": "query must be a non-empty string",
    "lc retriever query None": "query must be a non-empty string",
    "lc retriever k = 0": "keywords must be at least 1",
    "lc retriever k = −1": "keywords must be at least 1",
    "lc retriever k = NaN": "keywords must be an integer",
    "lc retriever k a string": "keywords must be an integer",
    "lc chat construction max_tokens = 0": "max_tokens must be at least 1",
    "lc chat construction not a decoder": "decoder must be a dp_icl_plugin Decoder",
    "lc llm construction stop a string": "Input should be a valid list",
    "lc llm empty prompt": "the prompt is empty",
    "lc llm zero-width prompt": "the prompt is empty",
    "lc llm lone surrogate": "rejected a prompt",
    "lc llm stop a string": "stop must be a list",
    "lc llm stop an int": "stop must be a list",
    "lc llm stop with an empty string": "stop must be a list",
    "lc llm max_tokens = 0": "max_tokens must be at least 1",
    "lc llm max_tokens = −1": "max_tokens must be at least 1",
    "lc llm max_tokens = NaN": "max_tokens must be an integer",
    "lc llm max_tokens = inf": "max_tokens must be an integer",
    "lc llm max_tokens a string": "max_tokens must be an integer",
    "lc llm max_tokens a float": "max_tokens must be an integer",
    "lc llm max_tokens True": "max_tokens must be an integer",
    "lc llm exhausted budget": "charge refused",
    "lc llm stream empty prompt": "the prompt is empty",
    "lc llm stream exhausted budget": "charge refused",
    "lc llm batch with one empty prompt": "the prompt is empty",
    "lc llm batch exhausted budget": "charge refused",
    "lc chat ends in an AI message": "the last message of a chat must be the user's",
    "lc chat only a system message": "the last message of a chat must be the user's",
    "lc chat no messages": "a query is a non-empty text",
    "lc chat blank user message": "the last user message is empty",
    "lc chat NUL-only user message": "the last user message is empty",
    "lc chat non-text content": "only text message content",
    "lc chat lone surrogate": "rejected a prompt",
    "lc chat stop a string": "stop must be a list",
    "lc chat max_tokens = NaN": "max_tokens must be an integer",
    "lc chat max_tokens = 0": "max_tokens must be at least 1",
    "lc chat exhausted budget": "charge refused",
    "lc chat stream ends in an AI message": "the last message of a chat must be the user's",
    "lc chat stream exhausted budget": "charge refused",
    "lc chat batch with one bad chat": "the last message of a chat must be the user's",
    "lc chat abatch with one empty prompt": "the last user message is empty",
    "li retriever construction not a core": "knn must be a dp_icl_plugin PrivateKNN",
    "li retriever construction rng a seed": "rng must be a numpy.random.Generator",
    "li retriever construction unknown mode": "mode must be 'experts', 'answer' or 'keywords'",
    "li retriever empty query": "query must be a non-empty string",
    "li retriever zero-width query": "query must be a non-empty string",
    "li retriever RTL marks only": "query must be a non-empty string",
    "li retriever text with a lone surrogate": "rejected a prompt",
    "li retriever huge query": "the query is too long",
    "li retriever query an int": "Input should be a valid string",
    "li retriever query None": "Input should be a valid string",
    "li retriever keywords = 0": "similarity_top_k must be a positive integer",
    "li retriever keywords a string": "similarity_top_k must be a positive integer",
    "li retriever aretrieve empty": "query must be a non-empty string",
    "li llm construction not a decoder": "decoder must be a dp_icl_plugin Decoder",
    "li llm construction max_tokens = 0": "max_tokens must be at least 1",
    "li llm construction max_tokens = −3": "max_tokens must be at least 1",
    "li llm construction max_tokens a word": "Input should be a valid integer",
    "li llm complete empty": "the prompt is empty",
    "li llm complete zero-width": "the prompt is empty",
    "li llm complete an int": "prompt must be a string",
    "li llm complete lone surrogate": "rejected a prompt",
    "li llm complete stop a string": "stop must be a list",
    "li llm complete stop an int": "stop must be a list",
    "li llm complete exhausted budget": "charge refused",
    "li llm acomplete empty": "the prompt is empty",
    "li llm stream empty": "the prompt is empty",
    "li llm stream exhausted budget": "charge refused",
    "li llm chat ends with the assistant": "the last message of a chat must be the user's",
    "li llm chat no messages": "a query is a non-empty text",
    "li llm chat of dicts": "messages must be a list of llama_index ChatMessage",
    "li llm chat a string": "Input should be a valid list",
    "li llm chat empty content": "the last user message is empty",
    "li llm chat function role": "needs a role in",
    "li llm chat lone surrogate": "rejected a prompt",
    "li llm chat exhausted budget": "charge refused",
    "li llm achat ends with the assistant": "the last message of a chat must be the user's",
    "li llm stream chat exhausted budget": "charge refused",
    "lc chat construction temperature": "temperature cannot be set on a DP answer",
    "lc chat temperature per call": "temperature cannot be set on a DP answer",
    "lc chat top_p per call": "top_p: not a setting a DP answer honours",
    "lc chat max_tokens above the share": "above the 4 tokens this decoder's budget share covers",
    "lc chat construction max_tokens above the share": "above the 4 tokens this decoder's budget share covers",
    "lc chat stream temperature": "temperature cannot be set on a DP answer",
    "lc llm temperature per call": "temperature cannot be set on a DP answer",
    "lc llm max_tokens above the share": "above the 4 tokens this decoder's budget share covers",
    "li llm complete temperature": "temperature cannot be set on a DP answer",
    "li llm chat seed": "seed: not a setting a DP answer honours",
    "li llm max_tokens above the share": "above the 4 tokens this decoder's budget share covers",
    "li llm construction max_tokens above the share": "above the 4 tokens this decoder's budget share covers",
    "lc from_model_id temperature": "temperature cannot be set on a DP answer",
    "li from_model_id unknown setting": "mozo decoding takes no setting topk",
}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weak_keywords_allowed: None) -> World:
    monkeypatch.chdir(tmp_path)
    return World(tmp_path)


@pytest.mark.parametrize("name", list(ADAPTER_CASES))
def test_bad_adapter_input_ends_in_a_typed_error_with_nothing_charged(world: World, name: str) -> None:
    expected, call = ADAPTER_CASES[name]
    if "exhausted" in name:
        world.exhaust()
    before = world.charged()
    with pytest.raises(expected, match=re.escape(MESSAGES[name])):
        call(world)
    assert world.charged() == before, "a bad input must not charge anything"
    assert world.released == [], "nothing may be released without a charge"


# ------------------------------------------------------------------------------------------ documented results


def test_documented_results_charge_exactly_once(world: World) -> None:
    """Inputs that are legal but extreme: a defined result, one charge per answer, none for bad batch items."""
    w = world
    # max_tokens at the decoder's share: one answer charged for it.
    before = len(w.ledger.history())
    w.lc_llm.invoke("Hello", max_tokens=4)
    assert len(w.ledger.history()) == before + 1 and w.ledger.history()[-1].event == w.decoder.answer_event(4)
    assert li.DPICL(w.decoder, rng=np.random.default_rng(0), max_tokens=4).metadata.num_output == 4
    # a NUL or an RTL mark inside visible text is text: answered and charged once.
    for prompt in ("Hello\x00there", "\u202eHello"):
        before = len(w.ledger.history())
        assert isinstance(w.lc_llm.invoke(prompt), str)
        assert len(w.ledger.history()) == before + 1
    # a prompt longer than the model keeps its most recent tokens (decoding module docstring): charged once.
    before = len(w.ledger.history())
    assert isinstance(w.li_llm.complete("Hello " * 1500).text, str)
    assert len(w.ledger.history()) == before + 1
    # return_exceptions: each input stands alone; the bad one is refused uncharged, the good one answered.
    before = len(w.ledger.history())
    out = w.lc_chat.batch(["Hello", ""], return_exceptions=True)
    assert isinstance(out[0], AIMessage) and isinstance(out[1], ConfigurationError)
    assert len(w.ledger.history()) == before + 1
    # ... but a BaseLLM batch is one generate call: refused as a whole, nothing charged.
    before = len(w.ledger.history())
    out = w.lc_llm.batch(["Hello", ""], return_exceptions=True)
    assert all(isinstance(o, ConfigurationError) for o in out)
    assert len(w.ledger.history()) == before


def test_documented_retrieval_results(world: World) -> None:
    """k above what can be released gives fewer keywords (never padded); records whose filter is spent drop
    out, and the release falls back to no keywords without charging them again."""
    w = world
    rows = len(w.ledger.history())
    docs = w.lc_retriever.invoke("where did the cat sit?", k=10**9)  # first use of every matching record
    assert all(d.metadata["kind"] == "dp_keyword" for d in docs) and len(w.ledger.history()) == rows + 1
    w.li_retriever.retrieve("where did the cat sit?")  # second use: uses=2, each record can pay for two
    rows, epsilon, units, spent = w.charged()
    assert units == 40
    nodes = w.li_retriever.retrieve("where did the cat sit?")
    assert nodes == []  # no active record left: no keyword is released
    assert w.charged() == (rows + 1, epsilon, units, spent)  # recorded, covered by the filter: nobody paid again


def test_selector_documented_results(world: World) -> None:
    """An unknown label serves no demonstration; a query of invisible text is ranked too; nothing is ever charged."""
    before = world.charged()
    selector = _selector(world, label_key="y")
    assert selector.select_examples({"y": "no such label"}) == []
    assert selector.select_examples({"y": ["pos"]}) == []  # compared, never hashed
    assert len(_selector(world, embeddings=_fake_embeddings()).select_examples({"input": "\u200b"})) == 4
    assert world.charged() == before


# ------------------------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The inputs of the CLI cases; ledgers are copied per case from these templates."""
    root = tmp_path_factory.mktemp("cli")
    f = {"root": root, "ginc": write_ginc_csv(root / "ginc.csv"), "folder": root / "a folder"}
    f["folder"].mkdir()
    for name, content in {
        "empty.csv": b"",
        "binary.csv": b"\xff\xfe\x00\x01garbage\x00\n",
        "torn.jsonl": b'{"text": "a", "label": ',
        "array.jsonl": b'["a", "pos"]\n',
        "quote.csv": b'text,label\n"never closed,pos\n',
        "header only.csv": b"text,label\n",
        "not a ledger.db": b"\x00\xff" * 512,
        "empty.db": b"",
        "inputs.txt": b"\xff\xfe not utf-8",
    }.items():
        (root / name).write_bytes(content)
    for name, spend in (("ledger.db", None), ("spent.db", 4.99)):
        manager = BudgetManager(PrivacyBudget(5.0, 1e-2), ledger=root / name)
        if spend:
            manager.spend(PureDPEvent(spend, neighbouring="replace_one"), label="earlier work")
        manager.close()
    (root / "torn.db").write_bytes((root / "ledger.db").read_bytes()[:300])
    return f


SYN = [
    "synthesize",
    "--method",
    "tang",
    "--text-column",
    "text",
    "--label-column",
    "label",
    "--model",
    "ginc",
    "--template",
    "ginc",
    "--max-tokens",
    "2",
    "--n-prompts",
    "2",
    "--records-per-prompt",
    "2",
    "--shots-per-label",
    "1",
    "--top-k",
    "5",
    "--seed",
    "0",
    "--public-label-counts",
    "observed",
]
SG = ["calibrate", "subsampled-gaussian", "--delta", "1e-5", "--sampling-rate", "0.01", "--steps", "10"]
EPS = ["epsilon", "subsampled-gaussian", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"]
CB = ["epsilon", "clip-blend", "--clip", "10", "--subset-size", "5", "--steps", "10", "--delta", "1e-5"]
SPEND = ["budget", "spend", "--ledger", "ledger.db", "--label", "x"]

# name -> (argv, exit status). Paths are relative to a per-case copy of the ``files`` folder.
CLI_CASES: dict[str, tuple[list[str], int]] = {
    # privacy parameters
    "init ε = 0": (["budget", "init", "--ledger", "new.db", "--epsilon", "0", "--delta", "1e-5"], 2),
    "init ε = −1": (["budget", "init", "--ledger", "new.db", "--epsilon", "-1", "--delta", "1e-5"], 2),
    "init ε = 1e400 (inf)": (["budget", "init", "--ledger", "new.db", "--epsilon", "1e400", "--delta", "1e-5"], 2),
    "init δ = NaN": (["budget", "init", "--ledger", "new.db", "--epsilon", "1", "--delta", "nan"], 2),
    "init ε not a number": (["budget", "init", "--ledger", "new.db", "--epsilon", "one", "--delta", "1e-5"], 2),
    "spend ε = −inf": ([*SPEND, "--pure-epsilon=-inf"], 2),
    "spend ε = NaN": ([*SPEND, "--pure-epsilon", "NaN"], 2),
    "spend ε = 1e308 (refused)": ([*SPEND, "--pure-epsilon", "1e308"], 3),
    "spend δ = 0": ([*SPEND, "--pure-epsilon", "0.1", "--delta", "0"], 2),
    "spend on an exhausted ledger": (
        ["budget", "spend", "--ledger", "spent.db", "--label", "x", "--pure-epsilon", "0.1"],
        3,
    ),
    "calibrate ε = NaN": ([*SG, "--epsilon", "nan"], 2),
    "calibrate steps = 0": ([*SG[:-1], "0", "--epsilon", "1"], 2),
    "calibrate steps = 1.5": ([*SG[:-1], "1.5", "--epsilon", "1"], 2),
    "calibrate grid = 0": ([*SG, "--epsilon", "1", "--grid", "0"], 2),
    "calibrate grid = 1e-300 (would not end)": ([*SG, "--epsilon", "1", "--grid", "1e-300"], 2),
    "calibrate max = inf": ([*SG, "--epsilon", "1", "--max", "inf"], 2),
    "calibrate adadpsyn grid = 1e-300": (
        [
            "calibrate",
            "adadpsyn",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.01",
            "--steps",
            "10",
            "--t-hat",
            "1",
            "--sigma0",
            "10",
            "--sigma2",
            "3",
            "--grid",
            "1e-300",
        ],
        2,
    ),
    "calibrate mozo order = inf": (
        [
            "calibrate",
            "mozo",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.01",
            "--steps",
            "10",
            "--order",
            "inf",
        ],
        2,
    ),
    "epsilon σ = −1": ([*EPS, "--noise-multiplier", "-1"], 2),
    "epsilon clip-blend τ = 0": ([*CB, "--temperature", "0"], 2),
    "epsilon clip-blend unknown relation": ([*CB, "--temperature", "1", "--neighbouring", "swap"], 2),
    "audit samples = 0 (not the full audit)": (["audit", "--samples", "0"], 2),
    "audit out is a file": (["audit", "--samples", "10", "--out", "ginc.csv"], 2),
    "bench eval shots = −1": (["bench", "ginc-eval", "--shots", "-1", "--prompts", "1"], 2),
    "bench eval prompts = 0": (["bench", "ginc-eval", "--prompts", "0", "--shots", "0", "--k", "3"], 2),
    "bench eval model folder empty": (["bench", "ginc-eval", "--model", "a folder", "--prompts", "1"], 2),
    "bench train out is a file": (
        ["bench", "ginc-train", "--out", "ginc.csv", "--steps", "1", "--warmup-steps", "0"],
        2,
    ),
    "unknown subcommand": (["spend"], 2),
    # files
    "show a missing ledger": (["budget", "show", "--ledger", "missing.db"], 2),
    "show an empty ledger file": (["budget", "show", "--ledger", "empty.db"], 2),
    "show a ledger of random bytes": (["budget", "show", "--ledger", "not a ledger.db"], 2),
    "show a torn ledger": (["budget", "show", "--ledger", "torn.db"], 2),
    "show a folder as ledger": (["budget", "show", "--ledger", "a folder"], 2),
    "spend on a torn ledger": (["budget", "spend", "--ledger", "torn.db", "--label", "x", "--pure-epsilon", "0.1"], 2),
    "init a ledger in a missing folder": (
        ["budget", "init", "--ledger", "nope/l.db", "--epsilon", "1", "--delta", "1e-5"],
        2,
    ),
    "init over a ledger of random bytes": (
        ["budget", "init", "--ledger", "not a ledger.db", "--epsilon", "1", "--delta", "1e-5"],
        2,
    ),
    "NUL in a ledger path": (["budget", "init", "--ledger", "l\x00.db", "--epsilon", "1", "--delta", "1e-5"], 2),
    "NUL in a label": ([*SPEND, "--pure-epsilon", "0.1", "--label", "a\x00b"], 2),
    "label with a newline": ([*SPEND, "--pure-epsilon", "0.1", "--label", "a\nb"], 2),
    "synthesize unknown method": (
        [
            *SYN[:2],
            "gpt",
            *SYN[3:],
            "--data",
            "ginc.csv",
            "--epsilon",
            "4",
            "--ledger",
            "ledger.db",
            "--out",
            "o.jsonl",
        ],
        2,
    ),
    "synthesize a missing data file": (
        [*SYN, "--data", "missing.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize an empty data file": (
        [*SYN, "--data", "empty.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a header-only data file": (
        [*SYN, "--data", "header only.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a binary CSV": (
        [*SYN, "--data", "binary.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize an unclosed CSV quote": (
        [*SYN, "--data", "quote.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a torn JSONL": (
        [*SYN, "--data", "torn.jsonl", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a JSONL of arrays": (
        [*SYN, "--data", "array.jsonl", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a folder as data": (
        [*SYN, "--data", "a folder", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a unicode data path": (
        [
            *SYN,
            "--data",
            "d\u00e5ta\u202e\U0001f600.csv",
            "--epsilon",
            "4",
            "--ledger",
            "ledger.db",
            "--out",
            "o.jsonl",
        ],
        2,
    ),
    "synthesize a lone surrogate in a path": (
        [*SYN, "--data", "x\udcff.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize NUL in the out path": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o\x00.jsonl"],
        2,
    ),
    "synthesize ε = NaN": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "nan", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize ε = inf": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "inf", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize ε = −1": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "-1", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize δ = 2": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--delta", "2", "--ledger", "ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize n-prompts = 0": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "o.jsonl", "--n-prompts", "0"],
        2,
    ),
    "synthesize max-tokens = 1e9": (
        [
            *SYN,
            "--data",
            "ginc.csv",
            "--epsilon",
            "4",
            "--ledger",
            "ledger.db",
            "--out",
            "o.jsonl",
            "--max-tokens",
            "1000000000",
        ],
        2,
    ),
    "synthesize budget ε without δ": (
        [
            *SYN,
            "--data",
            "ginc.csv",
            "--epsilon",
            "4",
            "--ledger",
            "new.db",
            "--out",
            "o.jsonl",
            "--budget-epsilon",
            "1",
        ],
        2,
    ),
    "synthesize a torn ledger": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "torn.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize a ledger of random bytes": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "not a ledger.db", "--out", "o.jsonl"],
        2,
    ),
    "synthesize out is a folder (checked before the charge)": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "a folder"],
        2,
    ),
    "synthesize out under a file (checked before the charge)": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "ledger.db", "--out", "ginc.csv/o.jsonl"],
        2,
    ),
    "synthesize public inputs not UTF-8": (
        [
            "synthesize",
            "--method",
            "mozo-offline",
            "--text-column",
            "text",
            "--label-column",
            "label",
            "--model",
            "ginc",
            "--data",
            "ginc.csv",
            "--public-inputs",
            "inputs.txt",
            "--epsilon",
            "4",
            "--ledger",
            "ledger.db",
            "--out",
            "o.jsonl",
        ],
        2,
    ),
    "synthesize on an exhausted ledger": (
        [*SYN, "--data", "ginc.csv", "--epsilon", "4", "--ledger", "spent.db", "--out", "o.jsonl"],
        3,
    ),
}

# What each failure says on stderr: a case passes only for its own reason.
CLI_MESSAGES: dict[str, str] = {
    "init ε = 0": "epsilon must be positive and finite,",
    "init ε = −1": "epsilon must be positive and finite,",
    "init ε = 1e400 (inf)": "epsilon must be positive and finite,",
    "init δ = NaN": "delta must not be NaN",
    "init ε not a number": "argument --epsilon: not a number",
    "spend ε = −inf": "epsilon must be positive and finite,",
    "spend ε = NaN": "epsilon must not be NaN",
    "spend ε = 1e308 (refused)": "charge refused",
    "spend δ = 0": "delta must lie in the open interval (0, 1),",
    "spend on an exhausted ledger": "charge refused",
    "calibrate ε = NaN": "epsilon must not be NaN",
    "calibrate steps = 0": "steps must be at least 1,",
    "calibrate steps = 1.5": "argument --steps: not an integer",
    "calibrate grid = 0": "grid must be positive and finite,",
    "calibrate grid = 1e-300 (would not end)": "grid=1e-300 puts more than 1,000,000,000 points in",
    "calibrate max = inf": "need finite lo < hi, got",
    "calibrate adadpsyn grid = 1e-300": "grid=1e-300 puts more than 1,000,000,000 points in",
    "calibrate mozo order = inf": "order must be a Rényi order in (1, inf),",
    "epsilon σ = −1": "--noise-multiplier must be positive and finite,",
    "epsilon clip-blend τ = 0": "temperature must be positive and finite,",
    "epsilon clip-blend unknown relation": "argument --neighbouring: invalid choice",
    "audit samples = 0 (not the full audit)": "samples must be at least 1,",
    "audit out is a file": "--out ginc.csv is a file, not a folder",
    "bench eval shots = −1": "argument --shots: negative values in '-1'",
    "bench eval prompts = 0": "n_prompts must be at least 1,",
    "bench eval model folder empty": "a folder is not a GINC model directory (no ginc.json)",
    "bench train out is a file": "[Errno 17] File exists",
    "unknown subcommand": "argument COMMAND: invalid choice",
    "show a missing ledger": "no ledger at missing.db",
    "show an empty ledger file": "no ledger at empty.db",
    "show a ledger of random bytes": "not a ledger.db is not a dp-icl ledger (not an SQLite",
    "show a torn ledger": "ledger torn.db is damaged or unreadable: database disk",
    "show a folder as ledger": "cannot read ledger a folder:",
    "spend on a torn ledger": "ledger torn.db is damaged or unreadable: database disk",
    "init a ledger in a missing folder": "directory nope does not exist",
    "init over a ledger of random bytes": "not a ledger.db is not a dp-icl ledger (not an SQLite",
    "NUL in a ledger path": "arguments cannot contain NUL characters",
    "NUL in a label": "arguments cannot contain NUL characters",
    "label with a newline": "label must be at most 200 printable characters",
    "synthesize unknown method": "argument --method: invalid choice",
    "synthesize a missing data file": "no such data file: missing.csv",
    "synthesize an empty data file": "empty.csv has no header row",
    "synthesize a header-only data file": "header only.csv has no data rows",
    "synthesize a binary CSV": "binary.csv is not UTF-8 text",
    "synthesize an unclosed CSV quote": "quote.csv, line 2: column 'label' is not text",
    "synthesize a torn JSONL": "torn.jsonl, line 1: not valid JSON",
    "synthesize a JSONL of arrays": "array.jsonl, line 1: expected a JSON object",
    "synthesize a folder as data": "no such data file: a folder",
    "synthesize a unicode data path": "no such data file: d\u00e5ta\u202e\U0001f600.csv",
    "synthesize a lone surrogate in a path": "no such data file: x\\udcff.csv",  # escaped: printing it must not crash
    "synthesize NUL in the out path": "arguments cannot contain NUL characters",
    "synthesize ε = NaN": "epsilon must not be NaN",
    "synthesize ε = inf": "epsilon must be positive and finite,",
    "synthesize ε = −1": "epsilon must be positive and finite,",
    "synthesize δ = 2": "delta must lie in the open interval (0, 1),",
    "synthesize n-prompts = 0": "--n-prompts must be at least 1,",
    "synthesize max-tokens = 1e9": "no noise multiplier in [0.3, 100] meets epsilon=4.0",
    "synthesize budget ε without δ": "give both --budget-epsilon and --budget-delta to create a",
    "synthesize a torn ledger": "ledger torn.db is damaged or unreadable: database disk",
    "synthesize a ledger of random bytes": "not a ledger.db is not a dp-icl ledger (not an SQLite",
    "synthesize out is a folder (checked before the charge)": "--out a folder is a folder",
    "synthesize out under a file (checked before the charge)": "cannot create a file under",
    "synthesize public inputs not UTF-8": "cannot read inputs.txt: UnicodeDecodeError",
    "synthesize on an exhausted ledger": "charge refused",
}


ONE_LINE = re.compile(r"^dp-icl[\w -]*: (error|refused|unexpected error \(\w+\)): \S")


def _ledger_states(root: Path) -> dict[str, Any]:
    """What each ledger-like file holds: its history for a valid ledger, else its bytes (must not change)."""
    states: dict[str, Any] = {}
    for path in sorted(root.glob("*.db")):
        try:
            manager = BudgetManager.open(path)
        except Exception:
            states[path.name] = path.read_bytes()
            continue
        states[path.name] = [(e.id, e.label) for e in manager.history()]
        manager.close()
    return states


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_bad_cli_input_exits_nonzero_with_one_line_and_charges_nothing(
    name: str,
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, status = CLI_CASES[name]
    root = tmp_path / "case"
    shutil.copytree(files["root"], root)
    monkeypatch.chdir(root)
    before = _ledger_states(root)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: malformed arguments
        code = exc.code
    out, err = capsys.readouterr()
    assert code == status, (out, err)
    assert "Traceback" not in out + err
    messages = [line for line in err.splitlines() if ONE_LINE.match(line)]
    assert len(messages) == 1, err  # transformers' "Loading weights" bar may share stderr with it
    assert CLI_MESSAGES[name] in messages[0]
    assert _ledger_states(root) == before, "a failed command must not charge or change any ledger"
    assert not (root / "o.jsonl").exists() and not (root / "new.db").exists(), "nothing may be released"


def test_cli_documents_extreme_noise_instead_of_overflowing(capsys: pytest.CaptureFixture[str]) -> None:
    for sigma, expected in (("1e300", lambda e: 0 < e < 0.05), ("1e-300", lambda e: e == "inf")):
        assert main([*EPS, "--noise-multiplier", sigma]) == 0
        assert expected(json.loads(capsys.readouterr().out)["epsilon"])


def test_cli_unexpected_error_is_one_line_without_its_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = "CANARY-private-record-7f3a"

    def broken(_: object) -> dict[str, object]:
        raise KeyError(canary)  # a bug whose message quotes a private record

    from dp_icl_plugin.cli import commands

    monkeypatch.setattr(commands, "budget_show", broken)
    assert main(["budget", "show", "--ledger", "any.db"]) == 1
    out, err = capsys.readouterr()
    assert canary not in out + err and "Traceback" not in out + err
    (line,) = err.splitlines()
    assert ONE_LINE.match(line) and "unexpected error (KeyError): at " in line


def test_a_decoder_refuses_answers_past_its_n_queries_before_any_charge(world: World) -> None:
    # n_queries=2 let 5 answers through: only the ledger, not the decoder, refused the sixth
    decoder = MozoDecoder(
        dataset(), backend=backend(), budget=world.ledger, n_queries=2, max_tokens=2, beta=0.5, top_k=20
    )
    chat, llm = lc.ChatDPICL(decoder=decoder, seed=0), li.DPICL(decoder, seed=0)
    chat.invoke("Hello")
    assert decoder.answers_left == 1
    llm.complete("Hello")  # one share, whichever adapter asks
    assert decoder.answers_left == 0
    before = world.charged()
    for refused in (
        lambda: chat.invoke("Hello"),
        lambda: llm.complete("Hello"),
        lambda: world.drain(chat.stream("Hello")),
    ):
        with pytest.raises(ShareExhaustedError, match="this decoder's share covers 2 answers") as caught:
            refused()
        assert isinstance(caught.value, BudgetExhaustedError) and caught.value.n_queries == 2
    assert world.charged() == before and world.released == []
