"""LangChain adapters, our own tests: the selector, the DP LLM, charging, streaming and traces, on a tiny byte-level
GPT-2 built here (no server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("torch")

from adapter_fixtures import (
    CANARY,
    SlowBackend,
    backend,
    dataset,
    demo_set,
    knn_core,
    per_token_decoder,
    shared_decoder,
    shared_ledger,
    spend_allowance,
    unit_dataset,
    unit_knn_core,
    unit_ledger,
)
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import (
    ChatPromptTemplate,
    FewShotChatMessagePromptTemplate,
    FewShotPromptTemplate,
    PromptTemplate,
)
from langchain_dp_icl import DPICLLLM, ChatDPICL, ChatZeroShot, DPICLExampleSelector, DPICLRetriever
from pydantic import ValidationError

from dp_icl_plugin import (
    AllowanceSpentError,
    BudgetExhaustedError,
    BudgetManager,
    ConfigurationError,
    DemoSet,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    Provenance,
    PTASynthesizer,
    TangSynthesizer,
)
from dp_icl_plugin.data.records import Demonstration
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder


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


def test_selector_serves_a_demoset_in_both_few_shot_templates_for_free() -> None:
    ledger = BudgetManager(PrivacyBudget(1.0, 1e-5))
    example_prompt = PromptTemplate.from_template("Text: {input}\nLabel: {output}")
    selector = DPICLExampleSelector(demo_set(), k=2, example_prompt=example_prompt)
    prompt = FewShotPromptTemplate(
        example_selector=selector,
        example_prompt=example_prompt,
        suffix="Text: {input}\nLabel:",
        input_variables=["input"],
    )
    text = prompt.format(input="a query")
    assert "synthetic pos 0" in text and "synthetic neg 0" in text and "synthetic pos 1" not in text
    chat = FewShotChatMessagePromptTemplate(
        example_selector=selector,
        input_variables=["input"],
        example_prompt=ChatPromptTemplate.from_messages([("human", "{input}"), ("ai", "{output}")]),
    )
    messages = chat.format_messages(input="a query")
    assert [m.content for m in messages] == ["synthetic pos 0", "pos", "synthetic neg 0", "neg"]
    assert ledger.history() == []


def test_lazy_synthesis_charges_once() -> None:
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    method = TangSynthesizer(
        epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
    )
    selector = DPICLExampleSelector(
        synthesizer=method,
        dataset=dataset().with_public_label_counts("observed"),
        backend=backend(),
        budget=ledger,
        rng=np.random.default_rng(0),
    )
    assert ledger.history() == []
    first = selector.select_examples({"input": "q"})
    second = selector.select_examples({"input": "another"})
    assert first == second and len(first) == 3  # one per label
    assert len(ledger.history()) == 1
    assert CANARY not in repr(selector)


def test_selector_prepared_up_front_synthesizes_before_any_format_and_a_lazy_one_says_so(caplog) -> None:
    """Issue 41: synthesis never hidden inside a prompt's first format(): ``prepare()`` runs it up front (one
    charge), and a selector left lazy logs a warning when its first selection synthesizes."""
    method = TangSynthesizer(
        epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
    )

    def lazy(ledger: BudgetManager) -> DPICLExampleSelector:
        private = dataset().with_public_label_counts("observed")
        return DPICLExampleSelector(
            synthesizer=method, dataset=private, backend=backend(), budget=ledger, rng=np.random.default_rng(0)
        )

    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    selector = lazy(ledger)
    with caplog.at_level(logging.WARNING, logger="langchain_dp_icl.selector"):
        demos = selector.prepare(progress=False)
        assert len(ledger.history()) == 1 and selector.prepare() is demos  # once
        assert len(selector.select_examples({"input": "q"})) == 3 and len(ledger.history()) == 1
    assert caplog.records == []  # prepared: nothing synthesized inside a selection
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    with caplog.at_level(logging.WARNING, logger="langchain_dp_icl.selector"):
        lazy(ledger).select_examples({"input": "q"})
    assert len(ledger.history()) == 1
    assert ["selector.prepare()" in r.getMessage() for r in caplog.records] == [True]


def test_selector_bad_input() -> None:
    with pytest.raises(ConfigurationError, match="budget"):
        DPICLExampleSelector(
            synthesizer=TangSynthesizer(epsilon=1.0, delta=1e-3),
            dataset=dataset(),
            backend=FakeBackend(["a"]),
            rng=np.random.default_rng(0),
        )
    with pytest.raises(ConfigurationError, match="needs"):
        DPICLExampleSelector(demo_set(), example_prompt=PromptTemplate.from_template("{question} {answer}"))
    with pytest.raises(ConfigurationError, match="fields"):
        DPICLExampleSelector(demo_set(), fields={"input": "secret"})
    selector = DPICLExampleSelector(demo_set())
    with pytest.raises(NotImplementedError, match="not differentially private"):  # LangChain's convention
        selector.add_example({"input": "x", "output": "y"})
    selector.add_public_example({"input": "a public example", "output": "pos"})
    assert selector.select_examples({"input": "q"})[-1] == {"input": "a public example", "output": "pos"}


def braced_demo_set() -> DemoSet:
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
    demos = [
        Demonstration(label="pos", text="$$5 {numPlayers} x {{ y }} {% if %} }"),
        Demonstration(label="neg", text="plain"),
    ]
    return DemoSet(demos, prov)


@pytest.mark.parametrize("template_format", ["f-string", "jinja2"])
def test_selector_escapes_braces_for_the_few_shot_template(template_format: str) -> None:
    # a synthetic demonstration with braces failed every format with KeyError after the synthesis was charged
    example_prompt = PromptTemplate.from_template(
        "Text: {{ input }}\nLabel: {{ output }}" if template_format == "jinja2" else "Text: {input}\nLabel: {output}",
        template_format=template_format,
    )
    selector = DPICLExampleSelector(braced_demo_set(), example_prompt=example_prompt)
    assert selector.template_format == template_format
    prompt = FewShotPromptTemplate(
        example_selector=selector,
        example_prompt=example_prompt,
        input_variables=["input"],
        suffix="Text: {{ input }}" if template_format == "jinja2" else "Text: {input}",
        template_format=template_format,
    )
    assert "Text: $$5 {numPlayers} x {{ y }} {% if %} }\nLabel: pos" in prompt.format(input="a {query}")
    chat = FewShotChatMessagePromptTemplate(
        example_selector=DPICLExampleSelector(
            braced_demo_set(),
            example_prompt=ChatPromptTemplate.from_messages([("human", "{input}"), ("ai", "{output}")]),
        ),
        input_variables=["input"],
        example_prompt=ChatPromptTemplate.from_messages([("human", "{input}"), ("ai", "{output}")]),
    )
    assert chat.format_messages(input="q")[0].content == "$$5 {numPlayers} x {{ y }} {% if %} }"  # not escaped
    with pytest.raises(ConfigurationError, match="template_format"):
        DPICLExampleSelector(braced_demo_set(), template_format="mustache")  # type: ignore[arg-type]


def test_selector_save_to_is_reused_on_restart_without_a_second_charge(tmp_path: Any, caplog: Any) -> None:
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    saved = tmp_path / "demos.jsonl"

    def selector() -> DPICLExampleSelector:
        method = TangSynthesizer(
            epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
        )
        return DPICLExampleSelector(
            synthesizer=method,
            dataset=dataset().with_public_label_counts("observed"),
            backend=backend(),
            budget=ledger,
            seed=0,
            save_to=str(saved),
        )

    first = selector().select_examples({"input": "q"})
    assert saved.exists() and len(ledger.history()) == 1
    restarted = selector()  # a restart: the file is served, the dataset dropped, nothing charged
    assert restarted._lazy == (None, None, None, None, None)
    assert restarted.select_examples({"input": "q"}) == first and len(ledger.history()) == 1
    elsewhere = BudgetManager(PrivacyBudget(5.0, 1e-3))  # a ledger that never paid for the file: served, with a word
    with caplog.at_level(logging.WARNING, logger="dp_icl_plugin.synthesis.method"):
        DPICLExampleSelector(
            synthesizer=TangSynthesizer(
                epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
            ),
            dataset=dataset(),
            backend=backend(),
            budget=elsewhere,
            save_to=str(saved),
        )
    with pytest.raises(ConfigurationError, match="other settings"):  # a lower ε asked for: not the looser set
        DPICLExampleSelector(
            synthesizer=TangSynthesizer(
                epsilon=1.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
            ),
            dataset=dataset(),
            backend=backend(),
            budget=ledger,
            save_to=str(saved),
        )
    assert "is not in this app's ledger" in caplog.text and elsewhere.history() == []
    other = PTASynthesizer(epsilon=2.0, delta=1e-3, max_tokens=2, shots_per_label=1)
    with pytest.raises(ConfigurationError, match="remove the file"):
        DPICLExampleSelector(synthesizer=other, dataset=dataset(), backend=backend(), budget=ledger, save_to=str(saved))


def test_dp_llm_charges_every_answer_before_any_token_and_honours_stop() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=5, max_tokens=6, beta=0.05, top_k=20)
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
    decoder = ClipBlendDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        n_queries=1,
        subset_size=6,
        rng_subset=np.random.default_rng(0),
        max_tokens=6,
        temperature=3.0,
    )
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
    retriever = DPICLRetriever(knn=knn_core(), rng=np.random.default_rng(0), mode="answer")
    docs = retriever.invoke("where did the cat sit?", config={"callbacks": [recorder]})
    assert len(docs) == 1 and docs[0].metadata["kind"] == "dp_answer"
    assert any("dp_icl_spend" in s for s in recorder.seen)
    blob = " ".join(recorder.seen) + repr(chat) + repr(retriever) + str(chat.model_dump()) + str(retriever.model_dump())
    assert CANARY not in blob


class SpendEvents(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any], Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


def test_chat_model_and_llm_emit_every_charge_as_dp_icl_spend() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=4, beta=0.5, top_k=20)
    chat, llm = ChatDPICL(decoder=decoder, seed=0), DPICLLLM(decoder=decoder, seed=0)
    handler = SpendEvents()
    config: Any = {"callbacks": [handler]}
    message = chat.invoke("hello", config=config)
    chunks = list(chat.stream("hello", config=config))
    text = llm.invoke("hello", config=config)
    pieces = list(llm.stream("hello", config=config))
    assert isinstance(text, str) and pieces is not None
    charges = ledger.history()
    assert [e[0] for e in handler.events] == ["dp_icl_spend"] * 4 == ["dp_icl_spend"] * len(charges)
    assert [e[1]["ledger_entry"] for e in handler.events] == [c.id for c in charges]
    assert handler.events[0][1] == {
        "ledger_entry": charges[0].id,
        "release": "mozo-answer",
        "ledger_epsilon": charges[0].certified_epsilon,
    }
    assert message.response_metadata["ledger_entry"] == charges[0].id
    assert sum(chunks[1:], chunks[0]).response_metadata["ledger_entry"] == charges[1].id


async def test_chat_model_spend_shows_in_astream_events() -> None:
    chat = ChatDPICL(decoder=shared_decoder(), seed=0)
    events = [e async for e in chat.astream_events("hello", version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == ["dp_icl_spend"]
    assert custom[0]["run_id"] == next(e["run_id"] for e in events if e["event"] == "on_chat_model_start")


async def test_spend_shows_when_langchain_streams_an_invoke_internally() -> None:
    """astream_events over a chain that invokes the model attaches a streaming handler, so LangChain's
    _generate_with_cache would stream the answer through _stream without the run's manager."""
    from langchain_core.runnables import RunnableLambda

    chat = ChatDPICL(decoder=shared_decoder(), seed=0)
    chain = RunnableLambda(lambda q: chat.invoke(q))
    events = [e async for e in chain.astream_events("hello", version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    start = next(e["run_id"] for e in events if e["event"] == "on_chat_model_start")
    assert [(e["name"], e["run_id"]) for e in custom] == [("dp_icl_spend", start)]
    streamed = "".join(e["data"]["chunk"].content for e in events if e["event"] == "on_chat_model_stream")
    end = next(e for e in events if e["event"] == "on_chat_model_end")
    assert streamed == end["data"]["output"].content  # the tokens still stream to the handler


def test_interleaved_streams_and_calls_credit_each_spend_to_its_own_run() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=4, beta=0.5, top_k=20)
    chat = ChatDPICL(decoder=decoder, seed=0)
    handler = SpendEvents()
    first = chat.stream("hello", config={"callbacks": [handler], "run_id": uuid.UUID(int=1)})
    second = chat.stream("world", config={"callbacks": [handler], "run_id": uuid.UUID(int=2)})
    next(first)  # paused after its first chunk: holds nothing
    next(second)
    chat.invoke("again", config={"callbacks": [handler], "run_id": uuid.UUID(int=3)}, stream=True)
    list(second)
    list(first)
    charged = [c.id for c in ledger.history()]  # in the order charged: first, second, the invoke
    assert len(charged) == 3
    assert sorted((e[2].int, e[1]["ledger_entry"]) for e in handler.events) == list(
        zip((1, 2, 3), charged, strict=True)
    )


async def test_more_concurrent_astreams_than_worker_threads_all_finish() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=3, beta=0.5, top_k=20)
    chat, handler = ChatDPICL(decoder=decoder, seed=0), SpendEvents()
    n = (os.cpu_count() or 1) + 8  # the default executor has min(32, cores + 4) workers

    async def consume(i: int) -> uuid.UUID:
        run_id = uuid.uuid4()
        async for _ in chat.astream(f"question {i}?", config={"callbacks": [handler], "run_id": run_id}):
            await asyncio.sleep(0.01)  # a reader that pauses between chunks
        return run_id

    runs = await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(n))), timeout=120)
    assert len(ledger.history()) == n
    assert sorted(str(e[2]) for e in handler.events) == sorted(map(str, runs))  # one spend per run, its own


