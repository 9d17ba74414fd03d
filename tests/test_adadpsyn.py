"""AdaDPSyn (Gao et al., ICLR 2025): the aggregation mechanisms, the synthesizer on FakeBackend, a tiny GPT-2."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests_support import steps_of

from dp_icl_plugin import (
    PRESETS,
    BudgetManager,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PromptTemplate,
)
from dp_icl_plugin.accounting import calibrate_adadpsyn
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.errors import BudgetExhaustedError, CalibrationError, ConfigurationError, UnsupportedEventError
from dp_icl_plugin.mechanisms import adadpsyn_aggregation as mech
from dp_icl_plugin.synthesis.adadpsyn import AdaDPSynConfig, AdaDPSynSynthesizer

VOCAB = ["/", *[f"w{i}" for i in range(40)]]
TEMPLATE = PromptTemplate(header="/ ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False)
HALF_SQRT2 = math.sqrt(2.0) / 2.0
FAST = settings(max_examples=60, deadline=None)


class CountingRNG(np.random.Generator):
    """A Generator that records the scale and size of every normal draw (to compare with the event)."""

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.PCG64(seed))
        self.normals: list[tuple[float, object]] = []

    def normal(self, loc=0.0, scale=1.0, size=None):  # type: ignore[no-untyped-def, override]
        self.normals.append((float(scale), size))
        return super().normal(loc, scale, size)


def _simplex_points(seed: int, m: int, k: int, concentration: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(k, concentration), size=m)


def _clustered(seed: int, m: int, k: int, spread: float) -> np.ndarray:
    """M probability vectors within ℓ2 distance spread·√2 of a common base point."""
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.ones(k))
    others = rng.dirichlet(np.ones(k), size=m)
    weights = rng.uniform(0.0, spread, size=(m, 1))
    return (1.0 - weights) * base + weights * others


def _threshold_radius(points: np.ndarray, t: int) -> float:
    """min{r : L(r) ≥ t}, by brute force over the pairwise distances (L only steps there)."""
    diff = points[:, None, :] - points[None, :, :]
    candidates = np.unique(np.concatenate([[0.0], np.sqrt(np.einsum("ijk,ijk->ij", diff, diff)).ravel()]))
    return float(next(r for r in candidates if mech.good_radius_score(points, r, t=t) >= t))


# ---------------------------------------------------------------------------------------------- GoodRadius


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(2, 8), st.floats(0.0, 50.0), st.floats(0.005, 1.0))
def test_good_radius_stays_in_range(seed: int, m: int, k: int, sigma0: float, theta: float) -> None:
    points = _simplex_points(seed, m, k, concentration=0.3)
    t = 1 + seed % m
    r = mech.good_radius(points, t=t, sigma0=sigma0, theta=theta, rng=np.random.default_rng(seed))
    assert 0.0 <= r <= HALF_SQRT2


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(2, 8), st.floats(0.005, 0.5))
def test_noiseless_good_radius_is_within_half_a_tolerance_of_the_threshold(
    seed: int, m: int, k: int, theta: float
) -> None:
    points = _simplex_points(seed, m, k, concentration=0.3)
    t = 1 + seed % m
    r = mech.good_radius(points, t=t, sigma0=0.0, theta=theta, rng=np.random.default_rng(0))
    target = min(_threshold_radius(points, t), HALF_SQRT2)
    assert abs(r - target) <= theta / 2 + 1e-12


def test_good_radius_on_constructed_point_sets() -> None:
    rng = np.random.default_rng(0)
    a, b = np.array([0.5, 0.5, 0.0]), np.array([0.5, 0.5 - 0.4 / math.sqrt(2), 0.4 / math.sqrt(2)])
    assert np.linalg.norm(a - b) == pytest.approx(0.4)
    # 5 points at a, 5 at b: a ball around any point holds 8 of 10 only from r = ‖a − b‖ = 0.4 on
    two_groups = np.array([a] * 5 + [b] * 5)
    assert mech.good_radius_score(two_groups, 0.39, t=8) == 5 and mech.good_radius_score(two_groups, 0.41, t=8) == 8
    assert abs(mech.good_radius(two_groups, t=8, sigma0=0.0, theta=0.1, rng=rng) - 0.4) <= 0.05
    # 8 identical points and 2 outliers: the 8 fit in a ball of radius 0
    eight_and_two = np.array([a] * 8 + [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert mech.good_radius(eight_and_two, t=8, sigma0=0.0, theta=0.1, rng=rng) <= 0.05
    # the vertices of the simplex are √2 apart: no ball of radius ≤ √2/2 around a point holds two
    vertices = np.eye(10)
    assert mech.good_radius(vertices, t=2, sigma0=0.0, theta=0.1, rng=rng) >= HALF_SQRT2 - 0.05


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(2, 6), st.floats(0.0, 1.5), st.floats(0.01, 1.0))
def test_sensitivities_under_replacing_one_point(seed: int, m: int, k: int, r: float, radius: float) -> None:
    """Replace-one: the score moves by ≤ 2, the count by ≤ 1, the sum of projected points by ≤ 2R."""
    points = _simplex_points(seed, m, k, concentration=0.3)
    other = points.copy()
    other[seed % m] = _simplex_points(seed + 1, 1, k, concentration=0.3)[0]
    centre = _simplex_points(seed + 2, 1, k)[0]
    t = 1 + (seed // 7) % m
    score_change = mech.good_radius_score(points, r, t=t) - mech.good_radius_score(other, r, t=t)
    assert abs(score_change) <= mech.SCORE_SENSITIVITY
    assert abs(mech.coverage_count(points, centre, r) - mech.coverage_count(other, centre, r)) <= 1
    sums = [mech.project_to_ball(p, centre, radius).sum(axis=0) for p in (points, other)]
    assert np.linalg.norm(sums[0] - sums[1]) <= 2 * radius * (1 + 1e-12)


@pytest.mark.parametrize("theta", [0.01, 0.1, 0.3, 1.0])
def test_good_radius_makes_exactly_the_charged_queries(theta: float) -> None:
    rng = CountingRNG(1)
    mech.good_radius(_simplex_points(0, 10, 5), t=8, sigma0=10.0, theta=theta, rng=rng)
    assert len(rng.normals) == 2 * me.good_radius_steps(theta)
    assert all(scale == 20.0 for scale, _ in rng.normals)  # std 2σ0: sensitivity 2, multiplier σ0


# ---------------------------------------------------------------------------------------------- projected mean


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(2, 12), st.floats(0.001, 1.0))
def test_projection_and_projected_mean_lie_in_the_ball(seed: int, m: int, k: int, radius: float) -> None:
    points = _simplex_points(seed, m, k, concentration=0.5)
    centre = _simplex_points(seed + 1, 1, k)[0]
    projected = mech.project_to_ball(points, centre, radius)
    assert np.all(np.linalg.norm(projected - centre, axis=1) <= radius * (1 + 1e-12))
    inside = np.linalg.norm(points - centre, axis=1) <= radius
    np.testing.assert_array_equal(projected[inside], points[inside])
    mean = mech.noisy_mean(projected, radius=radius, sigma1=0.0, rng=np.random.default_rng(0), centre=centre)
    assert np.linalg.norm(mean - centre) <= radius * (1 + 1e-12)
    np.testing.assert_allclose(mean, projected.mean(axis=0))


def test_noisy_mean_refuses_rows_outside_the_domain_of_its_sensitivity() -> None:
    rng = np.random.default_rng(0)
    points = np.eye(3)
    with pytest.raises(ConfigurationError, match="ball"):
        mech.noisy_mean(points, radius=0.5, sigma1=1.0, rng=rng, centre=np.full(3, 1 / 3))
    with pytest.raises(ConfigurationError, match="√2/2"):
        mech.noisy_mean(points, radius=0.5, sigma1=1.0, rng=rng)
    with pytest.raises(ConfigurationError, match="probability"):
        mech.noisy_mean(2 * points, radius=HALF_SQRT2, sigma1=1.0, rng=rng)


@FAST
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=20))
def test_to_simplex_gives_a_probability_vector_with_the_same_argmax(values: list[float]) -> None:
    v = np.array(values)
    p = mech.to_simplex(v)
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    if v.max() > 0:
        assert v[np.argmax(p)] == v.max()
    else:
        np.testing.assert_array_equal(p, np.full(v.size, 1 / v.size))


# ---------------------------------------------------------------------------------------------- one token


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 15), st.integers(2, 30), st.integers(1, 3))
def test_noiseless_release_is_the_argmax_of_the_plain_mean_on_clustered_points(
    seed: int, m: int, k: int, t_hat: int
) -> None:
    points = _clustered(seed, m, k, spread=0.01)  # diameter ≤ 0.03 < 0.044, GoodRadius's smallest output at θ = 0.1
    mean = points.mean(axis=0)
    top = np.sort(mean)
    assume(top[-1] - top[-2] > 1e-9)
    release = mech.release_token(points, sigma0=0.0, sigma1=0.0, sigma2=0.0, t_hat=t_hat, rng=np.random.default_rng(0))
    assert release.index == int(np.argmax(mean))
    np.testing.assert_allclose(release.distribution, mean / mean.sum(), atol=1e-12)


def test_noiseless_release_pulls_an_outlier_into_the_ball() -> None:
    """Without noise, R shrinks to GoodRadius's r and an outlier is projected into the ball around the mean."""
    cluster = _clustered(3, 9, 5, spread=0.001)
    centre = cluster.mean(axis=0)
    direction = np.eye(5)[int(np.argmin(centre))] - centre
    outlier = centre + 0.3 * direction / np.linalg.norm(direction)  # on the simplex, 0.3 from the cluster
    points = np.vstack([cluster, outlier])
    release = mech.release_token(points, sigma0=0.0, sigma1=0.0, sigma2=0.0, t_hat=1, rng=np.random.default_rng(0))
    assert release.rounds == 1 and release.means == 2 and release.radius == release.target_radius < 0.05
    plain = points.mean(axis=0)
    assert np.linalg.norm(plain - centre) == pytest.approx(0.03, abs=1e-3)
    assert np.linalg.norm(release.distribution - centre) < 0.01


