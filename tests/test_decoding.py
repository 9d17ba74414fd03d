"""DP decoding on FakeBackend: the whole answer is charged before its first token, calibration meets the
caller's share, stop sequences, limits, determinism and bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dp_icl_plugin import (
    BudgetExhaustedError,
    BudgetManager,
    ConfigurationError,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    ShareExhaustedError,
)
from dp_icl_plugin.accounting import get_accountant
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder

WORDS = ["a", "b", "c", "d", "e", "Text:", "Label:", "user:", "assistant:", "system:", "<eos>"]


def data(n: int = 40) -> PrivateDataset:
    rng = np.random.default_rng(0)
    return PrivateDataset([PrivateRecord(" ".join(rng.choice(list("abcde"), 3)), "ab"[i % 2]) for i in range(n)])


class Counting(FakeBackend):
    """Counts forward passes, so tests can see that nothing ran before a charge."""

    calls = 0

    def next_token_logprobs(self, prompts):  # type: ignore[override]
        Counting.calls += 1
        return super().next_token_logprobs(prompts)

    def start(self, prompts):  # type: ignore[override]
        Counting.calls += 1
        return super().start(prompts)


def backend() -> FakeBackend:
    return Counting(WORDS, eos_token="<eos>", seed=3)


def mozo(budget: BudgetManager, **kw) -> MozoDecoder:
    return MozoDecoder(
        data(), backend=backend(), budget=budget, **{"n_queries": 5, "max_tokens": 4, "epsilon": 2.0, "top_k": 6, **kw}
    )


def clip(budget: BudgetManager, **kw) -> ClipBlendDecoder:
    return ClipBlendDecoder(
        data(),
        backend=backend(),
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


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_the_calibrated_share_pays_for_exactly_n_queries_answers(make) -> None:
    ledger = BudgetManager(PrivacyBudget(2.0, 1 / 40))
    decoder = make(ledger)
    rng = np.random.default_rng(0)
    for _ in range(5):
        decoder.generate("a b", rng=rng)
    assert get_accountant("auto").epsilon(decoder.answer_event(4), delta=1 / 40) > 0
    assert ledger.spent().epsilon <= 2.0
    before = Counting.calls
    with pytest.raises(BudgetExhaustedError):
        next(decoder.stream("a b", rng=rng))  # a sixth answer does not fit: refused before any forward pass
    assert Counting.calls == before and len(ledger.history()) == 5


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_a_share_without_delta_costs_its_epsilon_at_the_ledgers_delta(make) -> None:
    # δ defaulted to 1/|D|: five answers of an epsilon=2 share cost more than 2 on a ledger with a smaller δ
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-3))
    decoder = make(ledger)
    assert decoder.delta == 1e-3
    rng = np.random.default_rng(0)
    for _ in range(5):
        decoder.generate("a b", rng=rng)
    assert 1.9 < ledger.spent().epsilon <= 2.0
    with pytest.raises(ShareExhaustedError):  # the share is spent although the ledger has room
        decoder.generate("a b", rng=rng)
    assert len(ledger.history()) == 5 and decoder.answers_left == 0


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_each_answer_is_charged_its_worst_case_before_the_first_token(make) -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger)
    stream = decoder.stream("a b", rng=np.random.default_rng(0), max_tokens=3)
    assert ledger.history() == []  # nothing happens until the stream is read
    pieces = list(stream)
    assert len(ledger.history()) == 1 and ledger.history()[0].event == decoder.answer_event(3)
    assert isinstance("".join(pieces), str)


def test_the_ledgers_on_charge_hook_has_the_entry_before_the_first_token() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    order: list[str] = []
    ledger.on_charge(lambda entry: order.append(f"charged {entry.label}" * (entry in ledger.history())))
    for _ in mozo(ledger).stream("a b", rng=np.random.default_rng(0), max_tokens=3):
        order.append("token")
    assert order[0] == "charged mozo-answer" and order[1:] == ["token"] * (len(order) - 1) and len(order) > 1


def test_stop_sequences_cut_and_end_the_answer() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = mozo(ledger, max_tokens=12)
    full = decoder.generate("a b", rng=np.random.default_rng(5))
    assert full.finish_reason in ("stop", "length")
    if full.text.strip():
        stop = full.text.strip().split()[0]
        cut = decoder.generate("a b", rng=np.random.default_rng(5), stop=[stop])
        assert stop not in cut.text and cut.finish_reason == "stop"
        streamed = "".join(decoder.stream("a b", rng=np.random.default_rng(5), stop=[stop]))
        assert streamed == cut.text


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_fixed_seed_gives_identical_answers_and_chats_work(make) -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    a = make(ledger).generate(
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b c"}], rng=np.random.default_rng(9)
    )
    b = make(ledger).generate(
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b c"}], rng=np.random.default_rng(9)
    )
    assert a.token_ids == b.token_ids and a.text == b.text


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: d.generate("", rng=np.random.default_rng(0)), "empty"),
        (
            lambda d: d.generate(
                [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], rng=np.random.default_rng(0)
            ),
            "last message",
        ),
        (lambda d: d.generate([{"role": "robot", "content": "a"}], rng=np.random.default_rng(0)), "role"),
        (lambda d: d.generate("a", rng=np.random.default_rng(0), max_tokens=99), "exceeds"),
        (lambda d: d.generate("a", rng=np.random.default_rng(0), stop="x"), "stop"),
        (lambda d: d.generate("a", rng=None), "rng"),
        (lambda d: d.stream("", rng=np.random.default_rng(0)), "empty"),
    ],
)
def test_bad_input_is_refused_before_any_charge(call, message) -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    with pytest.raises(ConfigurationError, match=message):
        call(mozo(ledger))
    assert ledger.history() == []


def test_bad_construction() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    with pytest.raises(ConfigurationError, match="exactly one"):
        mozo(ledger, beta=0.1)
    with pytest.raises(ConfigurationError, match="n_shots"):
        mozo(ledger, n_shots=100)
    with pytest.raises(ConfigurationError, match="BudgetManager"):
        MozoDecoder(data(), backend=backend(), budget=None, n_queries=1, epsilon=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="exactly one"):
        clip(ledger, temperature=1.0)


@pytest.mark.parametrize("kind", [MozoDecoder, ClipBlendDecoder])
def test_a_chat_on_a_model_without_a_chat_template_uses_the_documented_plain_layout(kind: type) -> None:
    """Fallback when the tokenizer has no chat template: ``role: content`` lines, then ``assistant:``; a
    record enters as one earlier user/assistant exchange after the system message."""
    seen: list[list[int]] = []

    class Recording(FakeBackend):
        def next_token_logprobs(self, prompts):  # type: ignore[override]
            seen.extend(list(p) for p in prompts)
            return super().next_token_logprobs(prompts)

        def start(self, prompts):  # type: ignore[override]
            seen.extend(list(p) for p in prompts)
            return super().start(prompts)

    fake = Recording(WORDS, eos_token="<eos>", seed=3)
    assert not fake.has_chat_template
    extra = {"subset_size": 10, "rng_subset": np.random.default_rng(1)} if kind is ClipBlendDecoder else {"top_k": 6}
    decoder = kind(
        data(),
        backend=fake,
        budget=BudgetManager(PrivacyBudget(100.0, 1e-2)),
        n_queries=5,
        max_tokens=1,
        epsilon=2.0,
        **extra,
    )
    decoder.generate(
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b c"}], rng=np.random.default_rng(0)
    )
    zero_shot = fake.encode("system: a\nuser: b c\nassistant:", add_special_tokens=True)
    assert zero_shot in seen
    one_shot = [p for p in seen if p != zero_shot]
    assert one_shot and all(fake.decode(p).startswith("system: a user:") for p in one_shot)
    assert all(fake.decode(p).endswith("user: b c assistant:") for p in one_shot)


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_a_paused_stream_does_not_block_other_answers(make) -> None:
    """A stream read partly and left open (a reader paused between tokens) holds no lock: another answer in
    the same thread completes, and the paused one then resumes and matches an unshared run."""
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger, max_tokens=4)
    paused = decoder.stream("a b", rng=np.random.default_rng(7))
    first = next(paused, "")
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(decoder.generate("c d", rng=np.random.default_rng(8)).text))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "an answer waited on a paused stream"
    assert len(done) == 1 and len(ledger.history()) == 2
    rest = first + "".join(paused)
    alone = make(BudgetManager(PrivacyBudget(100.0, 1e-2)), max_tokens=4).generate("a b", rng=np.random.default_rng(7))
    assert rest == alone.text  # interleaving changed nothing of either answer


@pytest.mark.parametrize("make", [mozo, clip], ids=["mozo", "clip-blend"])
def test_many_interleaved_streams_all_finish_as_if_alone(make) -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    decoder = make(ledger, max_tokens=4, n_queries=8)
    streams = [decoder.stream("a b", rng=np.random.default_rng(i), max_tokens=4) for i in range(8)]
    texts = [""] * 8
    live = set(range(8))
    while live:  # one piece of each in turn
        for i in sorted(live):
            piece = next(streams[i], None)
            if piece is None:
                live.discard(i)
            else:
                texts[i] += piece
    alone = make(BudgetManager(PrivacyBudget(100.0, 1e-2)), max_tokens=4, n_queries=8)
    assert texts == [alone.generate("a b", rng=np.random.default_rng(i)).text for i in range(8)]
    assert len(ledger.history()) == 8


def test_named_constructors_build_the_decoder_the_keywords_build() -> None:
    """Config objects: a budget share and the mechanism's settings, through with_epsilon beside an explicit β or τ
    (with_beta, with_temperature); the same decoder, the same answers for the same rng."""
    from dp_icl_plugin import BudgetShare, ClipBlendSettings, MozoSettings

    share = BudgetShare(epsilon=2.0, n_queries=5, max_tokens=4)
    built = [
        (
            MozoDecoder.with_epsilon(
                data(),
                share,
                backend=backend(),
                budget=BudgetManager(PrivacyBudget(1e4, 1e-3)),
                settings=MozoSettings(top_k=6),
            ),
            mozo(BudgetManager(PrivacyBudget(1e4, 1e-3))),
        ),
        (
            MozoDecoder.with_beta(
                data(),
                0.3,
                n_queries=5,
                max_tokens=4,
                backend=backend(),
                budget=BudgetManager(PrivacyBudget(1e4, 1e-3)),
                settings=MozoSettings(top_k=6),
            ),
            mozo(BudgetManager(PrivacyBudget(1e4, 1e-3)), epsilon=None, beta=0.3),
        ),
        (
            ClipBlendDecoder.with_epsilon(
                data(),
                share,
                settings=ClipBlendSettings(subset_size=10),
                rng_subset=np.random.default_rng(1),
                backend=backend(),
                budget=BudgetManager(PrivacyBudget(1e4, 1e-3)),
            ),
            clip(BudgetManager(PrivacyBudget(1e4, 1e-3))),
        ),
        (
            ClipBlendDecoder.with_temperature(
                data(),
                3.0,
                n_queries=5,
                max_tokens=4,
                settings=ClipBlendSettings(subset_size=10),
                rng_subset=np.random.default_rng(1),
                backend=backend(),
                budget=BudgetManager(PrivacyBudget(1e4, 1e-3)),
            ),
            clip(BudgetManager(PrivacyBudget(1e4, 1e-3)), epsilon=None, temperature=3.0),
        ),
    ]
    for named, keywords in built:
        assert named.answer_event() == keywords.answer_event() and named.n_queries == keywords.n_queries
        a = named.generate("a b", rng=np.random.default_rng(7))
        b = keywords.generate("a b", rng=np.random.default_rng(7))
        assert a.token_ids == b.token_ids


def test_config_objects_refuse_wrong_types_and_values_before_anything_is_charged() -> None:
    from dp_icl_plugin import BudgetShare, ClipBlendSettings, ConfigurationTypeError, MozoSettings

    with pytest.raises(TypeError):
        BudgetShare(epsilon="2", n_queries=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as caught:
        BudgetShare(epsilon=-1.0, n_queries=5)
    assert not isinstance(caught.value, TypeError)  # a wrong value, not a wrong type
    with pytest.raises(ConfigurationError, match="exceeds population_size"):
        ClipBlendSettings(subset_size=20, population_size=10)
    with pytest.raises(ConfigurationTypeError):
        MozoSettings(n_shots=2.5)  # type: ignore[arg-type]
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-3))
    with pytest.raises(ConfigurationTypeError, match="BudgetShare"):
        MozoDecoder.with_epsilon(data(), (2.0, 5), backend=backend(), budget=ledger)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationTypeError, match="ClipBlendSettings"):
        ClipBlendDecoder.with_epsilon(
            data(),
            BudgetShare(2.0, 5),
            settings={"subset_size": 10},
            rng_subset=np.random.default_rng(1),  # type: ignore[arg-type]
            backend=backend(),
            budget=ledger,
        )
    assert ledger.history() == []