def slow_chat(delay: float) -> tuple[ChatDPICL, BudgetManager]:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(
        dataset(), backend=SlowBackend(backend(), delay), budget=ledger, n_queries=100, max_tokens=4, beta=0.5, top_k=20
    )
    return ChatDPICL(decoder=decoder, seed=0), ledger


async def test_an_astream_cancelled_during_its_charge_still_reports_the_spend() -> None:
    chat, ledger = slow_chat(0.3)
    handler = SpendEvents()

    async def consume() -> None:
        async for _ in chat.astream("hello", config={"callbacks": [handler]}):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)  # the first step (the charge, the first forward) runs in a worker thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e[1]["ledger_entry"] for e in handler.events] == [c.id for c in ledger.history()] and handler.events


async def test_async_handlers_run_on_the_callers_loop() -> None:
    """ainvoke(stream=True) streams tokens to an AsyncCallbackHandler that feeds the app's asyncio.Queue (not
    thread-safe): every callback must run on the caller's loop, not on a private loop in a worker thread."""
    from langchain_core.callbacks import AsyncCallbackHandler

    loop = asyncio.get_running_loop()
    seen: list[tuple[str, bool]] = []
    tokens: asyncio.Queue[str] = asyncio.Queue()

    class LoopBound(AsyncCallbackHandler):
        async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            seen.append(("token", asyncio.get_running_loop() is loop))
            tokens.put_nowait(token)

        async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            seen.append((name, asyncio.get_running_loop() is loop))

    chat, _ = slow_chat(0.01)
    message = await chat.ainvoke("hello", config={"callbacks": [LoopBound()]}, stream=True)
    assert ("dp_icl_spend", True) in seen and ("token", True) in seen
    assert all(on_loop for _, on_loop in seen), seen
    streamed = "".join(tokens.get_nowait() for _ in range(tokens.qsize()))
    assert streamed == message.content