@pytest.mark.parametrize("t_hat", [1, 2, 3])
def test_release_token_draws_exactly_the_noise_of_the_event(t_hat: int) -> None:
    """Per token, at most the event's queries, each with the event's std: 2σ0, 2Rσ1 (R ≤ √2/2) and σ2."""
    sigma0, sigma1, sigma2, theta = 10.0, 0.5, 3.0, 0.1
    steps = me.good_radius_steps(theta)
    for seed in range(20):
        rng = CountingRNG(seed)
        points = _clustered(seed, 10, 20, spread=0.05)
        release = mech.release_token(
            points, sigma0=sigma0, sigma1=sigma1, sigma2=sigma2, t_hat=t_hat, rng=rng, theta=theta
        )
        search, rest = rng.normals[: 2 * steps], rng.normals[2 * steps :]
        assert all(scale == 2 * sigma0 and size is None for scale, size in search)
        means = [scale for scale, size in rest if size == (20,)]
        counts = [scale for scale, size in rest if size is None]
        assert len(means) == release.means <= t_hat + 1 and len(counts) == release.rounds <= t_hat
        assert means[0] == pytest.approx(2 * HALF_SQRT2 * sigma1)
        assert all(scale <= 2 * HALF_SQRT2 * sigma1 * (1 + 1e-12) for scale in means)
        assert means[-1] == pytest.approx(2 * release.radius * sigma1)
        assert all(scale == sigma2 for scale in counts)


