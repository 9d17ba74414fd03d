"""Sparse expert decoding: the sparse-vector test (AboveThreshold), what an answer is charged (P paid tokens and P
test runs, whatever its length), the calibration, free public tokens where the experts agree with the public row,
and bad settings refused before any charge."""

from __future__ import annotations

import numpy as np
import pytest
from test_knn_experts import ID, TEMPLATE, backend
from test_knn_retriever import BagEmbedder

from dp_icl_plugin import BudgetManager, ConfigurationError, PrivacyBudget
from dp_icl_plugin.accounting import IndividualBudget, rdp
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.decoding.knn_experts import KNNExpertDecoder, expert_margin, expert_scores
from dp_icl_plugin.mechanisms.sparse_vector import AboveThreshold
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from dp_icl_plugin.retrieval.retriever import token_epsilon_for_uses


def build(labels: list[str], *, paid: int = 1, tokens: int = 4, epsilon: float = 8.0, **settings):
    index = PrivateIndex(budget=IndividualBudget(epsilon=epsilon, delta=1e-5), embedder=BagEmbedder())
    index.add(["q"] * len(labels), labels=labels)
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    config = KNNConfig(
        k=8,
        shards=1,
        min_similarity=0.5,
        uses=1,
        max_answer_tokens=tokens,
        expert_public_temperature=0.5,
        expert_paid_tokens=paid,
        **settings,
    )
    knn = PrivateKNN(index, budget=ledger, backend=backend(), config=config, releases=("decode",))
    return index, ledger, KNNExpertDecoder(knn, template=TEMPLATE)


def test_a_query_at_the_threshold_is_above_half_the_time_and_far_below_almost_never() -> None:
    # ν − ρ is symmetric about 0: a value exactly at T passes with probability 1/2 (3σ of 4,000 draws: ±0.024)
    rng = np.random.default_rng(0)
    at = [AboveThreshold(threshold=2.0, scale=0.5, positives=1, rng=rng).above(2.0) for _ in range(4000)]
    assert abs(np.mean(at) - 0.5) < 0.024
    # 30 nats below T with b = 0.5: P ≤ e^{-30/(4·0.5)}·(…) < 1e-5 per query
    test = AboveThreshold(threshold=2.0, scale=0.5, positives=1, rng=rng)
    assert not any(test.above(-28.0) for _ in range(2000))


def test_a_stream_gives_at_most_its_positives_then_refuses_more_queries() -> None:
    test = AboveThreshold(threshold=0.0, scale=0.1, positives=3, rng=np.random.default_rng(1))
    assert [test.above(50.0) for _ in range(3)] == [True, True, True]
    assert test.spent and test.given == 3
    with pytest.raises(ConfigurationError, match="every positive"):
        test.above(50.0)


@pytest.mark.parametrize(
    "bad",
    [{"threshold": float("inf")}, {"scale": 0.0}, {"positives": 0}, {"rng": 3}],
)
def test_the_sparse_vector_state_refuses_bad_settings(bad: dict) -> None:
    kwargs = {"threshold": 1.0, "scale": 1.0, "positives": 1, "rng": np.random.default_rng(0), **bad}
    with pytest.raises(ConfigurationError):
        AboveThreshold(**kwargs)


def test_the_margin_moves_by_at_most_eps0_when_one_expert_is_swapped() -> None:
    rng = np.random.default_rng(3)
    clip, k, tau, t0 = 4.0, 5, 0.7, 0.5
    eps0 = 2 * clip / (k * tau)
    for _ in range(300):
        rows = rng.normal(0, 10, size=(k + 1, 6))
        public = rng.normal(0, 3, size=6)
        greedy = int(np.argmax(public))
        margins = [
            expert_margin(
                expert_scores(r, public, clip=clip, divisor=k, temperature=tau, public_temperature=t0), greedy
            )
            for r in (rows[:k], rows[1:], rows[: k - 1])  # one swapped, one gone
        ]
        assert abs(margins[1] - margins[0]) <= eps0 * (1 + 1e-9)
        assert abs(margins[2] - margins[0]) <= eps0 * (1 + 1e-9)


def test_an_answer_is_charged_its_paid_tokens_and_test_runs_whatever_its_length() -> None:
    _, ledger, decoder = build(["rare"] * 3, paid=2, tokens=6)
    decoder.generate("q", rng=np.random.default_rng(0))
    eps0, a = decoder.token_epsilon, decoder.knn.config.expert_test_ratio
    per_unit = ledger.history()[-1].event.per_unit
    expected = ev.compose(
        ev.SelfComposedEvent(ev.ExponentialMechanismEvent(eps0, neighbouring="add_remove"), 2),
        ev.SelfComposedEvent(ev.PureDPEvent(a * eps0, neighbouring="add_remove"), 2),
    )
    assert per_unit == expected
    # a unit with 3 candidate records swaps 3 experts: both parts scale by 3
    three = decoder.knn._event("decode", 3, 8, 6)
    assert rdp.event_rdp(three)[3] == pytest.approx(
        2
        * (
            rdp.bounded_range_rdp([rdp.DEFAULT_ORDERS[3]], 3 * eps0)[0]
            + rdp.pure_dp_rdp([rdp.DEFAULT_ORDERS[3]], 3 * a * eps0)[0]
        )
    )
    # fewer token decisions than paid tokens: no more runs than decisions
    assert decoder.knn._event("decode", 1, 8, 1) == ev.compose(
        ev.ExponentialMechanismEvent(eps0, neighbouring="add_remove"),
        ev.PureDPEvent(a * eps0, neighbouring="add_remove"),
    )


