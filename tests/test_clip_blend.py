"""Clip-blend (Bhusal et al., Algorithm 1): the mechanism's invariants, the synthesizer on FakeBackend, a tiny GPT-2."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats

from dp_icl_plugin import BudgetManager, FakeBackend, PrivacyBudget, PrivateDataset, PrivateRecord, PromptTemplate
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.calibration import calibrate_clip_blend_temperature
from dp_icl_plugin.errors import BudgetExhaustedError, ConfigurationError
from dp_icl_plugin.mechanisms import clip_blend_sampling as mech
from dp_icl_plugin.synthesis.clip_blend import (
    PAPER_PROMPTS,
    ClipBlendConfig,
    ClipBlendSynthesizer,
    ReencodingSession,
    assign_groups,
    measure_decoding_speedup,
)

VOCAB = ["/", *[f"w{i}" for i in range(40)]]
TEMPLATE = PromptTemplate(header="/ ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False)
CANARY = "w39 w39 w39 w38"
FAST = settings(max_examples=80, deadline=None)


def _dataset(n_per_label: int = 40, labels: Sequence[str] = ("a", "b")) -> PrivateDataset:
    """Records with distinct texts "wI wJ" (I < 20 ≤ J), so prompts can be traced back to records."""
    records = [
        PrivateRecord(f"w{i % 20} w{20 + i // 20 + 10 * j}", label)
        for j, label in enumerate(labels)
        for i in range(n_per_label)
    ]
    return PrivateDataset(records, labels=list(labels), public_label_counts="observed")


def _budget(epsilon: float = 10.0) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon=epsilon, delta=1e-3))


def _method(**overrides: object) -> ClipBlendSynthesizer:
    settings_ = {"max_tokens": 6, "shots_per_label": 2, "epsilon": 2.0, "delta": 1e-3, "template": TEMPLATE}
    settings_.update(overrides)
    return ClipBlendSynthesizer(**settings_)  # type: ignore[arg-type]


class RecordingBackend(FakeBackend):
    """FakeBackend that records every session (its prompts and appends) and every direct batch call."""

    def __init__(self, *args: Any, max_length: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_length is not None:
            self.max_length = max_length
        self.sessions: list[dict[str, Any]] = []
        self.batch_calls = 0

    def next_token_logprobs(self, prompts: Any) -> np.ndarray:
        self.batch_calls += 1
        return super().next_token_logprobs(prompts)

    def start(self, prompts: Any) -> Any:
        session = super().start(prompts)
        record: dict[str, Any] = {"prompts": [list(p) for p in prompts], "appends": 0}
        self.sessions.append(record)
        inner_append = session.append

        def append(token_ids: Any) -> np.ndarray:
            record["appends"] += 1
            return inner_append(token_ids)

        session.append = append  # type: ignore[method-assign]
        return session


# ------------------------------------------------------------------------------------------ the mechanism

_logit_rows = hnp.arrays(
    np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=st.floats(-1e4, 1e4) | st.just(-math.inf)
)


def _with_finite_max(z: np.ndarray) -> np.ndarray:
    z = z.copy()
    z[:, 0] = np.where(np.isfinite(z).any(axis=1), z[:, 0], 0.0)
    return z


@FAST
@given(_logit_rows, st.floats(0.01, 100.0))
def test_clipped_logits_lie_in_range_keep_the_order_and_the_softmax(raw: np.ndarray, c: float) -> None:
    z = _with_finite_max(raw)
    clipped = mech.clip_logits(z, c)
    assert clipped.shape == z.shape and np.all(clipped >= -c) and np.all(clipped <= c)
    assert np.allclose(clipped.max(axis=1), c)  # the row maximum maps to c
    for row, out in zip(z, clipped, strict=True):
        order = np.argsort(row, kind="stable")
        assert np.all(np.diff(out[order]) >= 0)  # monotone: the ranking is kept
        near = row >= row.max() - 2 * c  # entries not floored are only shifted ...
        assert np.allclose(out[near], row[near] - row.max() + c, rtol=0, atol=1e-9 * max(1.0, abs(row.max())))
        if near.all():  # ... so the softmax is unchanged when nothing is floored
            p, q = np.exp(row - row.max()), np.exp(out - c)
            assert np.allclose(p / p.sum(), q / q.sum(), atol=1e-12)


def test_the_floor_lifts_very_unlikely_tokens_the_papers_probability_floor() -> None:
    """The paper says clipping leaves the softmax unchanged; that holds only within 2c of the maximum."""
    z = np.array([0.0, -5.0, -50.0])
    out = mech.clip_logits(z, 10.0)
    assert out.tolist() == [10.0, 5.0, -10.0]


@FAST
@given(
    st.integers(1, 8),  # s
    st.integers(0, 11),  # rows present (may exceed s)
    st.integers(1, 9),  # V
    st.floats(0.1, 50.0),  # c
    st.integers(0, 2**32 - 1),
)
def test_one_prompt_moves_the_blended_scores_by_at_most_c_over_2s(s: int, n: int, v: int, c: float, seed: int) -> None:
    """Lemma 2 with the fixed divisor: add/remove ≤ c/(2s) per entry, replace-one ≤ c/s."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 30, size=(n + 1, v))
    public = rng.normal(0, 30, size=v)
    without = mech.blended_scores(rows[:n], public, clip=c, subset_size=s)
    with_one = mech.blended_scores(rows, public, clip=c, subset_size=s)
    assert np.max(np.abs(with_one - without)) <= c / (2 * s) * (1 + 1e-12)
    if n:
        replaced = np.vstack([rows[: n - 1], rows[n:]])
        assert np.max(np.abs(mech.blended_scores(replaced, public, clip=c, subset_size=s) - without)) <= c / s * (
            1 + 1e-12
        )