def test_noise_standard_deviations() -> None:
    """Seeded: each noisy step's empirical std is within 4 standard errors (σ/√(2n), n = 20,000) of the
    stated std, and its mean within 4 standard errors (σ/√n) of the exact value."""
    rng = np.random.default_rng(2024)
    points = _clustered(5, 10, 50, spread=0.1)
    centre = points.mean(axis=0)
    radius, sigma0, sigma1, sigma2, n = 0.2, 1.5, 1.3, 3.0, 20_000
    projected = mech.project_to_ball(points, centre, radius)
    means = np.stack(
        [mech.noisy_mean(projected, radius=radius, sigma1=sigma1, rng=rng, centre=centre) for _ in range(n // 50)]
    )
    score = mech.good_radius_score(points, 0.05, t=8)
    count = mech.coverage_count(points, centre, 0.05)
    cases = [
        ((means - projected.mean(axis=0)).ravel() * 10, 2 * radius * sigma1),  # std 2Rσ1 on the sum of M = 10
        (
            np.array([mech.noisy_good_radius_score(points, 0.05, t=8, sigma0=sigma0, rng=rng) for _ in range(n)])
            - score,
            2 * sigma0,
        ),
        (
            np.array([mech.noisy_coverage(points, centre, 0.05, sigma2=sigma2, rng=rng) for _ in range(n)]) - count,
            sigma2,
        ),
    ]
    for residuals, std in cases:
        assert residuals.size == n
        assert abs(residuals.std() - std) < 4 * std / math.sqrt(2 * n)
        assert abs(residuals.mean()) < 4 * std / math.sqrt(n)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"distributions": np.full((3, 4), 0.3)},
        {"distributions": np.array([[0.5, 0.6, -0.1]])},
        {"distributions": np.ones((0, 3))},
        {"t_hat": 0},
        {"rho": 0.0},
        {"mu": 1.5},
        {"lam": -0.1},
        {"sigma1": -1.0},
        {"sigma0": math.inf},
        {"theta": 0.0},
    ],
)
def test_release_token_validates_its_input(kwargs: dict[str, object]) -> None:
    call: dict[str, object] = {
        "distributions": np.full((3, 4), 0.25),
        "sigma0": 1.0,
        "sigma1": 1.0,
        "sigma2": 1.0,
        "t_hat": 1,
        "rng": np.random.default_rng(0),
        **kwargs,
    }
    with pytest.raises(ConfigurationError):
        mech.release_token(**call)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- the synthesizer