async def test_an_invoke_streamed_for_astream_events_matches_langchains_own_streaming() -> None:
    """The chunks carry the final message's id, and the last chunk carries usage and the spend."""
    from langchain_core.runnables import RunnableLambda

    chat, ledger = slow_chat(0.0)
    events = [e async for e in RunnableLambda(lambda q: chat.invoke(q)).astream_events("hello", version="v2")]
    chunks = [e["data"]["chunk"] for e in events if e["event"] == "on_chat_model_stream"]
    final = next(e for e in events if e["event"] == "on_chat_model_end")["data"]["output"]
    assert {c.id for c in chunks} == {final.id}
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata == final.usage_metadata
    assert chunks[-1].response_metadata["ledger_entry"] == ledger.history()[0].id


async def test_callers_that_give_up_while_queued_for_a_fixed_latency_window_are_not_charged() -> None:
    from dp_icl_plugin.timing import FixedLatency

    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        n_queries=100,
        max_tokens=2,
        beta=0.5,
        top_k=20,
        fixed_latency=FixedLatency(0.5),
    )
    chat = ChatDPICL(decoder=decoder, seed=0)

    async def impatient() -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await chat.ainvoke("hello")

    await asyncio.gather(*(impatient() for _ in range(4)))
    assert len(ledger.history()) == 1  # only the first began its window; the three queued left uncharged