@FAST
@given(st.integers(1, 6), st.integers(0, 7), st.floats(0.05, 5.0), st.integers(0, 2**32 - 1))
def test_the_token_distribution_is_eps0_dp_and_eps0_bounded_range(s: int, n: int, tau: float, seed: int) -> None:
    """log Pr_D[x] − log Pr_D'[x] lies in an interval of width ε0 (bounded range), within [−ε0, ε0] (DP)."""
    c, v = 10.0, 7
    rng = np.random.default_rng(seed)
    rows, public = rng.normal(0, 20, size=(n + 1, v)), rng.normal(0, 20, size=v)

    def log_probs(private: np.ndarray) -> np.ndarray:
        x = mech.blended_scores(private, public, clip=c, subset_size=s) / tau
        return x - np.logaddexp.reduce(x)

    for neighbour, relation in (
        (rows[:n], ev.ADD_REMOVE),
        (np.vstack([rows[:n], rng.normal(0, 20, (1, v))]), ev.REPLACE_ONE),
    ):
        loss = log_probs(rows) - log_probs(neighbour)
        eps0 = me.clip_blend_token_epsilon(clip=c, subset_size=s, temperature=tau, neighbouring=relation)
        assert np.max(np.abs(loss)) <= eps0 * (1 + 1e-9)
        assert np.max(loss) - np.min(loss) <= eps0 * (1 + 1e-9)


def test_the_sampler_draws_from_softmax_of_the_scores_over_temperature() -> None:
    """Seeded: 60,000 draws; chi-square statistic below the 0.999 quantile of χ²(V − 1). The same draws
    against the distribution at twice the temperature are rejected far beyond that quantile (power)."""
    scores, tau, n = np.array([2.0, 1.5, 0.0, -1.0, 0.7, -3.0]), 0.8, 60_000
    rng = np.random.default_rng(2024)
    counts = np.bincount(
        [mech.exponential_mechanism(scores, temperature=tau, rng=rng) for _ in range(n)], minlength=scores.size
    )

    def chi2(t: float) -> float:
        p = np.exp(scores / t) / np.exp(scores / t).sum()
        return float(((counts - n * p) ** 2 / (n * p)).sum())

    critical = stats.chi2.ppf(0.999, df=scores.size - 1)
    assert chi2(tau) < critical
    assert chi2(2 * tau) > 10 * critical


def test_zero_weight_tokens_are_never_drawn_and_the_noiseless_token_is_the_argmax() -> None:
    rng = np.random.default_rng(0)
    scores = np.array([0.0, -800.0, 0.0])  # exp(−800/τ) underflows to 0
    assert {mech.exponential_mechanism(scores, temperature=1.0, rng=rng) for _ in range(2000)} == {0, 2}
    private = np.array([[0.0, 3.0, 1.0], [0.0, 2.0, 5.0]])
    public = np.array([4.0, 0.0, 0.0])
    expected = int(np.argmax(mech.blended_scores(private, public, clip=10.0, subset_size=2)))
    token = mech.clip_blend_token(private, public, clip=10.0, subset_size=2, temperature=None, rng=rng)
    assert token == expected