def _dataset(n_per_label: int = 60) -> PrivateDataset:
    rng = np.random.default_rng(7)
    records = [
        PrivateRecord(" ".join(f"w{int(t)}" for t in rng.integers(0, 30, size=6)), label)
        for label in ("a", "b")
        for _ in range(n_per_label)
    ]
    return PrivateDataset(records, labels=["a", "b"], public_label_counts="observed")


def _budget(epsilon: float = 10.0) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon=epsilon, delta=1e-3))


def _method(**overrides: object) -> AdaDPSynSynthesizer:
    settings_: dict[str, object] = {
        "n_prompts": 5,
        "records_per_prompt": 2,
        "max_tokens": 6,
        "shots_per_label": 2,
        "top_k": 8,
        "epsilon": 4.0,
        "template": TEMPLATE,
    }
    settings_.update(overrides)
    return AdaDPSynSynthesizer(**settings_)


class RecordingBackend(FakeBackend):
    """FakeBackend that keeps every batch of prompts and log-probabilities."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.prompts: list[list[list[int]]] = []
        self.calls: list[np.ndarray] = []

    def next_token_logprobs(self, prompts: Sequence[object]) -> np.ndarray:  # type: ignore[override]
        out = super().next_token_logprobs(prompts)  # type: ignore[arg-type]
        self.prompts.append([list(p) for p in prompts])  # type: ignore[call-overload]
        self.calls.append(out.copy())
        return out


def test_charged_event_is_the_planned_event() -> None:
    data, budget = _dataset(), _budget()
    method = _method()
    demos = method.synthesize(data, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0))
    (entry,) = budget.history()
    assert entry.event == method.event(data, ledger_delta=budget.budget.delta)
    params = demos.provenance.extra
    # Two labels: a replacement that changes a record's label touches both labels' runs (labels_touched = 2).
    assert entry.event == me.adadpsyn_event(
        sigma0=10.0,
        sigma1=params["sigma1"],
        sigma2=3.0,
        sampling_rate=10 / 60,
        steps=2 * 6,
        t_hat=1,
        theta=0.1,
        labels_touched=2,
    )
    assert params["labels_touched"] == 2 and entry.event.neighbouring == "replace_one"
    assert params["target_delta"] == budget.budget.delta  # the ledger's δ (without a ledger 1/|D|, the paper's)
    assert method.plan(data).params["target_delta"] == 1 / 120
    assert demos.provenance.method == "adadpsyn" and demos.provenance.ledger_entry_id == entry.id
    assert demos.provenance.epsilon == pytest.approx(budget.spent().epsilon)
    assert len(demos) == 4 and demos.labels == ("a", "b")


@pytest.fixture(scope="module")
def agnews_sized() -> PrivateDataset:
    """|D| = 120,000 in 4 labels of 30,000 (AG News)."""
    records = [PrivateRecord("w1", label) for label in "abcd" for _ in range(30_000)]
    return PrivateDataset(records, public_label_counts="observed")


@pytest.mark.parametrize(("epsilon", "lam", "sigma1"), [(1.0, 0.1, 1.23), (2.0, 0.15, 0.92)])
def test_the_method_calibrates_the_published_sigma1(
    agnews_sized: PrivateDataset, epsilon: float, lam: float, sigma1: float
) -> None:
    """Gao et al. Table 13 (AG News: M = 10, N = 2, T_max = 100, T̂ = 1, σ0 = 10, σ2 = 3, δ = 1/|D|).

    The paper's analysis covers swaps that keep the label: one label's run. Generating for one label is
    exactly that (a replacement touches at most that run) and reproduces σ1; generating for all four, a
    replacement may move a record between two runs, and σ1 grows to pay for both."""
    method = AdaDPSynSynthesizer(epsilon=epsilon, lam=lam, template=PRESETS["agnews"])
    plan = method.plan(agnews_sized, labels=["a"])
    expected = calibrate_adadpsyn(
        epsilon=epsilon, delta=1 / 120_000, sampling_rate=20 / 30_000, steps=100, t_hat=1, sigma0=10.0, sigma2=3.0
    )
    assert plan.params["sigma1"] == expected.value == pytest.approx(sigma1, abs=1e-9)
    assert plan.params["target_delta"] == 1 / 120_000 and plan.params["sampling_rate"] == 20 / 30_000
    assert plan.params["calibrated_epsilon"] <= epsilon
    every_label = method.plan(agnews_sized).params
    assert every_label["labels_touched"] == 2 and every_label["sigma1"] > sigma1
    assert (
        every_label["sigma1"]
        == calibrate_adadpsyn(
            epsilon=epsilon,
            delta=1 / 120_000,
            sampling_rate=20 / 30_000,
            steps=100,
            t_hat=1,
            sigma0=10.0,
            sigma2=3.0,
            labels_touched=2,
        ).value
    )


def test_an_add_remove_ledger_refuses_adadpsyn_before_any_charge() -> None:
    budget = BudgetManager(PrivacyBudget(10.0, 1e-3, neighbouring="add_remove"))
    with pytest.raises(UnsupportedEventError, match="replace-one"):
        _method().synthesize(_dataset(), backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0))
    assert budget.history() == []


def test_whether_a_run_happens_never_depends_on_the_observed_label_counts() -> None:
    """Replace-one neighbours: declared {a: 100, b: 100}, D holds 100 of each, D' swaps one b record for an a one
    (101 a). Refusing D' but running D released that count (ε = ∞ for the pair); both must run alike."""
    declared = {"a": 100, "b": 100}
    d = PrivateDataset([PrivateRecord(f"w{i % 30}", y) for y in "ab" for i in range(100)], public_label_counts=declared)
    d_prime = PrivateDataset(
        [PrivateRecord(f"w{i % 30}", "a") for i in range(101)] + [PrivateRecord(f"w{i % 30}", "b") for i in range(99)],
        public_label_counts=declared,
    )
    method = _method(sigma1=1.0, epsilon=None)
    assert method.plan(d).params == method.plan(d_prime).params
    for data in (d, d_prime):
        budget = BudgetManager(PrivacyBudget(100.0, 1e-3))
        demos = method.synthesize(data, backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0))
        assert {d.label for d in demos} == {"a", "b"} and len(budget.history()) == 1


