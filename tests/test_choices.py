"""Public answer choices: the prefix tree, every decoder restricted to it, the charge it implies, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decoding import WORDS, Counting, data
from test_knn_experts import TEMPLATE, build

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.decoding import decoders as decoding
from dp_icl_plugin.decoding.choices import AnswerChoices
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig
from dp_icl_plugin.steps import clip_blend_step as clip_blend_method
from dp_icl_plugin.steps import mozo_step


def fake(eos: bool = True) -> FakeBackend:
    return Counting(WORDS, eos_token="<eos>" if eos else None, seed=3)


def test_the_tree_allows_only_continuations_and_ends_a_shorter_choice_with_eos() -> None:
    choices = AnswerChoices(fake(), ["a b", "a b c", "d"])
    eos = WORDS.index("<eos>")
    a, b, c, d = (WORDS.index(w) for w in "abcd")
    assert choices.allowed([]).tolist() == [a, d]
    assert choices.allowed([a]).tolist() == [b]
    assert choices.allowed([a, b]).tolist() == [c, eos]  # "a b" ends only where the model ends it
    assert choices.max_tokens == 3 and choices.decisions == 2  # "b" after "a" is forced: public, free
    assert choices.forced([a]) == b and choices.forced([]) is None
    assert choices.complete([d]) and choices.complete([a, b, eos]) and choices.complete([a, b, c])
    assert not choices.complete([a, b])
    assert choices.text_of([a, b, eos]) == "a b" and choices.text_of([a]) is None
    with pytest.raises(ConfigurationError, match="continue no choice"):
        choices.allowed([c])


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        (["a"], "at least two"),
        ("a b", "list of strings"),
        (["a", "a"], "distinct"),
        (["a", ""], "non-empty"),
        (["a", "zz"], "vocabulary"),
    ],
)
def test_bad_choices_are_refused(choices, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        AnswerChoices(fake(), choices)


def test_a_choice_that_begins_another_needs_an_end_of_sequence_token() -> None:
    with pytest.raises(ConfigurationError, match="end-of-sequence"):
        AnswerChoices(fake(eos=False), ["a", "a b"])


def test_restrict_runs_the_mechanism_on_the_allowed_columns_only() -> None:
    choices = AnswerChoices(fake(), ["b", "d"])
    seen = []

    def mechanism(rows: np.ndarray) -> int:
        seen.append(rows.copy())
        return 1

    rows = np.arange(2 * len(WORDS), dtype=float).reshape(2, -1)
    assert choices.restrict(mechanism, rows, []) == WORDS.index("d")
    np.testing.assert_array_equal(seen[0], rows[:, [WORDS.index("b"), WORDS.index("d")]])
    forced = AnswerChoices(fake(), ["a b", "e"])
    assert forced.restrict(mechanism, rows, [WORDS.index("a")]) == WORDS.index("b") and len(seen) == 1


def mozo(budget: BudgetManager, **kw) -> MozoDecoder:
    return MozoDecoder(
        data(), backend=fake(), budget=budget, **{"n_queries": 5, "max_tokens": 4, "epsilon": 2.0, "top_k": 6, **kw}
    )


def clip(budget: BudgetManager, **kw) -> ClipBlendDecoder:
    return ClipBlendDecoder(
        data(),
        backend=fake(),
        budget=budget,
        **{
            "n_queries": 5,
            "max_tokens": 4,
            "subset_size": 10,
            "rng_subset": np.random.default_rng(1),
            "epsilon": 2.0,
            **kw,
        },
    )


STEP_EVENT = {
    mozo: lambda d, steps: me.mozo_event(beta=d.beta, order=d.order, sampling_rate=d.sampling_rate, steps=steps),
    clip: lambda d, steps: me.clip_blend_event(
        clip=d.clip, subset_size=d.subset_size, temperature=d.temperature, steps=steps, neighbouring=d.neighbouring
    ),
}


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_answer_is_a_choice_and_is_charged_for_the_longest_one(make, seed) -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger, choices=["a b", "a b c", "e"])
    assert decoder.max_tokens == 3  # answers have at most 3 tokens, not the 4 asked
    answer = decoder.generate("a b", rng=np.random.default_rng(seed))
    assert answer.text in {"a b", "a b c", "e"} and answer.finish_reason == "stop"
    # charged and calibrated for 2 token decisions ("b" after "a" is forced), not 3 tokens
    assert ledger.history()[-1].event == decoder.answer_event(3) == STEP_EVENT[make](decoder, 2)


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_choices_spend_the_share_on_the_tokens_an_answer_can_have(make) -> None:
    free = make(BudgetManager(PrivacyBudget(2.0, 1 / 40)))
    chosen = make(BudgetManager(PrivacyBudget(2.0, 1 / 40)), choices=["a", "e"])
    assert chosen.max_tokens == 1
    # one token per answer instead of four: the same share buys a stronger token mechanism
    if isinstance(free, MozoDecoder):
        assert chosen.beta > 2 * free.beta
    else:
        assert chosen.temperature < free.temperature / 2


@pytest.mark.parametrize(("make", "name"), [(mozo, "mozo_token"), (clip, "clip_blend_token")])
def test_a_forced_token_runs_no_mechanism(make, name, monkeypatch) -> None:
    module = mozo_step if name == "mozo_token" else clip_blend_method
    real = getattr(module, name)
    calls = []
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    decoder = make(BudgetManager(PrivacyBudget(100.0, 1e-2)), choices=["a b c", "e"], n_queries=6)
    answers = [decoder.generate("a b", rng=np.random.default_rng(s)).text for s in range(6)]
    assert decoder.choices.decisions == 1 and len(calls) == 6  # one mechanism per answer, whatever its length
    assert set(answers) <= {"a b c", "e"}


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_an_answer_limit_below_the_longest_choice_is_refused_before_any_charge(make) -> None:
    with pytest.raises(ConfigurationError, match="below the 3 tokens"):
        make(BudgetManager(PrivacyBudget(100.0, 1e-2)), max_tokens=2, choices=["a b c", "e"])
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger, choices=["a b c", "e"])
    before = Counting.calls
    with pytest.raises(ConfigurationError, match="below the 3 tokens"):
        decoder.generate("a b", rng=np.random.default_rng(0), max_tokens=2)
    assert ledger.history() == [] and Counting.calls == before


def test_expert_decoding_with_choices_answers_with_the_experts_label() -> None:
    # the zero-shot row after "q" favours "a"; experts labelled "rare" favour "b": restricted to {"b", "c"}, the
    # experts decide between two tokens the zero-shot row barely tells apart
    config = KNNConfig(k=8, shards=1, min_similarity=0.5, uses=20, max_answer_tokens=1)
    _, ledger, decoder = build(["rare"] * 8, config=config, epsilon=40.0)
    restricted = type(decoder)(decoder.knn, template=TEMPLATE, choices=["b", "c"])
    answers = [restricted.generate("q", rng=np.random.default_rng(s)).text for s in range(20)]
    # the experts tilt b over c by c/τ ≈ 9.2 nats (zero-shot: a tie): b with probability > 0.999 per answer
    assert set(answers) <= {"b", "c"} and answers.count("b") >= 19
    assert restricted.max_tokens == 1 and ledger.history()[-1].event.per_unit.count == 1


def test_expert_decoding_charges_the_choices_decisions_and_refuses_more_than_its_budget_covers() -> None:
    config = KNNConfig(k=8, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=2)
    _, ledger, decoder = build(["rare"] * 8, config=config)  # the filters were divided for 2-token answers
    long = type(decoder)(decoder.knn, template=TEMPLATE, choices=["a b c", "a c", "u"])
    assert long.max_tokens == 3 and long.choices.decisions == 2  # 3 tokens, 2 decisions ("c" after "a b")
    long.generate("q", rng=np.random.default_rng(0))
    assert ledger.history()[-1].event.per_unit.count == 2
    with pytest.raises(ConfigurationError, match="3 token decisions"):
        type(decoder)(decoder.knn, template=TEMPLATE, choices=["a b c", "a b u", "a c", "u"])


def test_both_adapters_answer_with_a_choice() -> None:
    pytest.importorskip("langchain_dp_icl")
    pytest.importorskip("llama_index.llms.dp_icl")
    from langchain_dp_icl import ChatDPICL
    from llama_index.llms.dp_icl import DPICL

    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = mozo(ledger, choices=["a b c", "e"])
    assert ChatDPICL(decoder=decoder, seed=0).invoke("a b").content in {"a b c", "e"}
    assert DPICL(decoder=decoder, seed=0).complete("a b").text in {"a b c", "e"}
    assert [e.label for e in ledger.history()] == ["mozo-answer"] * 2


@pytest.mark.parametrize("name", ["mozo_token", "clip_blend_token"])
def test_a_row_without_a_finite_choice_cannot_fail_the_release(name) -> None:
    # a record whose prompt gives every choice probability 0 must not make the answer fail (after the charge)
    choices = AnswerChoices(fake(), ["a", "e"])
    rng = np.random.default_rng(0)
    rows = np.log(np.full((5, len(WORDS)), 1.0 / len(WORDS)))
    rows[2, [WORDS.index("a"), WORDS.index("e")]] = -np.inf
    mechanism = {
        "mozo_token": lambda r: (
            mozo_step.mozo_token(r[1:], r[0], beta=0.5, order=8.0, top_k=2, rng=rng, variant="projected").token_id
        ),
        "clip_blend_token": lambda r: clip_blend_method.clip_blend_token(
            r[1:], r[0], clip=4.0, subset_size=4, temperature=1.0, rng=rng
        ),
    }[name]
    assert choices.restrict(mechanism, rows, []) in {WORDS.index("a"), WORDS.index("e")}
    rows[0, [WORDS.index("a"), WORDS.index("e")]] = -np.inf  # the public row too (public: uniform on the choices)
    assert choices.restrict(mechanism, rows, []) in {WORDS.index("a"), WORDS.index("e")}


def test_a_stop_sequence_inside_a_choice_is_refused_and_eos_never_enters_the_text() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = mozo(ledger, choices=["a b", "d"])
    with pytest.raises(ConfigurationError, match="inside a choice"):
        decoder.generate("a b", rng=np.random.default_rng(0), stop=["b"])
    assert ledger.history() == []
    from dp_icl_plugin.templates.answer import AnswerTemplate

    plain = mozo(ledger, choices=["a", "a b"], template=AnswerTemplate(stop=None, stop_at_eos=False), n_queries=12)
    texts = {plain.generate("a b", rng=np.random.default_rng(s)).text for s in range(12)}
    assert texts <= {"a", "a b"}  # "a" ends with the end-of-sequence token, which is not part of the answer


def test_choices_built_for_another_tokenizer_are_encoded_again() -> None:
    other = AnswerChoices(FakeBackend(["e", "a", "<eos>"], eos_token="<eos>", seed=1), ["a", "e"])
    decoder = mozo(BudgetManager(PrivacyBudget(100.0, 1e-2)), choices=other)
    assert decoder.choices.sequences == ((WORDS.index("a"),), (WORDS.index("e"),))


def _poison(rows: np.ndarray) -> np.ndarray:
    out = np.array(rows, dtype=np.float64, copy=True)
    out[2, 0] = np.nan  # one record's row: NaN on a token no choice uses (an fp16 overflow, say)
    return out


class _PoisonedSession:
    def __init__(self, inner) -> None:
        self.inner = inner

    def __enter__(self):
        self.session = self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    @property
    def logprobs(self) -> np.ndarray:
        return _poison(self.session.logprobs)

    def append(self, token):
        return _poison(self.session.append(token))


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
@pytest.mark.parametrize("choices", [None, ["a", "e"]], ids=["free", "choices"])
def test_a_records_bad_row_cannot_fail_the_release(make, choices, monkeypatch) -> None:
    real_rows, real_start = mozo_step.rows_logprobs, decoding.start_rows
    monkeypatch.setattr(mozo_step, "rows_logprobs", lambda *a, **kw: _poison(real_rows(*a, **kw)))
    monkeypatch.setattr(decoding, "start_rows", lambda *a, **kw: _PoisonedSession(real_start(*a, **kw)))
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger, choices=choices)
    answer = decoder.generate("a b", rng=np.random.default_rng(0), max_tokens=decoder.max_tokens)
    assert len(ledger.history()) == 1 and (choices is None or answer.text in choices)