def test_blended_scores_follow_algorithm_1_lines_6_to_8_across_row_blocks() -> None:
    rng = np.random.default_rng(4)
    rows, public, c = rng.normal(0, 20, size=(70, 9)).astype(np.float32), rng.normal(0, 20, size=9), 10.0

    def clip(z: np.ndarray) -> np.ndarray:
        return np.maximum(-c, z - z.max(axis=-1, keepdims=True) + c)

    expected = (clip(rows.astype(np.float64)).sum(axis=0) / 50 + clip(public)) / 2
    assert np.allclose(mech.blended_scores(rows, public, clip=c, subset_size=50), expected, rtol=0, atol=1e-12)


def test_no_private_rows_leave_the_public_scores() -> None:
    public = np.array([1.0, 3.0, -40.0])
    assert np.allclose(
        mech.blended_scores(np.zeros((0, 3)), public, clip=10.0, subset_size=5), mech.clip_logits(public, 10.0) / 2
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: mech.clip_logits(np.array([[np.nan, 0.0]]), 1.0),
        lambda: mech.clip_logits(np.array([[np.inf, 0.0]]), 1.0),
        lambda: mech.clip_logits(np.array([[-np.inf, -np.inf]]), 1.0),
        lambda: mech.clip_logits(np.zeros((2, 0)), 1.0),
        lambda: mech.clip_logits(np.zeros(3), 0.0),
        lambda: mech.blended_scores(np.zeros((2, 3)), np.zeros(4), clip=1.0, subset_size=1),
        lambda: mech.blended_scores(np.zeros(3), np.zeros(3), clip=1.0, subset_size=1),
        lambda: mech.blended_scores(np.zeros((2, 3)), np.zeros(3), clip=1.0, subset_size=0),
        lambda: mech.exponential_mechanism(np.zeros(3), temperature=0.0, rng=np.random.default_rng()),
        lambda: mech.exponential_mechanism(np.array([0.0, np.nan]), temperature=1.0, rng=np.random.default_rng()),
        lambda: mech.exponential_mechanism(np.zeros(3), temperature=1.0, rng=np.random.RandomState(0)),
        lambda: mech.clip_blend_token(
            np.zeros((1, 3)), np.zeros(3), clip=1.0, subset_size=1, temperature=math.inf, rng=np.random.default_rng()
        ),
    ],
)
def test_mechanism_refuses_bad_input(call: Any) -> None:
    with pytest.raises(ConfigurationError):
        call()


# ------------------------------------------------------------------------------------------ the groups


def test_groups_are_disjoint_and_cover_the_records_when_n_is_k_times_s() -> None:
    for seed in range(20):
        groups = assign_groups(24, n_groups=3, subset_size=8, rng=np.random.default_rng(seed), population=24)
        joined = np.concatenate(groups)
        assert len(groups) == 3 and sorted(joined.tolist()) == list(range(24))


def test_each_record_joins_each_group_with_probability_s_over_n() -> None:
    """10,000 seeded assignments of n = 50 records to K = 2 groups of expected size s = 10: every record's
    frequency in each group is within 5 standard errors of s/n = 0.2 (and 'no group' of 0.6)."""
    n, k, s, trials = 50, 2, 10, 10_000
    rng = np.random.default_rng(11)
    hits = np.zeros((k, n))
    for _ in range(trials):
        for g, members in enumerate(assign_groups(n, n_groups=k, subset_size=s, rng=rng, population=n)):
            hits[g, members] += 1
    freq = hits / trials
    se = math.sqrt(0.2 * 0.8 / trials)
    assert np.max(np.abs(freq - s / n)) < 5 * se
    assert (hits.sum(axis=0) <= trials).all()  # disjoint: never in two groups at once


def test_assign_groups_refuses_more_than_the_population() -> None:
    with pytest.raises(ConfigurationError, match="population of at least 12"):
        assign_groups(11, n_groups=3, subset_size=4, rng=np.random.default_rng(0), population=11)