@pytest.mark.slow  # over 1 s: the full suite, not the unit layer
async def test_a_cancellation_during_the_spend_event_neither_repeats_nor_drops_it() -> None:
    from langchain_core.callbacks import AsyncCallbackHandler

    class SlowAudit(AsyncCallbackHandler):  # e.g. an audit log written to a database
        def __init__(self) -> None:
            self.started = self.done = 0

        async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            self.started += 1
            await asyncio.sleep(0.5)
            self.done += 1

    for call in ("ainvoke", "astream"):
        chat, ledger = slow_chat(0.05)
        audit, sync = SlowAudit(), SpendEvents()
        config: Any = {"callbacks": [audit, sync]}
        if call == "ainvoke":
            task = asyncio.create_task(chat.ainvoke("hello", config=config))
        else:
            task = asyncio.create_task(asyncio.wait_for(_drain(chat.astream("hello", config=config)), 30))
        await asyncio.sleep(0.25)  # the first step took ~0.1 s: the event is being delivered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (audit.started, audit.done) == (1, 1), call
        assert [e[1]["ledger_entry"] for e in sync.events] == [c.id for c in ledger.history()], call


async def _drain(chunks: Any) -> None:
    async for _ in chunks:
        pass


@pytest.mark.parametrize("kind", ["chat", "llm"])
async def test_the_completion_llm_also_calls_async_handlers_on_the_callers_loop(kind: str) -> None:
    from langchain_core.callbacks import AsyncCallbackHandler

    loop = asyncio.get_running_loop()
    seen: list[tuple[str, bool]] = []

    class LoopBound(AsyncCallbackHandler):
        async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            seen.append(("token", asyncio.get_running_loop() is loop))

        async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            seen.append((name, asyncio.get_running_loop() is loop))

    chat, _ = slow_chat(0.0)
    model: Any = chat if kind == "chat" else DPICLLLM(decoder=chat.decoder, seed=0)
    await model.ainvoke("hello", config={"callbacks": [LoopBound()]})
    _ = [c async for c in model.astream("hello", config={"callbacks": [LoopBound()]})]
    assert [name for name, _ in seen].count("dp_icl_spend") == 2 and ("token", True) in seen
    assert all(on_loop for _, on_loop in seen), seen