def test_slots_hold_a_uniform_arrangement_of_the_records() -> None:
    from dp_icl_plugin.templates.prompting import fixed_size_subsets, slot_placement

    rng = np.random.default_rng(0)
    over = np.array([slot_placement(40, 39, rng) for _ in range(4000)])  # one record more than slots
    assert (over >= 0).all() and all(len(set(row)) == 39 for row in over[:50])
    left_out = np.bincount([(set(range(40)) - set(row)).pop() for row in over], minlength=40) / len(over)
    assert np.abs(left_out - 1 / 40).max() < 0.015  # each record sits out with probability 1/40 (≈ 6 s.e.)
    records = [PrivateRecord(f"w{i % 30}", "a") for i in range(40)]
    placement = slot_placement(40, 50, rng)
    assert sorted(placement[placement >= 0].tolist()) == list(range(40)) and (placement < 0).sum() == 10
    sizes = [
        sum(
            len(p)
            for p in fixed_size_subsets(
                [(r,) for r in records], placement=placement, n_prompts=5, per_prompt=2, rng=rng
            )
        )
        for _ in range(2000)
    ]
    assert np.mean(sizes) == pytest.approx(10 * 40 / 50, abs=0.1)  # a hypergeometric share of the 10 slots


def test_labels_compose_in_parallel_at_the_smallest_label() -> None:
    data = PrivateDataset(
        [PrivateRecord("w1", "a") for _ in range(40)] + [PrivateRecord("w2", "b") for _ in range(100)],
        public_label_counts="observed",
    )
    method = _method(sigma1=1.0, epsilon=None)
    assert method.event(data).event.sampling_rate == pytest.approx(10 / 40)
    assert method.event(data, labels=["b"]).event.sampling_rate == pytest.approx(10 / 100)
    assert method.plan(data, labels=["b"]).params["target_delta"] == 1 / 140