def test_a_records_group_depends_on_its_own_draw_only() -> None:
    """The population is the declared size, not the records present: adding a record (same seed, its draw
    comes last) leaves every other record's group exactly as it was; a label with fewer or more records than
    declared is dealt the same way."""
    for seed in range(20):
        before = assign_groups(30, population=30, n_groups=3, subset_size=10, rng=np.random.default_rng(seed))
        after = assign_groups(31, population=30, n_groups=3, subset_size=10, rng=np.random.default_rng(seed))
        for old, new in zip(before, after, strict=True):
            assert old.tolist() == [i for i in new.tolist() if i < 30]
    assert [
        g.size for g in assign_groups(0, population=30, n_groups=3, subset_size=10, rng=np.random.default_rng(0))
    ] == [0, 0, 0]


# ------------------------------------------------------------------------------------------ accounting


def test_charged_event_is_the_planned_event_and_provenance_reports_both_figures() -> None:
    data, budget = _dataset(), _budget()
    method = _method()
    demos = method.synthesize(data, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0))
    (entry,) = budget.history()
    extra = demos.provenance.extra
    tau, s = extra["temperature"], extra["subset_size"]
    assert s == 20  # ⌊40 / 2⌋
    assert entry.event == method.event(data)
    assert entry.event == me.clip_blend_event(clip=10.0, subset_size=20, temperature=tau, steps=6)
    assert entry.event.neighbouring == "replace_one"  # the ledger's relation
    assert extra["token_epsilon"] == pytest.approx(2 * 10.0 / (20 * tau))  # replace-one: ε0 = 2c/(sτ)
    assert extra["epsilon"] == pytest.approx(tightest().epsilon(entry.event, delta=1e-3)) and extra["epsilon"] <= 2.0
    assert extra["paper_epsilon"] == me.clip_blend_paper_epsilon(
        clip=10.0, subset_size=20, temperature=tau, steps=6, delta=1e-3
    )
    assert demos.provenance.method == "clip_blend" and demos.provenance.ledger_entry_id == entry.id
    assert demos.provenance.epsilon == pytest.approx(budget.spent().epsilon)
    assert len(demos) == 4 and demos.labels == ("a", "b")


def test_temperature_is_the_calibrated_one_and_replace_one_doubles_it() -> None:
    data = _dataset()
    add = _method().plan(data, neighbouring="add_remove").params
    expected = calibrate_clip_blend_temperature(
        epsilon=2.0, delta=1e-3, clip=10.0, subset_size=20, steps=6, neighbouring="add_remove"
    )
    assert add["temperature"] == expected.value and add["calibrated_epsilon"] == expected.epsilon
    rep = _method().plan(data).params  # replace-one: the default
    assert rep["temperature"] == pytest.approx(2 * add["temperature"], rel=1e-4)
    assert _method().event(data) == me.clip_blend_event(
        clip=10.0, subset_size=20, temperature=rep["temperature"], steps=6, neighbouring="replace_one"
    )


def test_disjoint_groups_compose_in_parallel_over_shots_and_labels() -> None:
    """Each record takes part in T tokens: the event has T steps whatever shots_per_label and the labels."""
    data = PrivateDataset(
        [PrivateRecord("w1", "a") for _ in range(30)] + [PrivateRecord("w2", "b") for _ in range(90)],
        public_label_counts="observed",
    )
    for shots in (1, 3):
        method = _method(temperature=1.0, epsilon=None, subset_size=10, shots_per_label=shots)
        assert method.event(data) == me.clip_blend_event(clip=10.0, subset_size=10, temperature=1.0, steps=6)
    assert _method(temperature=1.0, epsilon=None, shots_per_label=3).plan(data).params["subset_size"] == 10
    assert _method(temperature=1.0, epsilon=None, shots_per_label=3).plan(data, ["b"]).params["subset_size"] == 30


def test_explicit_temperature_gives_the_paper_figure_beside_a_smaller_guarantee() -> None:
    """The paper's s = 255, c = 10, τ = 1.048 (App. B), T = 100: the tight ε is below the paper's figure."""
    data = PrivateDataset([PrivateRecord("w1", "a") for _ in range(255)], public_label_counts="observed")
    params = (
        _method(temperature=1.048, epsilon=None, subset_size=255, max_tokens=100, shots_per_label=1, delta=1e-5)
        .plan(data, neighbouring="add_remove")
        .params
    )
    assert params["paper_epsilon"] == pytest.approx(10 * math.sqrt(200 * math.log(1e5)) / (255 * 1.048))
    assert params["epsilon"] < params["paper_epsilon"]


