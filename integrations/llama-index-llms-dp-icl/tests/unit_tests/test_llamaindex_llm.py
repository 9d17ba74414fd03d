"""The LlamaIndex DP LLM: complete, stream and chat (sync and async), each charged, private data not serialised,
cancellation, metadata; on a tiny byte-level GPT-2 built here (no server)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("torch")

from adapter_fixtures import (
    CANARY,
    SlowBackend,
    backend,
    dataset,
    per_token_decoder,
    spend_allowance,
    unit_dataset,
    unit_knn_core,
    unit_ledger,
)
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.llms.dp_icl import DPICL
from llama_index.retrievers.dp_icl import DPICLRetriever
from llamaindex_fixtures import llm_and_ledger

from dp_icl_plugin import AllowanceSpentError, BudgetManager, ConfigurationError, PrivacyBudget, PrivateDataset
from dp_icl_plugin.decoding.decoders import MozoDecoder


def test_llm_complete_stream_chat_each_charged_and_private_data_not_serialised() -> None:
    llm, ledger = llm_and_ledger()
    before = len(ledger.history())
    assert isinstance(llm.complete("Hello").text, str)
    pieces = list(llm.stream_complete("Hello there"))
    assert all(p.text.endswith(p.delta or "") for p in pieces)
    reply = llm.chat([ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="Hi")])
    assert reply.message.role == "assistant"
    assert len(ledger.history()) == before + 3
    assert CANARY not in str(llm.to_dict()) and CANARY not in repr(llm)
    assert llm.metadata.num_output == 6
    with pytest.raises(ConfigurationError, match="last message"):
        llm.chat([ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="Hello")])
    assert len(ledger.history()) == before + 3


def test_bad_construction() -> None:
    with pytest.raises(ConfigurationError):
        DPICLRetriever("not a retriever", rng=np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        DPICL("not a decoder", rng=np.random.default_rng(0))  # type: ignore[arg-type]


class _Tokenizer:  # enough of a tokenizer to reach the URL check
    def encode(self, text: str) -> list[int]:
        return [1]

    def decode(self, ids: list[int]) -> str:
        return "a"

    def __len__(self) -> int:
        return 10


def test_dpllm_from_a_server_url_needs_the_tokenizer_and_keeps_to_loopback() -> None:
    from dp_icl_plugin import PrivateDataset

    data = PrivateDataset.from_pairs(["a question"] * 5, ["x"] * 5)
    budget = BudgetManager(PrivacyBudget(2.0, 1e-3))
    with pytest.raises(ConfigurationError, match="tokenizer="):
        DPICL.from_model_id(
            "http://127.0.0.1:8000", data, budget=budget, rng=np.random.default_rng(0), epsilon=1.0, n_queries=2
        )
    with pytest.raises(ConfigurationError, match="plain http"):
        DPICL.from_model_id(
            "http://10.0.0.7:8000",
            data,
            budget=budget,
            rng=np.random.default_rng(0),
            tokenizer=_Tokenizer(),
            epsilon=1.0,
            n_queries=2,
        )
    assert budget.history() == []


def make_llm(delay: float = 0.0, max_tokens: int = 6, **settings: Any) -> tuple[DPICL, BudgetManager]:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    model = SlowBackend(backend(), delay) if delay else backend()
    decoder = MozoDecoder(
        dataset(), backend=model, budget=ledger, n_queries=100, max_tokens=max_tokens, beta=0.5, top_k=20
    )
    return DPICL(decoder, seed=0, **settings), ledger


class Events(BaseEventHandler):
    seen: list[Any] = []  # noqa: RUF012  (a pydantic field: copied per instance)

    @classmethod
    def class_name(cls) -> str:
        return "Events"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.seen.append(event)


@pytest.mark.parametrize("kind", ["complete", "chat"])
async def test_async_streams_leave_the_loop_free_while_a_slow_answer_streams(kind: str) -> None:
    llm, ledger = make_llm(delay=0.05, max_tokens=5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.002)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    if kind == "complete":
        stream = await llm.astream_complete("where did the cat sit?", max_tokens=5)
    else:
        stream = await llm.astream_chat([ChatMessage(role="user", content="where did the cat sit?")], max_tokens=5)
    deltas = [r.delta async for r in stream]
    task.cancel()
    # five forwards of ≥ 50 ms each ran in worker threads: the 2 ms ticker ran dozens of times meanwhile
    # (on the event loop, as the sync generator used to run, it could not run at all until the end)
    assert ticks >= 20, ticks
    assert len(ledger.history()) == 1 and deltas


async def test_acomplete_and_achat_run_under_their_own_callback_span() -> None:
    llm, _ = make_llm()
    handler = Events()
    get_dispatcher().add_event_handler(handler)
    await llm.acomplete("hi")
    await llm.achat([ChatMessage(role="user", content="hi")])
    spans = {type(e).__name__: e.span_id for e in handler.seen}
    assert spans["LLMCompletionStartEvent"].startswith("DPICL.acomplete-")
    assert spans["LLMChatStartEvent"].startswith("DPICL.achat-")
    assert spans["DPSpendEvent"].startswith("DPICL.achat-")  # each answer's charge emitted inside its call


class Spy:
    """Records what the LLM hands the decoder."""

    def __init__(self, llm: DPICL) -> None:
        self.calls: list[tuple[Any, int | None]] = []
        decoder = llm._decoder
        real = decoder.stream

        def stream(query: Any, **kwargs: Any) -> Any:
            self.calls.append((query, kwargs.get("max_tokens")))
            return real(query, **kwargs)

        decoder.stream = stream  # this decoder belongs to this test alone


def test_complete_shapes_prompts_as_llamaindex_llms_do() -> None:
    from llama_index.core.prompts import PromptTemplate

    cases = [
        ({}, "q", False, "q"),
        ({"system_prompt": "Be brief."}, "q", False, "Be brief.\n\nq"),
        ({"completion_to_prompt": lambda p: f"<s>{p}</s>"}, "q", False, "<s>q</s>"),
        ({"query_wrapper_prompt": PromptTemplate("Q: {query_str}\nA:")}, "q", False, "Q: q\nA:"),
        ({"system_prompt": "Be brief."}, "q", True, "q"),  # formatted: as given
    ]
    for settings, prompt, formatted, expected in cases:
        llm, _ = make_llm(**settings)
        spy = Spy(llm)
        llm.complete(prompt, formatted=formatted)
        assert spy.calls == [(expected, 6)], settings


def test_a_call_may_lower_max_tokens_and_is_charged_for_that() -> None:
    llm, ledger = make_llm(max_tokens=6)
    spy = Spy(llm)
    response = llm.complete("where did the cat sit?", max_tokens=2)
    assert spy.calls[0][1] == 2
    assert ledger.history()[-1].event == llm._decoder.answer_event(2)
    assert response.additional_kwargs["ledger_entry"] == ledger.history()[-1].id
    with pytest.raises(ConfigurationError, match="above the 6 tokens"):  # above the share: refused, not capped
        llm.complete("where did the cat sit?", max_tokens=10**6)
    assert len(spy.calls) == 1


def test_metadata_follows_the_model() -> None:
    llm, _ = make_llm()
    inner = backend()
    assert llm.metadata.context_window == inner.max_length
    assert llm.metadata.is_chat_model is inner.has_chat_template
    llm, _ = make_llm(is_chat_model=True, context_window=77)
    assert llm.metadata.is_chat_model is True and llm.metadata.context_window == 77


def test_metadata_context_window_is_the_models_own() -> None:
    class Short(SlowBackend):
        max_length = 300

    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(
        dataset(), backend=Short(backend(), 0.0), budget=ledger, n_queries=10, max_tokens=4, beta=0.5, top_k=20
    )
    assert DPICL(decoder, seed=0).metadata.context_window == 300


def test_a_chat_template_model_is_a_chat_model_for_query_engines() -> None:
    from dp_icl_plugin import FakeBackend

    words = ["user", "assistant", "system", "hi", "x", "y", "<eos>"]
    fake = FakeBackend(words, seed=0, eos_token="<eos>", chat_template=True)
    data = PrivateDataset.from_pairs(["x"] * 6, ["y"] * 6)
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(data, backend=fake, budget=ledger, n_queries=10, max_tokens=2, beta=0.5, top_k=3)
    llm = DPICL(decoder, seed=0)
    assert llm.metadata.is_chat_model is True
    assert DPICL(decoder, seed=0, is_chat_model=False).metadata.is_chat_model is False


async def test_a_cancelled_async_stream_leaves_the_decoder_usable() -> None:
    llm, ledger = make_llm(delay=0.05, max_tokens=5)

    async def consume() -> None:
        async for _ in await llm.astream_complete("where did the cat sit?"):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.12)  # mid-answer: a step is running in a worker thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    answer = await asyncio.wait_for(llm.acomplete("where is the mat?"), timeout=30)  # the lock was released
    assert isinstance(answer.text, str) and len(ledger.history()) == 2


async def test_more_concurrent_async_streams_than_worker_threads_all_finish() -> None:
    """Each step holds the decoder for one token only: streams paused between tokens block no one, so more
    streams than the default executor's workers (min(32, cores + 4)) all progress and finish."""
    llm, ledger = make_llm(delay=0.01, max_tokens=3)
    n = (os.cpu_count() or 1) + 8

    async def consume(i: int) -> str:
        stream = await llm.astream_complete(f"question {i}?")
        text = ""
        async for response in stream:
            text = response.text
            await asyncio.sleep(0.01)  # a reader that pauses between pieces
        return text

    answers = await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(n))), timeout=120)
    assert len(answers) == n and len(ledger.history()) == n