def test_the_token_epsilon_is_calibrated_tightly_for_paid_tokens_and_their_tests() -> None:
    index, _, decoder = build(["plain"], paid=2, tokens=6)
    budget = index.filter.budget
    eps0 = token_epsilon_for_uses(budget, uses=1, tokens=2, test_ratio=2.0)
    assert eps0 == pytest.approx(decoder.token_epsilon)
    orders = np.asarray(budget.orders)

    def cost(e: float) -> np.ndarray:
        return 2 * (rdp.bounded_range_rdp(orders, e) + rdp.pure_dp_rdp(orders, 2 * e))

    assert np.any(cost(eps0) <= budget.caps) and not np.any(cost(eps0 * 1.001) <= budget.caps)
    # a test run costs about 16 bounded-range tokens at a = 2 (pure 2ε0 against ε0²/8 per order), 17 with its paid
    # token: sparse pays off
    # where an answer is long against its paid tokens, e.g. 2 paid of 25 (2.2x the dense ε0 at ε = 4), not 2 of 6
    four = IndividualBudget(epsilon=4.0, delta=1e-5)
    dense, sparse = (
        token_epsilon_for_uses(four, uses=1, tokens=25),
        token_epsilon_for_uses(four, uses=1, tokens=2, test_ratio=2.0),
    )
    assert sparse > 2 * dense
    assert eps0 < token_epsilon_for_uses(budget, uses=1, tokens=6)


def test_experts_that_agree_with_the_public_row_leave_the_greedy_answer_and_departing_ones_are_paid() -> None:
    # zero-shot favours a; experts labelled "rare" favour b (a margin of up to c/τ nats), "plain" ones follow a
    rng = np.random.default_rng(5)
    for labels, departs in ((["plain"] * 8, False), (["rare"] * 8, True)):
        _, _, decoder = build(labels, paid=1, tokens=4, epsilon=16.0)
        _, admitted = decoder._charge("q", 4)
        prompts = [decoder._ids("q", None)] + [decoder._ids("q", r) for r in decoder._experts(admitted)]
        rows = decoder.backend.next_token_logprobs(prompts)
        firsts, paid = [], []
        for _ in range(300):
            test = decoder._sparse_test(rng)
            firsts.append(decoder._token(rows, rng, test))
            paid.append(test.given)
        share_b, share_paid = float(np.mean(np.asarray(firsts) == ID["b"])), float(np.mean(paid))
        if departs:
            assert share_paid > 0.6 and share_b > 0.6, (share_paid, share_b)  # 79 % here; 300 draws: ±0.07 at 3σ
        else:  # only the test's false positives pay (about 3 % at the default threshold), and they draw a anyway
            assert share_paid < 0.1 and share_b < 0.05, (share_paid, share_b)


def test_after_its_paid_tokens_an_answer_continues_with_the_public_greedy_tokens() -> None:
    _, _, decoder = build(["rare"] * 8, paid=1, tokens=4, epsilon=16.0)
    rng = np.random.default_rng(2)
    test = decoder._sparse_test(rng)
    while not test.spent:
        test.above(1e3)
    rows = np.full((9, len(backend().vocab)), -50.0)
    rows[0, ID["a"]] = -0.01
    rows[1:, ID["b"]] = 0.0  # every expert wants b: no test is asked any more, a is emitted
    assert decoder._token(rows, rng, test) == ID["a"]


@pytest.mark.parametrize(
    "bad",
    [
        {"expert_paid_tokens": 0},
        {"expert_test_ratio": 0.0},
        {"expert_test_ratio": 1e-310, "expert_test_threshold": 1.0},  # a noise scale of inf: charged, then failing
        {"expert_test_threshold": float("nan")},
    ],
)
def test_bad_sparse_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ConfigurationError):
        KNNConfig(**bad)


def test_the_default_threshold_is_three_noise_scales() -> None:
    assert KNNConfig(expert_paid_tokens=2).expert_test_threshold == pytest.approx(6.0)
    assert KNNConfig(expert_paid_tokens=2, expert_test_ratio=4.0).expert_test_threshold == pytest.approx(3.0)


def test_a_step_with_one_public_token_asks_no_test() -> None:
    from dp_icl_plugin.decoding.knn_experts import sparse_step

    test = AboveThreshold(threshold=-1e6, scale=1.0, positives=1, rng=np.random.default_rng(0))
    assert sparse_step(np.array([0.0]), test, np.random.default_rng(1)) == 0 and test.given == 0
    assert sparse_step(np.array([0.0, 1.0]), test, np.random.default_rng(1)) in (0, 1) and test.given == 1