def test_rng_is_optional_and_a_seed_is_reproducible() -> None:
    a = ChatDPICL(decoder=shared_decoder(), seed=7).invoke("hello").content
    b = ChatDPICL(decoder=shared_decoder(), seed=7).invoke("hello").content
    assert a == b
    assert isinstance(ChatDPICL(decoder=shared_decoder()).rng, np.random.Generator)  # fresh OS entropy
    with pytest.raises(ValueError, match="rng or seed, not both"):
        ChatDPICL(decoder=shared_decoder(), seed=1, rng=np.random.default_rng(1))


class WordEmbeddings(Embeddings):
    """Bag of a few words: similarity is word overlap (enough to see ranking and diversity)."""

    WORDS = ("pos", "neg", "synthetic", "0", "1", "great", "awful")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[t.split().count(w) + 0.01 * i for i, w in enumerate(self.WORDS)] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def test_selector_ranks_with_langchains_own_selectors() -> None:
    from langchain_core.example_selectors import (
        MaxMarginalRelevanceExampleSelector,
        SemanticSimilarityExampleSelector,
    )
    from langchain_core.vectorstores import InMemoryVectorStore

    demos = demo_set()
    embeddings = WordEmbeddings()
    examples = [{"input": d.text, "output": d.label} for d in demos]
    query = {"input": "synthetic neg 1"}
    for selection, own in (
        ("similarity", SemanticSimilarityExampleSelector),
        ("mmr", MaxMarginalRelevanceExampleSelector),
    ):
        ours = DPICLExampleSelector(demos, k=3, embeddings=embeddings, selection=selection)
        reference = own.from_examples(
            examples, embeddings, InMemoryVectorStore, k=3, input_keys=["input"], example_keys=["input", "output"]
        )
        assert ours.select_examples(query) == reference.select_examples(query)
    assert DPICLExampleSelector(demos, embeddings=embeddings).selection == "similarity"  # the default with them
    labelled = DPICLExampleSelector(demos, k=3, embeddings=embeddings, label_key="label")
    assert {e["output"] for e in labelled.select_examples({**query, "label": "pos"})} == {"pos"}

    class Encoder:  # a SentenceTransformer's interface (the selector refused one that PrivateIndex accepts)
        def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
            return np.asarray(embeddings.embed_documents(texts))

    for embedder in (Encoder(), lambda texts: np.asarray(embeddings.embed_documents(texts))):
        other = DPICLExampleSelector(demos, k=3, embeddings=embedder)
        chosen = [e["input"] for e in other.select_examples(query)]  # unit float32 vectors: near-ties may swap
        assert chosen[0] == "synthetic neg 1" and set(chosen) == {
            e["input"] for e in DPICLExampleSelector(demos, k=3, embeddings=embeddings).select_examples(query)
        }