def test_at_a_large_token_epsilon_the_papers_figure_is_below_the_guarantee() -> None:
    """The paper's s = 15, τ = 0.131 (App. B), T = 100: ε0 ≈ 5.09, far from small. Its figure (≈ 244) drops
    the T·ε0(e^ε0 − 1) term and is about half of what the tightest accounting certifies (≈ 448; pure DP
    gives T·ε0 ≈ 509): it is reported, never used as the guarantee."""
    data = PrivateDataset([PrivateRecord("w1", "a") for _ in range(15)], public_label_counts="observed")
    params = (
        _method(temperature=0.131, epsilon=None, subset_size=15, max_tokens=100, shots_per_label=1, delta=1e-5)
        .plan(data, neighbouring="add_remove")
        .params
    )
    assert params["token_epsilon"] == pytest.approx(10 / (15 * 0.131))
    assert params["paper_epsilon"] == pytest.approx(244.2, abs=0.1)
    assert params["epsilon"] > 1.5 * params["paper_epsilon"]


# ------------------------------------------------------------------------------------------ generation


def test_fixed_seed_gives_identical_demonstrations() -> None:
    data, backend = _dataset(), FakeBackend(VOCAB, seed=3)
    runs = [_method().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(42)) for _ in "ab"]
    assert [d.token_ids for d in runs[0]] == [d.token_ids for d in runs[1]]
    other = _method().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(43))
    assert [d.token_ids for d in other] != [d.token_ids for d in runs[0]]


def _record_text(backend: FakeBackend, prompt: list[int]) -> str:
    return backend.decode(prompt).removeprefix("/ ").removesuffix(" /")