def test_fixed_seed_gives_identical_demonstrations() -> None:
    data, backend = _dataset(), FakeBackend(VOCAB, seed=3, context_window=4)
    runs = [_method().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(42)) for _ in "ab"]
    assert [d.token_ids for d in runs[0]] == [d.token_ids for d in runs[1]]
    other = _method().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(43))
    assert [d.token_ids for d in other] != [d.token_ids for d in runs[0]]


def test_every_token_draws_fresh_records_without_replacement() -> None:
    records = [PrivateRecord(f"w{i}", "a") for i in range(30)]  # one distinct word per record
    backend = RecordingBackend(VOCAB, seed=3)
    _method(max_tokens=8, shots_per_label=1).synthesize(
        PrivateDataset(records, public_label_counts="observed"),
        backend=backend,
        budget=_budget(),
        rng=np.random.default_rng(0),
    )
    draws = []
    for token, batch in enumerate(steps_of(backend.prompts[1:], public=1)):  # the first call: the pre-flight
        words = [w for prompt in batch[1:] for w in prompt[1 : 1 + 2 * 2 : 2]]  # "/ wA / wB / <generated>"
        assert len(words) == 10 == len(set(words))  # M·N distinct records
        assert all(len(prompt) == 5 + token for prompt in batch[1:])
        draws.append(tuple(words))
    assert len(set(draws)) == len(draws)  # never the same draw twice (no seed reset inside the loop)


def test_noiseless_synthesis_is_the_argmax_of_the_mean_on_clustered_distributions() -> None:
    backend = RecordingBackend(VOCAB, seed=5, context_window=8, scale=0.05)  # private rows differ, but little
    method = _method(top_k=12, max_tokens=5, shots_per_label=1, sigma1=1.0, epsilon=None)
    demos = method.synthesize_nonprivate(_dataset(), labels=["a"], backend=backend, rng=np.random.default_rng(0))
    expected = []
    for batch in steps_of(backend.calls[1:], public=1):
        p = np.exp(batch.astype(np.float64))
        vocab = np.lexsort((np.arange(p.shape[1]), -p[0]))[:12]
        rows = p[1:, vocab] / p[1:, vocab].sum(axis=1, keepdims=True)
        diff = rows[:, None] - rows[None]
        assert np.sqrt((diff**2).sum(-1)).max() < 0.04  # clustered: inside GoodRadius's noiseless r
        assert np.ptp(rows, axis=0).max() > 0  # and not identical
        expected.append(int(vocab[np.argmax(rows.mean(axis=0))]))
    assert list(demos[0].token_ids) == expected
    assert demos.provenance.epsilon == math.inf and demos.provenance.ledger_entry_id is None