def lazy_selector(ledger: BudgetManager, **settings: Any) -> DPICLExampleSelector:
    """A selector that synthesizes (Tang, on a word-level fake model) on its first selection."""
    data = PrivateDataset(
        [PrivateRecord(f"a b {'abc'[i % 3]}", ("pos", "neg")[i % 2]) for i in range(40)], public_label_counts="observed"
    )
    method = TangSynthesizer(
        epsilon=1.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=1, shots_per_label=1, top_k=3
    )
    words = ["a", "b", "c", "pos", "neg", "Text:", "Label:", "<eos>"]
    return DPICLExampleSelector(
        synthesizer=method,
        dataset=data,
        backend=FakeBackend(words, eos_token="<eos>"),
        budget=ledger,
        seed=0,
        embeddings=WordEmbeddings(),
        **settings,
    )


async def test_selector_selects_asynchronously_and_lazily_charges_once() -> None:
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-3))
    selector = lazy_selector(ledger, k=2)
    first, second = await asyncio.gather(
        selector.aselect_examples({"input": "a b"}), selector.aselect_examples({"input": "b c"})
    )
    assert len(first) == len(second) == 2 and len(ledger.history()) == 1


def test_bad_input_is_refused_before_a_lazy_synthesis_or_a_first_answer_is_charged() -> None:
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-3))
    selector = lazy_selector(ledger)
    with pytest.raises(ConfigurationError, match="needs the input variable"):
        selector.select_examples({"question": "a b"})
    assert ledger.history() == []
    chat = ChatDPICL(
        decoder=MozoDecoder(
            dataset(), backend=backend(), budget=ledger, n_queries=10, max_tokens=2, beta=0.5, top_k=20
        ),
        seed=0,
    )
    with pytest.raises(ConfigurationError, match="last message"):
        chat.generate([[HumanMessage("hi")], [HumanMessage("hi"), AIMessage("hello")]])
    assert ledger.history() == []


def test_token_counts_come_from_the_models_own_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    # get_num_tokens fell back to LangChain's GPT-2 tokenizer: minutes of hub retries offline, then 0
    import langchain_core.language_models.base as lc_base
    from langchain_core.messages import trim_messages

    def no_hub() -> Any:
        raise AssertionError("LangChain's default GPT-2 tokenizer was asked for")

    monkeypatch.setattr(lc_base, "get_tokenizer", no_hub)
    for model in (ChatDPICL(**chat_params()), DPICLLLM(decoder=shared_decoder(), seed=0)):
        assert model.get_token_ids("hello world") == backend().encode("hello world", add_special_tokens=False)
        assert model.get_num_tokens("hello world") == len(backend().encode("hello world"))
    chat = ChatDPICL(**chat_params())
    history = [
        SystemMessage("Answer briefly."),
        HumanMessage("Hello " * 20),
        AIMessage("Hi " * 20),
        HumanMessage("cat?"),
    ]
    kept = trim_messages(history, max_tokens=30, token_counter=chat, strategy="last", include_system=True)
    assert kept[0] == history[0] and kept[-1] == history[-1] and len(kept) < len(history)
    assert chat.get_num_tokens_from_messages(kept) <= 30


def test_the_zero_shot_baseline_is_the_same_model_greedy_and_charges_nothing() -> None:
    # the examples hand-wrote greedy_generate and apply_chat_template for the baseline and a RAG generator
    from dp_icl_plugin.backends.generation import greedy_generate

    model = backend()
    baseline = ChatZeroShot(backend=model, max_tokens=5)
    answer = baseline.invoke([SystemMessage("Answer briefly."), HumanMessage("Hello, how are you?")])
    # no chat template on the tiny model: plain role lines, as the DP decoders lay them out
    prompt = model.encode("system: Answer briefly.\nuser: Hello, how are you?\nassistant:", add_special_tokens=True)
    assert answer.content == model.decode(greedy_generate(model, [prompt], max_new_tokens=5, stop=())[0])
    assert answer.usage_metadata["input_tokens"] == len(prompt)
    assert (
        "".join(str(c.content) for c in baseline.stream("Hello, how are you?"))
        == baseline.invoke("Hello, how are you?").content
    )
    restricted = ChatZeroShot(backend=model, choices=["apples", "oranges"])
    assert restricted.invoke("which fruit?").content in ("apples", "oranges")
    with pytest.raises(ConfigurationError, match="temperature"):
        baseline.invoke("hi", temperature=0.3)
    with pytest.raises(ValidationError):
        ChatZeroShot(backend="not a backend")