@pytest.mark.slow  # over 1 s: the full suite, not the unit layer
async def test_a_stream_cancelled_twice_ends_cancelled_after_its_step() -> None:
    """A second cancellation while the first waits for the step in flight: still no close under a running
    worker (that raised ValueError 'generator already executing'); the task ends cancelled."""
    llm, ledger = make_llm(delay=0.3, max_tokens=5)
    stream = await llm.astream_complete("where did the cat sit?")

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)  # the first step (the charge, the first forward) runs in a worker thread
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    answer = await asyncio.wait_for(llm.acomplete("where is the mat?", max_tokens=1), timeout=30)
    assert isinstance(answer.text, str) and len(ledger.history()) == 2


def test_the_llm_and_the_retriever_accept_units_and_charge_per_unit() -> None:
    ledger = unit_ledger()
    decoder = MozoDecoder(unit_dataset(), backend=backend(), budget=ledger, n_queries=2, max_tokens=2, epsilon=8.0)
    llm = DPICL(decoder=decoder, seed=0)
    assert isinstance(llm.complete("Hello").text, str)
    assert [e.event.privacy_unit for e in ledger.history()] == ["unit"]
    knn = unit_knn_core()
    DPICLRetriever(knn, rng=np.random.default_rng(0), mode="keywords").retrieve("where did the cat sit?")
    assert {e.event.privacy_unit for e in knn.budget.history()} == {"unit"}


def test_a_decoder_paid_per_token_answers_and_is_refused_once_its_allowance_is_spent() -> None:
    decoder, ledger = per_token_decoder()
    assert decoder.allowance is not None
    llm = DPICL(decoder, seed=0)
    assert isinstance(llm.complete("Hello").text, str)
    draws = ledger.label_counts()[decoder.allowance.draw_label]
    assert 1 <= draws <= 4
    spend_allowance(lambda: llm.complete("Hello"))
    before = ledger.history()
    with pytest.raises(AllowanceSpentError):
        llm.chat([ChatMessage(role="user", content="Hi")])
    assert ledger.history() == before