def test_a_token_missing_from_the_private_prompts_keeps_its_zero_probability() -> None:
    """The public prompt ("/") favours w1; every private prompt ("… wX /") gives w1 probability 0: w1 must
    not win (the public code gave a missing token probability 1)."""
    public = np.full(len(VOCAB), 1e-3)
    public[VOCAB.index("w1")], public[VOCAB.index("w2")], public[VOCAB.index("w3")] = 0.5, 0.2, 0.1
    private = np.full(len(VOCAB), 1e-3)
    private[VOCAB.index("w1")], private[VOCAB.index("w3")] = 0.0, 0.3
    table = {(0,): public, **{(VOCAB.index(f"w{i}"), 0): private for i in range(30)}}
    backend = FakeBackend(VOCAB, table=table)
    demos = _method(max_tokens=1, shots_per_label=1, top_k=3).synthesize_nonprivate(
        _dataset(), labels=["a"], backend=backend, rng=np.random.default_rng(0)
    )
    assert demos[0].token_ids == (VOCAB.index("w3"),)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: (_method(n_prompts=31, records_per_prompt=2), _dataset(), {}), "without replacement"),
        (lambda: (_method(), PrivateDataset(_dataset().records("a")), {}), "public_label_counts"),
        (lambda: (_method(), _dataset(), {"labels": ["zzz"]}), "unknown label"),
        (lambda: (_method(top_k=500), _dataset(), {}), "top_k"),
        (lambda: (_method(epsilon=1e-4), _dataset(), {}), "cannot meet"),
    ],
)
def test_bad_input_is_refused_before_any_charge(make: object, error: str) -> None:
    method, data, kwargs = make()  # type: ignore[operator]
    budget = _budget()
    with pytest.raises(ConfigurationError, match=error):
        method.synthesize(data, backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0), **kwargs)
    assert budget.history() == []


def test_an_unreachable_target_is_a_calibration_error() -> None:
    with pytest.raises(CalibrationError):
        _method(epsilon=1e-4).plan(_dataset())


def test_budget_too_small_is_refused_and_nothing_is_charged() -> None:
    budget = _budget(epsilon=0.5)
    with pytest.raises(BudgetExhaustedError):
        _method(epsilon=4.0).synthesize(
            _dataset(), backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0)
        )
    assert budget.history() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"epsilon": None},  # neither ε nor σ1
        {"sigma1": 1.0},  # both
        {"sigma0": 0.0},
        {"sigma2": -1.0},
        {"theta": 0.0},
        {"rho": 0.0},
        {"mu": 1.5},
        {"lam": -0.1},
        {"t_hat": 0},
        {"n_prompts": 0},
        {"delta": 1.0},
        {"template": "Text: {text}"},
    ],
)
def test_bad_config_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        _method(**overrides)


def test_config_or_overrides_not_both() -> None:
    with pytest.raises(ConfigurationError):
        AdaDPSynSynthesizer(AdaDPSynConfig(epsilon=1.0), epsilon=2.0)
    assert AdaDPSynSynthesizer(AdaDPSynConfig(epsilon=1.0)).config.lam == 0.2


# ---------------------------------------------------------------------------------------------- a tiny real GPT-2


def test_end_to_end_on_a_tiny_gpt2(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    from dp_icl_plugin.backends.hf import HFBackend
    from dp_icl_plugin.ginc.language import symbol_names
    from dp_icl_plugin.ginc.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=50, n_positions=128, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    build_tokenizer(symbol_names(50), model_max_length=128).save_pretrained(tmp_path)
    backend = HFBackend.from_pretrained(tmp_path, device="cpu", dtype="float32")
    rng = np.random.default_rng(0)
    names = symbol_names(50)
    records = [PrivateRecord(" ".join(names[int(t)] for t in rng.integers(1, 50, size=9)), "c") for _ in range(40)]
    data = PrivateDataset(records, public_label_counts="observed")
    budget = _budget()
    method = AdaDPSynSynthesizer(
        n_prompts=5,
        records_per_prompt=2,
        max_tokens=6,
        shots_per_label=2,
        top_k=10,
        epsilon=4.0,
        template=PRESETS["ginc"],
    )
    demos = method.synthesize(data, backend=backend, budget=budget, rng=rng)
    assert len(demos) == 2 and all(len(d.token_ids) == 6 for d in demos)
    assert all(d.text == " ".join(names[t] for t in d.token_ids) for d in demos)
    assert budget.history()[0].event == method.event(data, ledger_delta=budget.budget.delta)