def test_selector_named_constructors_take_the_demos_or_a_lazy_synthesis() -> None:
    from langchain_dp_icl import LazySynthesis

    from dp_icl_plugin import ConfigurationTypeError

    ready = DPICLExampleSelector.from_demos(demo_set(), k=2, embeddings=WordEmbeddings())
    assert ready.select_examples({"input": "a b"}) == DPICLExampleSelector(
        demo_set(), k=2, embeddings=WordEmbeddings()
    ).select_examples({"input": "a b"})
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-3))
    method = TangSynthesizer(
        epsilon=2.0, delta=1e-3, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
    )
    lazy = LazySynthesis(method, dataset().with_public_label_counts("observed"), backend(), ledger, seed=0)
    selector = DPICLExampleSelector.synthesizing(lazy)
    assert ledger.history() == []  # checked at set-up, charged on the first selection
    assert len(selector.select_examples({"input": "q"})) == 3 and len(ledger.history()) == 1
    with pytest.raises(ConfigurationTypeError):
        DPICLExampleSelector.synthesizing({"synthesizer": method})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="LazySynthesis"):
        DPICLExampleSelector.synthesizing(lazy, budget=ledger)
    assert len(ledger.history()) == 1


def test_every_adapter_accepts_units_and_charges_per_unit() -> None:
    """Records that name their person, a unit-level ledger: the chat model, the LLM, the lazy selector and the
    retriever each charge events that hold for all of one person's records."""
    ledger = unit_ledger()
    decoder = MozoDecoder(unit_dataset(), backend=backend(), budget=ledger, n_queries=4, max_tokens=2, epsilon=8.0)
    assert decoder.sampling_rate == 4 / 8  # four of the eight people per token
    ChatDPICL(decoder=decoder, seed=0).invoke("hello")
    DPICLLLM(decoder=decoder, seed=0).invoke("hello")
    method = TangSynthesizer(epsilon=4.0, n_prompts=2, records_per_prompt=1, max_tokens=2, top_k=5)
    selector = DPICLExampleSelector(
        synthesizer=method, dataset=unit_dataset(), backend=backend(), budget=ledger, rng=np.random.default_rng(0)
    )
    assert len(selector.select_examples({"input": "q"})) == 3
    assert [e.event.privacy_unit for e in ledger.history()] == ["unit"] * 3
    knn = unit_knn_core()
    DPICLRetriever(knn=knn, rng=np.random.default_rng(0), mode="answer").invoke("where did the cat sit?")
    assert {e.event.privacy_unit for e in knn.budget.history()} == {"unit"}


def test_a_decoder_paid_per_token_answers_through_the_chat_model_and_the_llm() -> None:
    """pay_per_token: an answer draws on its decoder's allowance once per token mechanism; the adapters report its
    first draw (``ledger_entry``), and once the allowance is spent the next call is refused before anything runs."""
    decoder, ledger = per_token_decoder()
    assert decoder.allowance is not None
    chat, llm = ChatDPICL(decoder=decoder, seed=0), DPICLLLM(decoder=decoder, seed=0)
    handler = SpendEvents()
    message = chat.invoke("hello", config={"callbacks": [handler]})
    draws = [e for e in ledger.history() if e.label == decoder.allowance.draw_label]
    assert message.response_metadata["ledger_entry"] == draws[0].id
    assert [e[1]["ledger_entry"] for e in handler.events] == [draws[0].id]
    assert 1 <= len(draws) <= 4 and ledger.label_counts()[decoder.allowance.label] == 1
    assert isinstance(llm.invoke("hello"), str)
    spend_allowance(lambda: llm.invoke("hello"))
    before = ledger.history()
    with pytest.raises(AllowanceSpentError):
        next(iter(chat.stream("hello")))
    assert ledger.history() == before