def _joined(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each demonstration's two sessions (its public prompt alone, then its group's records) as one session:
    asserts that the public prompt ran apart and that both took the same appends (groups never empty here)."""
    assert len(sessions) % 2 == 0
    joined = []
    for public, records in zip(sessions[0::2], sessions[1::2], strict=True):
        assert len(public["prompts"]) == 1 and public["appends"] == records["appends"]
        joined.append({"prompts": public["prompts"] + records["prompts"], "appends": public["appends"]})
    return joined


def test_each_demonstration_reads_its_own_disjoint_group_and_the_groups_cover_the_label() -> None:
    data, backend = _dataset(n_per_label=40), RecordingBackend(VOCAB, seed=3)
    _method(shots_per_label=2, subset_size=20).synthesize(
        data, backend=backend, budget=_budget(), rng=np.random.default_rng(5)
    )
    generation = _joined(backend.sessions[1:])  # the first session is the public pre-flight
    assert len(generation) == 4
    public = {label: backend.encode(TEMPLATE.public_prompt(label)) for label in ("a", "b")}
    for label, sessions in (("a", generation[:2]), ("b", generation[2:])):
        groups = []
        for session in sessions:
            assert session["prompts"][0] == public[label]
            groups.append({_record_text(backend, p) for p in session["prompts"][1:]})
            assert len(groups[-1]) == len(session["prompts"]) - 1  # one record per prompt, none twice
        assert not groups[0] & groups[1]
        assert groups[0] | groups[1] == {r.text for r in data.records(label)}


def test_decoding_is_incremental_one_position_per_prompt_per_token() -> None:
    backend = RecordingBackend(VOCAB, seed=3)
    _method(max_tokens=7).synthesize(_dataset(), backend=backend, budget=_budget(), rng=np.random.default_rng(1))
    calls_after_preflight = backend.batch_calls
    assert calls_after_preflight == 1  # the base pre-flight's single public probe; generation uses sessions only
    total = 0
    for session in backend.sessions:
        n_prompts = len(session["prompts"])
        lengths = sum(len(p) for p in session["prompts"])
        total += lengths + session["appends"] * n_prompts
    for session in _joined(backend.sessions[1:]):
        assert session["appends"] == 6  # T − 1: the last token needs no forward pass
    probe = len(backend.encode(TEMPLATE.public_prompt("a")))
    assert backend.forward_tokens == probe + total


def test_noiseless_run_is_the_argmax_of_the_blended_scores() -> None:
    data, backend = _dataset(), FakeBackend(VOCAB, seed=9)
    method = _method(temperature=0.5, epsilon=None, subset_size=15)
    demos = method.synthesize_nonprivate(data, backend=backend, rng=np.random.default_rng(3))
    rng = np.random.default_rng(3)  # replay: the rng only deals the groups when the noise is off
    expected = []
    for label in data.labels:
        records = data.records(label)
        public = backend.encode(TEMPLATE.public_prompt(label))
        for group in assign_groups(len(records), n_groups=2, subset_size=15, rng=rng, population=len(records)):
            prompts = [public] + [backend.encode(TEMPLATE.private_prompt(label, [records[int(i)]])) for i in group]
            generated: list[int] = []
            for _ in range(6):
                rows = np.stack([backend.logprobs_after(p + generated) for p in prompts])
                generated.append(int(np.argmax(mech.blended_scores(rows[1:], rows[0], clip=10.0, subset_size=15))))
            expected.append(tuple(generated))
    assert [d.token_ids for d in demos] == expected
    assert math.isinf(demos.provenance.epsilon) and demos.provenance.ledger_entry_id is None


def test_an_empty_group_decodes_from_the_public_prompt_alone() -> None:
    """s = 1, two records, two groups: each record draws a group independently, so one may stay empty."""
    data = _dataset(n_per_label=2, labels=("a",))
    for seed in range(50):
        backend = RecordingBackend(VOCAB, seed=3)
        demos = _method(shots_per_label=2).synthesize(
            data, backend=backend, budget=_budget(), rng=np.random.default_rng(seed)
        )
        public = backend.encode(TEMPLATE.public_prompt("a"))
        starts = [i for i, s in enumerate(backend.sessions) if s["prompts"] == [public]]
        assert starts[0] == 0 and len(starts) == 3  # the pre-flight and one public session per demonstration
        groups = [backend.sessions[starts[1] + 1 : starts[2]], backend.sessions[starts[2] + 1 :]]
        if [] in groups:  # a group drew no record: no records' session (nothing to compute), the demo made
            assert sorted(len(g) for g in groups) == [0, 1] and len(demos) == 2
            assert sum(len(g[0]["prompts"]) for g in groups if g) == 2
            return
    pytest.fail("no seed in 50 left a group empty")  # probability 2^-49


def test_generation_stops_at_eos_and_the_charge_still_covers_t_tokens() -> None:
    probs = np.full(len(VOCAB), 0.1 / (len(VOCAB) - 1))
    probs[VOCAB.index("w7")] = 0.9
    table = {(VOCAB.index("w7"),): np.eye(len(VOCAB))[0], (): probs}  # after w7 comes "/" (EOS)
    backend = FakeBackend(VOCAB, table=table, eos_token="/")
    template = PromptTemplate(header="", example="{text} w3 ", query="w5", stop=None, stop_at_eos=True)
    method = _method(template=template, max_tokens=8, temperature=0.05, epsilon=None)
    budget = _budget(epsilon=1e6)
    demos = method.synthesize(_dataset(), backend=backend, budget=budget, rng=np.random.default_rng(0))
    assert [d.token_ids for d in demos] == [(VOCAB.index("w7"),)] * 4
    assert budget.history()[0].event.count == 8


def test_generation_stops_at_the_stop_string() -> None:
    """Stopping once the decoded text contains ``template.stop`` is post-processing (the text is cut there)."""
    template = PromptTemplate(header="w2 ", example="{text} w3 ", query="w4", stop="/", stop_at_eos=False)
    backend = FakeBackend(VOCAB, seed=1)
    demos = _method(template=template, max_tokens=60, temperature=50.0, epsilon=None).synthesize(
        _dataset(), backend=backend, budget=_budget(epsilon=1e6), rng=np.random.default_rng(0)
    )
    for demo in demos:
        words = backend.decode(demo.token_ids).split()
        assert "/" not in demo.text
        assert len(words) == 60 or (words[-1] == "/" and "/" not in words[:-1])
    assert any(len(d.token_ids) < 60 for d in demos)


def test_prompts_are_cut_so_that_t_tokens_fit_the_context() -> None:
    """Private prompts "/ wI wJ /" (4 tokens) with a 7-token context and T = 5: each keeps its last 3."""
    backend = RecordingBackend(VOCAB, seed=3, max_length=7)
    _method(max_tokens=5).synthesize(_dataset(), backend=backend, budget=_budget(), rng=np.random.default_rng(0))
    for session in _joined(backend.sessions[1:]):
        assert session["appends"] == 4
        assert all(len(p) == 3 and p[-1] == VOCAB.index("/") for p in session["prompts"][1:])  # the query end kept


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: (_method(shots_per_label=3), _dataset(n_per_label=2), {}), "shots_per_label = 3"),
        (lambda: (_method(), PrivateDataset(_dataset().records("a")), {}), "public_label_counts"),
        (lambda: (_method(subset_size=21), _dataset(), {}), "shots_per_label × subset_size = 42"),
        (lambda: (_method(), _dataset(), {"labels": ["zzz"]}), "unknown label"),
        (lambda: (_method(max_tokens=9), _dataset(), {"backend": RecordingBackend(VOCAB, max_length=8)}), "context"),
    ],
)
def test_bad_configuration_is_refused_before_any_charge(make: Any, error: str) -> None:
    method, data, kwargs = make()
    budget = _budget()
    call = {"backend": FakeBackend(VOCAB), "budget": budget, "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(ConfigurationError, match=error) as info:
        method.synthesize(data, **call)
    assert budget.history() == [] and CANARY not in str(info.value)


def test_a_budget_too_small_charges_nothing() -> None:
    small = _budget(epsilon=0.5)
    with pytest.raises(BudgetExhaustedError):
        _method(epsilon=2.0).synthesize(
            _dataset(), backend=FakeBackend(VOCAB), budget=small, rng=np.random.default_rng(0)
        )
    assert small.history() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"epsilon": None},  # neither ε nor τ
        {"temperature": 1.0},  # both
        {"clip": 0.0},
        {"clip": math.nan},
        {"subset_size": 0},
        {"max_tokens": 0},
        {"shots_per_label": 1.5},
        {"delta": 1.0},
        {"template": "Text: {text}"},
        {"public_prompt": "Text: {text}"},
        {"public_prompt": ""},
    ],
)
def test_bad_config_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        _method(**overrides)


@pytest.mark.parametrize("kwargs", [{"rng": 0}, {"backend": object()}, {"budget": None}])
def test_wrong_types_are_configuration_errors(kwargs: dict[str, object]) -> None:
    call = {"backend": FakeBackend(VOCAB), "budget": _budget(), "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(ConfigurationError):
        _method().synthesize(_dataset(), **call)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ClipBlendSynthesizer(ClipBlendConfig(temperature=1.0), max_tokens=3)


def test_paper_prompts_keep_records_out_of_the_public_prompt() -> None:
    for name, prompts in PAPER_PROMPTS.items():
        config = ClipBlendConfig(temperature=1.0, **prompts)
        public = config.public_text("World")
        private = config.template.private_prompt("World", [PrivateRecord(CANARY, "World")])
        assert "World" in public and CANARY not in public, name
        assert CANARY in private and private.endswith(":"), name


# ------------------------------------------------------------------------------------------ cached vs re-encoded


def test_reencoding_session_matches_the_cached_session_on_the_fake_backend() -> None:
    backend = FakeBackend(VOCAB, seed=2)
    prompts = [[0, 3, 4], [0, 5], [7]]
    result = measure_decoding_speedup(backend, prompts, tokens=[1, 2, 3, 4])
    assert result.max_logprob_difference == 0.0 and result.cached_seconds > 0 and result.reencode_seconds > 0
    with ReencodingSession(backend, prompts) as session:
        session.append(np.array([1, 2, 3]))
        assert session.lengths.tolist() == [4, 3, 2]
    with pytest.raises(ConfigurationError):
        session.append(1)


@pytest.mark.slow
def test_end_to_end_on_a_tiny_gpt2_with_cached_decoding_equal_to_reencoding(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    from dp_icl_plugin.backends.hf import HFBackend
    from dp_icl_plugin.ginc.language import symbol_names
    from dp_icl_plugin.ginc.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=50, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    build_tokenizer(symbol_names(50), model_max_length=64).save_pretrained(tmp_path)
    backend = HFBackend.from_pretrained(tmp_path, device="cpu", dtype="float32", micro_batch_size=8)
    names = symbol_names(50)
    rng = np.random.default_rng(0)
    records = [PrivateRecord(" ".join(names[int(t)] for t in rng.integers(1, 50, size=9)), "c") for _ in range(40)]
    data = PrivateDataset(records, public_label_counts="observed")
    from dp_icl_plugin import PRESETS

    method = ClipBlendSynthesizer(epsilon=4.0, delta=1 / 40, max_tokens=10, shots_per_label=2, template=PRESETS["ginc"])
    budget = _budget()
    demos = method.synthesize(data, backend=backend, budget=budget, rng=np.random.default_rng(1))
    assert len(demos) == 2 and all(len(d.token_ids) == 10 for d in demos)
    assert all(d.text == " ".join(names[t] for t in d.token_ids) for d in demos)
    assert budget.history()[0].event == method.event(data)

    class Reencoding:
        """The same backend, but every step re-encodes the prompts (no KV cache)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(backend, name)

        def start(self, prompts: Any) -> ReencodingSession:
            return ReencodingSession(backend, prompts)

    again = method.synthesize(data, backend=Reencoding(), budget=_budget(), rng=np.random.default_rng(1))  # type: ignore[arg-type]
    assert [d.token_ids for d in again] == [d.token_ids for d in demos]

    prompts = [backend.encode(PRESETS["ginc"].public_prompt("c"), add_special_tokens=True)]
    prompts += [backend.encode(PRESETS["ginc"].private_prompt("c", [r]), add_special_tokens=True) for r in records[:12]]
    speed = measure_decoding_speedup(backend, prompts, tokens=demos[0].token_ids)
    assert speed.max_logprob_difference <= 1e-4, speed
    assert speed.cached_seconds > 0 and speed.reencode_seconds > 0


