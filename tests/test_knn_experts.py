"""Expert decoding (KNNExpertDecoder): who pays and how much, the fixed divisor, idle records, the budget
filling after ``uses`` answers, the signal the experts carry, bad input before any charge, both adapters."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_knn_retriever import BagEmbedder

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget
from dp_icl_plugin.accounting import FilteredReleaseEvent, IndividualBudget, rdp
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.decoding import knn_experts
from dp_icl_plugin.decoding.knn_experts import KNNExpertDecoder, expert_scores
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from dp_icl_plugin.retrieval.retriever import EXPERT_CLIP, token_epsilon_for_uses
from dp_icl_plugin.templates.answer import AnswerTemplate

VOCAB = ["q", "t", "u", "plain", "rare", "a", "b", "c", "<eos>"]
ID = {w: i for i, w in enumerate(VOCAB)}
TEMPLATE = AnswerTemplate(example="{text} {label} ", query="{input}", stop=None, stop_at_eos=False)


def backend() -> FakeBackend:
    """Zero-shot after ``q`` favours ``a``; a prompt whose demonstration is labelled ``rare`` favours ``b``."""
    zero = np.array([1e-3] * len(VOCAB))
    zero[ID["a"]] = 0.9
    rare = np.array([1e-6] * len(VOCAB))
    rare[ID["b"]] = 1.0
    return FakeBackend(
        VOCAB,
        table={(ID["q"],): zero / zero.sum(), (ID["rare"], ID["q"]): rare / rare.sum()},
        eos_token="<eos>",
        chat_template=True,
    )


def build(labels: list[str], *, texts: list[str] | None = None, config: KNNConfig | None = None, epsilon=4.0):
    index = PrivateIndex(budget=IndividualBudget(epsilon=epsilon, delta=1e-5), embedder=BagEmbedder())
    index.add(texts or ["q"] * len(labels), labels=labels)
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    cfg = config or KNNConfig(k=8, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=3)
    knn = PrivateKNN(index, budget=ledger, backend=backend(), config=cfg, releases=("decode",))
    return index, ledger, KNNExpertDecoder(knn, template=TEMPLATE)


def test_every_candidate_pays_its_own_tokens_and_the_ledger_records_a_filtered_release() -> None:
    index, ledger, decoder = build(["rare"] * 3 + ["plain"] * 3, texts=["q"] * 6)
    index.add(["u"], labels=["plain"])  # not similar to the query "q": no candidate, pays nothing
    answer = decoder.generate("q", rng=np.random.default_rng(0), max_tokens=2)
    entry = ledger.history()[-1]
    assert answer.ledger_entry == entry.id and entry.label.startswith("knn-decode:")
    assert isinstance(entry.event, FilteredReleaseEvent)
    one_token = ev.ExponentialMechanismEvent(decoder.token_epsilon, neighbouring="add_remove")
    assert entry.event.per_unit == ev.SelfComposedEvent(one_token, 2)
    spent = index.filter.epsilon_spent(np.arange(1, 8))  # records 1..6 are the candidates, 7 is not
    assert np.all(spent[:6] > 0) and spent[6] == 0
    curve, _ = index.filter.spent(np.array([1]))
    orders = np.asarray(index.filter.budget.orders)
    np.testing.assert_allclose(curve[0], 2 * rdp.bounded_range_rdp(orders, decoder.token_epsilon), rtol=1e-12)


def test_uses_answers_fill_a_records_budget_and_the_next_answer_is_made_without_it() -> None:
    index, _, decoder = build(["rare"])
    for seed in range(2):  # uses = 2 answers of max_answer_tokens = 3 tokens
        decoder.generate("q", rng=np.random.default_rng(seed))
    before = index.filter.spent(np.array([1]))[0].copy()
    decoder.generate("q", rng=np.random.default_rng(2))  # the record is out of budget: not charged, no expert
    np.testing.assert_array_equal(index.filter.spent(np.array([1]))[0], before)
    eps0 = token_epsilon_for_uses(index.filter.budget, uses=2, tokens=3)
    assert eps0 == pytest.approx(decoder.token_epsilon)
    assert not bool(
        np.any(6.001 * rdp.bounded_range_rdp(np.asarray(index.filter.budget.orders), eps0) <= index.filter.budget.caps)
    )  # the calibration is tight


def test_the_divisor_is_k_whatever_the_number_of_experts(monkeypatch) -> None:
    seen = []
    real = knn_experts.expert_token

    def spy(private, public, **kw):
        seen.append((len(private), kw["divisor"]))
        return real(private, public, **kw)

    monkeypatch.setattr(knn_experts, "expert_token", spy)
    _, _, decoder = build(["rare", "plain"])
    decoder.generate("q", rng=np.random.default_rng(0), max_tokens=1)
    assert seen == [(2, 8)]


def test_a_unit_with_several_candidates_pays_for_as_many_experts_capped_at_k() -> None:
    _, _, decoder = build(["plain"])
    knn = decoder.knn
    for c in (1, 3, 8, 50):
        event = knn._event("decode", c, 8, 4)
        assert event.event.epsilon == pytest.approx(decoder.token_epsilon * min(c, 8)) and event.count == 4


def test_the_clip_and_temperature_spend_exactly_the_token_epsilon() -> None:
    _, _, decoder = build(["plain"])
    clip, tau = decoder.clip, decoder.temperature
    assert clip == EXPERT_CLIP and 2 * clip / (decoder.k * tau) == pytest.approx(decoder.token_epsilon)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 12),
    n=st.integers(0, 12),
    v=st.integers(2, 9),
    c=st.floats(0.1, 8.0),
    tau=st.floats(0.05, 5.0),
    t0=st.floats(0.1, 2.0),
    seed=st.integers(0, 2**31),
)
def test_swapping_one_expert_moves_the_token_distribution_by_at_most_eps0(k, n, v, c, tau, t0, seed) -> None:
    """The pure-DP claim of one token: |log p(x) − log p′(x)| ≤ ε0 = 2c/(kτ) for every x, whatever the rows."""
    n = min(n, k)
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 10, size=(n + 1, v))
    public = rng.normal(0, 3, size=v)

    def logp(private: np.ndarray) -> np.ndarray:
        z = expert_scores(private, public, clip=c, divisor=k, temperature=tau, public_temperature=t0)
        return z - np.logaddexp.reduce(z)

    base = logp(rows[:n])
    eps0 = 2 * c / (k * tau)
    for other in (rows[1 : n + 1], rows[: n - 1] if n else rows[:0]):  # one row swapped, or one row gone
        if len(other) == len(rows[:n]) and n == 0:
            continue
        assert np.max(np.abs(logp(other) - base)) <= eps0 * (1 + 1e-9) + 1e-12


def test_records_without_an_output_sit_idle_but_pay() -> None:
    index, _, decoder = build(["plain"])
    index.add(["q"], labels=[None])
    _, admitted = decoder._charge("q", 1)
    assert len(admitted) == 2 and len(decoder._experts(admitted)) == 1
    assert np.all(index.filter.epsilon_spent(np.arange(1, 3)) > 0)


def test_no_record_can_fail_an_answer_after_its_charge() -> None:
    """A record whose prompt cannot be built, or whose row has nothing finite (or NaN) on the support, sits
    idle: the answer goes on over the others, as it would without that record."""
    _, _, decoder = build(["rare", "plain"])
    _, admitted = decoder._charge("q", 1)
    experts = decoder._experts(admitted)
    experts.append(PrivateRecord("not-a-word", "rare"))  # the fake tokenizer rejects it
    assert len(decoder._expert_prompts("q", experts, 0)) == 2
    rows = np.log(np.full((4, len(VOCAB)), 1.0 / len(VOCAB)))
    rows[2] = -np.inf
    rows[3, 0] = np.nan
    with_bad = expert_scores(rows[1:], rows[0], clip=1.0, divisor=8, temperature=1.0, public_temperature=1.0)
    without = expert_scores(rows[1:2], rows[0], clip=1.0, divisor=8, temperature=1.0, public_temperature=1.0)
    np.testing.assert_array_equal(with_bad, without)


def test_the_decoder_keeps_the_retrievers_fixed_latency_and_add_remove_needs_public_uses() -> None:
    index, _, decoder = build(["rare"])
    timed = PrivateKNN(
        index,
        budget=decoder.knn.budget,
        backend=decoder.backend,
        config=decoder.knn.config,
        fixed_latency=0.01,
        releases=("decode",),
    )
    assert KNNExpertDecoder(timed).fixed_latency is not None
    from dp_icl_plugin import PrivateDataset
    from dp_icl_plugin.decoding.knn_experts import build_expert_decoder

    ledger = BudgetManager(PrivacyBudget(8.0, 1e-4, neighbouring="add_remove"))
    data = PrivateDataset.from_pairs(["q"] * 4, ["rare"] * 4)
    with pytest.raises(ConfigurationError, match="population_size"):
        build_expert_decoder(backend(), data, budget=ledger, epsilon=2.0, n_queries=10, embedder=BagEmbedder())
    assert ledger.history() == []


@pytest.mark.parametrize(
    "bad", [{"fixed_latency": -1.0}, {"fixed_latency": "x"}, {"template": "not a template"}], ids=str
)
def test_the_decoders_own_settings_are_refused_before_the_filters_cover(bad: dict) -> None:
    """Cold review of issue 40: these were refused by KNNExpertDecoder after PrivateKNN had charged the cover."""
    from dp_icl_plugin import PrivateDataset
    from dp_icl_plugin.decoding.knn_experts import build_expert_decoder

    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    data = PrivateDataset.from_pairs(["q"] * 4, ["rare"] * 4)
    with pytest.raises(ConfigurationError):
        build_expert_decoder(
            backend(), data, budget=ledger, epsilon=2.0, n_queries=10, uses=2, embedder=BagEmbedder(), **bad
        )
    assert ledger.history() == []


def test_weak_experts_are_warned_about_before_the_cover_and_once() -> None:
    from dp_icl_plugin import PrivateDataset
    from dp_icl_plugin.decoding.knn_experts import build_expert_decoder
    from dp_icl_plugin.errors import WeakReleaseWarning

    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    seen: list[int] = []  # the ledger's length when each warning was given
    original = warnings.showwarning

    def show(message, category, *args, **kwargs):  # type: ignore[no-untyped-def]
        if category is WeakReleaseWarning:
            seen.append(len(ledger.history()))

    data = PrivateDataset.from_pairs(["q"] * 4, ["rare"] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            build_expert_decoder(
                backend(), data, budget=ledger, epsilon=0.05, n_queries=1000, uses=50, embedder=BagEmbedder()
            )
        finally:
            warnings.showwarning = original
    assert seen == [0]  # once, with nothing charged yet
    assert [e.label.split(":")[0] for e in ledger.history()] == ["knn-filter"]


def test_experts_that_agree_move_the_answer_where_zero_shot_would_not_go() -> None:
    # 8 experts labelled "rare" (favouring b); zero-shot favours a. A generous budget: the signal shows.
    # (a public row at T0 = 0.5: at the default 0.1 its 6.8-nat preference for a becomes 68 nats)
    config = KNNConfig(k=8, shards=1, min_similarity=0.5, uses=1, max_answer_tokens=1, expert_public_temperature=0.5)
    _, _, decoder = build(["rare"] * 8, config=config, epsilon=8.0)
    _, _, empty = build(["plain"] * 8, config=config, epsilon=8.0)
    rng = np.random.default_rng(1)
    draws = {"rare": [], "plain": []}
    for name, dec in (("rare", decoder), ("plain", empty)):
        _, admitted = dec._charge("q", 1)
        prompts = [dec._ids("q", None)] + [dec._ids("q", r) for r in dec._experts(admitted)]
        rows = dec.backend.next_token_logprobs(prompts)
        draws[name] = [dec._token(rows, rng) for _ in range(400)]
    share = {k: float(np.mean(np.asarray(v) == ID["b"])) for k, v in draws.items()}
    assert share["plain"] < 0.05 < 0.5 < share["rare"], share  # 400 draws: far outside sampling error


def test_bad_input_is_refused_before_any_charge() -> None:
    _, ledger, decoder = build(["rare"])
    n = len(ledger.history())
    with pytest.raises(ConfigurationError, match="exceeds"):
        decoder.check("q", max_tokens=4)
    with pytest.raises(ConfigurationError):
        decoder.check("")
    with pytest.raises(ConfigurationError, match="release must be one of vote, classify, answer"):
        decoder.knn.retrieve("q", release="decode")  # expert decoding charges through its decoder only
    with pytest.raises(ConfigurationError, match="nor a backend"):  # it could release nothing
        PrivateKNN(decoder.knn.index, budget=ledger, config=decoder.knn.config)
    votes_only = PrivateKNN(decoder.knn.index, budget=ledger, config=decoder.knn.config, labels=["a", "b"])
    with pytest.raises(ConfigurationError, match="backend"):
        KNNExpertDecoder(votes_only)
    assert len(ledger.history()) == n
    assert math.isfinite(decoder.token_epsilon)


def test_expert_decoding_serves_the_langchain_chat_model_and_the_llama_index_llm() -> None:
    pytest.importorskip("langchain_dp_icl")
    pytest.importorskip("llama_index.llms.dp_icl")
    from langchain_dp_icl import ChatDPICL
    from llama_index.llms.dp_icl import DPICL

    _, ledger, decoder = build(["rare"] * 4 + ["plain"] * 4)
    chat = ChatDPICL(decoder=decoder, seed=0)
    assert isinstance(chat.invoke("q").content, str)
    llm = DPICL(decoder=decoder, seed=0)
    assert isinstance(llm.complete("q").text, str)
    assert sum(e.label.startswith("knn-decode:") for e in ledger.history()) == 2