# ------------------------------------------------------------------------------------------ issue 14, defect 1

# The measured case: 100 records of one label, every one with logits (0, −14.03, −13.43); the added record
# (−19.15, −6.46, 0); the public prompt (−19.20, −15.83, 0). With s and τ read from the data (s = 100 vs 101,
# τ recalibrated) one token's log-probabilities moved by 0.379 against a charged ε0 of 0.203 (ε ≈ 2.44 over
# 20 tokens instead of 1).
_ROW, _ADDED, _PUBLIC = np.array([0.0, -14.03, -13.43]), np.array([-19.15, -6.46, 0.0]), np.array([-19.20, -15.83, 0.0])


def _token_logprobs(rows: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    scores = mech.blended_scores(rows, _PUBLIC, clip=10.0, subset_size=params["subset_size"]) / params["temperature"]
    return scores - np.logaddexp.reduce(scores)


@pytest.mark.parametrize("relation", ["add_remove", "replace_one"])
def test_default_clip_blend_on_d_and_d_plus_one_record_stays_within_the_charged_token_epsilon(relation: str) -> None:
    """Regression (issue 14, defect 1): the default ClipBlendSynthesizer(epsilon=1.0, max_tokens=20) on D (100
    records of one label) and D ∪ {x}. The divisor s and τ come from the declared size, so both runs use the
    same s and τ, every record of D joins the group on both, and the largest per-token log-ratio stays within
    the ε0 charged for the relation (the group's membership on D ∪ {x} is that of D plus x: n_y = s = 100)."""
    method = ClipBlendSynthesizer(epsilon=1.0, max_tokens=20)
    d = PrivateDataset([PrivateRecord(f"r{i}", "y") for i in range(100)], public_label_counts={"y": 100})
    d_plus = PrivateDataset([*d.records("y"), PrivateRecord("x", "y")], public_label_counts={"y": 100})
    on_d, on_plus = method.plan(d, neighbouring=relation).params, method.plan(d_plus, neighbouring=relation).params
    assert (
        (on_d["subset_size"], on_d["temperature"])
        == (on_plus["subset_size"], on_plus["temperature"])
        == (100, on_d["temperature"])
    )
    rows = np.tile(_ROW, (100, 1))
    worst = float(np.max(np.abs(_token_logprobs(rows, on_d) - _token_logprobs(np.vstack([rows, _ADDED]), on_plus))))
    assert worst <= on_d["token_epsilon"] * (1 + 1e-12)
    # The claim is what the accountant composes: 20 such tokens within ε = 1 at δ = 1/100.
    assert tightest().epsilon(method.event(d, neighbouring=relation), delta=1 / 100) <= 1.0
    # What the data-derived divisor did (the defect): s = 100 vs 101 and τ recalibrated for each.
    observed = {
        n: method.plan(
            PrivateDataset([PrivateRecord(f"r{i}", "y") for i in range(n)], public_label_counts="observed"),
            neighbouring="add_remove",
        ).params
        for n in (100, 101)
    }
    leak = float(
        np.max(np.abs(_token_logprobs(rows, observed[100]) - _token_logprobs(np.vstack([rows, _ADDED]), observed[101])))
    )
    assert leak == pytest.approx(0.379, abs=2e-3) and leak > observed[100]["token_epsilon"] * 1.8
