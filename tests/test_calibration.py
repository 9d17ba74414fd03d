"""Calibration never overshoots and returns the extreme grid value (or a tolerance-tight bisection point)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import get_accountant
from dp_icl_plugin.accounting.calibration import (
    CalibrationResult,
    calibrate,
    calibrate_adadpsyn,
    calibrate_clip_blend_temperature,
    calibrate_mozo,
    calibrate_subsampled_gaussian,
)
from dp_icl_plugin.accounting.events import ADD_REMOVE, REPLACE_ONE
from dp_icl_plugin.errors import CalibrationError, ConfigurationError

RDP = get_accountant("rdp")
GRID = 0.01
# Wide enough that every drawn target is reachable: q = 1, 50 steps, ε = 0.5, δ = 1e-6 needs σ ≈ 75.
LO, HI = 0.1, 200.0
SIGNAL_LO, SIGNAL_HI = 0.005, 10.0  # inverse noise multipliers

targets = st.floats(min_value=0.5, max_value=8.0)
rates = st.floats(min_value=1e-3, max_value=1.0)
step_counts = st.integers(min_value=1, max_value=50)
deltas = st.sampled_from([1e-6, 1e-5, 1 / 1600, 1e-3])


def _noise_event(sampling_rate: float, steps: int):
    """ε non-increasing in the noise multiplier."""
    return lambda sigma: me.tang_event(noise_multiplier=sigma, sampling_rate=sampling_rate, steps=steps)


def _signal_event(sampling_rate: float, steps: int):
    """ε non-decreasing in the parameter (an inverse noise multiplier)."""
    return lambda x: me.tang_event(noise_multiplier=1.0 / x, sampling_rate=sampling_rate, steps=steps)


def _eps(make_event, x: float, delta: float) -> float:
    return RDP.epsilon(make_event(x), delta=delta)


def _on_grid(x: float, lo: float, grid: float) -> bool:
    k = round((x - lo) / grid)
    return k >= 0 and abs(lo + k * grid - x) < 1e-9


@pytest.mark.slow  # about 25 RDP calibrations of ~23 curves each: 20-60 s
@settings(max_examples=25, deadline=None)
@given(targets, rates, step_counts, deltas)
def test_smallest_on_grid_meets_target_and_is_smallest(epsilon: float, q: float, steps: int, delta: float) -> None:
    make = _noise_event(q, steps)
    result = calibrate(make, epsilon=epsilon, delta=delta, lo=LO, hi=HI, grid=GRID, accountant="rdp")
    assert isinstance(result, CalibrationResult)
    assert (result.delta, result.accountant) == (delta, "rdp")
    assert _on_grid(result.value, LO, GRID)
    assert LO - 1e-12 <= result.value <= HI + 1e-12
    assert result.epsilon == _eps(make, result.value, delta)
    assert result.epsilon <= epsilon
    below = round(result.value - GRID, 12)
    if below >= LO - 1e-12:
        assert _eps(make, below, delta) > epsilon
    else:
        assert result.value == pytest.approx(LO)


@pytest.mark.slow  # about 25 RDP calibrations of ~23 curves each: 20-60 s
@settings(max_examples=25, deadline=None)
@given(targets, rates, step_counts, deltas)
def test_largest_on_grid_meets_target_and_is_largest(epsilon: float, q: float, steps: int, delta: float) -> None:
    make = _signal_event(q, steps)
    lo, hi = SIGNAL_LO, SIGNAL_HI
    result = calibrate(make, epsilon=epsilon, delta=delta, lo=lo, hi=hi, grid=GRID, find="largest", accountant="rdp")
    assert _on_grid(result.value, lo, GRID)
    assert result.epsilon <= epsilon
    above = round(result.value + GRID, 12)
    if above <= hi + 1e-12:
        assert _eps(make, above, delta) > epsilon
    else:
        assert result.value == pytest.approx(hi)


@pytest.mark.slow  # about 25 RDP calibrations of ~23 curves each: 20-60 s
@settings(max_examples=25, deadline=None)
@given(targets, rates, step_counts, deltas, st.sampled_from(["smallest", "largest"]))
def test_bisection_meets_target_within_tolerance(epsilon: float, q: float, steps: int, delta: float, find: str) -> None:
    make = _noise_event(q, steps) if find == "smallest" else _signal_event(q, steps)
    lo, hi, tol = (LO, HI, 1e-4) if find == "smallest" else (SIGNAL_LO, SIGNAL_HI, 1e-4)
    result = calibrate(make, epsilon=epsilon, delta=delta, lo=lo, hi=hi, find=find, tolerance=tol, accountant="rdp")
    assert lo <= result.value <= hi
    assert result.epsilon <= epsilon
    # One tolerance further in the "cheaper" direction must fail the target (unless at the range's end).
    step = -tol if find == "smallest" else tol
    beyond = result.value + step
    if lo <= beyond <= hi:
        assert _eps(make, beyond, delta) > epsilon
    else:
        assert result.value == pytest.approx(lo if find == "smallest" else hi, abs=tol)


def test_grid_returns_low_end_when_everything_meets() -> None:
    make = _noise_event(0.01, 1)
    result = calibrate(make, epsilon=8.0, delta=1e-5, lo=5.0, hi=6.0, grid=0.1, accountant="rdp")
    assert result.value == 5.0
    result = calibrate(
        _signal_event(0.01, 1), epsilon=8.0, delta=1e-5, lo=0.1, hi=0.2, grid=0.01, find="largest", accountant="rdp"
    )
    assert result.value == pytest.approx(0.2)


def test_grid_with_a_single_point() -> None:
    result = calibrate(_noise_event(0.01, 1), epsilon=8.0, delta=1e-5, lo=5.0, hi=5.05, grid=0.1, accountant="rdp")
    assert result.value == 5.0


@pytest.mark.parametrize("grid", [None, 0.01])
def test_calibration_error_when_range_cannot_meet_target(grid) -> None:
    with pytest.raises(CalibrationError):
        calibrate(_noise_event(1.0, 100), epsilon=0.01, delta=1e-5, lo=0.3, hi=0.5, grid=grid, accountant="rdp")
    with pytest.raises(CalibrationError):
        calibrate(
            _signal_event(1.0, 100),
            epsilon=0.01,
            delta=1e-5,
            lo=2.0,
            hi=3.0,
            grid=grid,
            find="largest",
            accountant="rdp",
        )


def test_calibration_error_is_a_configuration_error() -> None:
    assert issubclass(CalibrationError, ConfigurationError)


GOOD = dict(epsilon=1.0, delta=1e-5, lo=0.3, hi=3.0, accountant="rdp")


@pytest.mark.parametrize(
    "overrides",
    [
        dict(lo=3.0, hi=0.3),
        dict(lo=1.0, hi=1.0),
        dict(lo=math.nan),
        dict(hi=math.nan),
        dict(hi=math.inf),
        dict(lo=-math.inf),
        dict(lo="0.3"),
        dict(epsilon=0.0),
        dict(epsilon=-1.0),
        dict(epsilon=math.nan),
        dict(epsilon=math.inf),
        dict(delta=0.0),
        dict(delta=1.0),
        dict(delta=math.nan),
        dict(find="middle"),
        dict(grid=0.0),
        dict(grid=-0.01),
        dict(grid=math.nan),
        dict(grid=1e-300),  # 10^300 points: refused at once, never materialised or searched
        dict(tolerance=0.0),
        dict(tolerance=-1e-6),
        dict(accountant="moments"),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_bad_inputs_raise_configuration_error(overrides) -> None:
    with pytest.raises(ConfigurationError):
        calibrate(_noise_event(0.01, 10), **{**GOOD, **overrides})


@pytest.mark.parametrize(
    ("function", "kwargs"),
    [
        (calibrate_subsampled_gaussian, dict(epsilon=1.0, delta=1e-5, sampling_rate=0.0, steps=10)),
        (calibrate_subsampled_gaussian, dict(epsilon=1.0, delta=1e-5, sampling_rate=0.1, steps=0)),
        (calibrate_subsampled_gaussian, dict(epsilon=-1.0, delta=1e-5, sampling_rate=0.1, steps=10)),
        (
            calibrate_adadpsyn,
            dict(epsilon=1.0, delta=1e-5, sampling_rate=0.1, steps=10, t_hat=0, sigma0=10.0, sigma2=3.0),
        ),
        (
            calibrate_adadpsyn,
            dict(epsilon=1.0, delta=1e-5, sampling_rate=0.1, steps=10, t_hat=1, sigma0=0.0, sigma2=3.0),
        ),
        (calibrate_mozo, dict(epsilon=1.0, delta=1e-5, sampling_rate=0.1, steps=10, order=1.0)),
        (calibrate_mozo, dict(epsilon=1.0, delta=2.0, sampling_rate=0.1, steps=10, order=4)),
        (calibrate_clip_blend_temperature, dict(epsilon=1.0, delta=1e-5, clip=-1.0, subset_size=10, steps=10)),
    ],
)
def test_named_calibrations_validate(function, kwargs) -> None:
    with pytest.raises(ConfigurationError):
        function(**kwargs)


def test_subsampled_gaussian_with_rdp_meets_target_and_is_smallest() -> None:
    kwargs = dict(epsilon=2.0, delta=1e-5, sampling_rate=0.01, steps=100, accountant="rdp")
    result = calibrate_subsampled_gaussian(**kwargs)
    assert result.accountant == "rdp"
    assert result.epsilon <= 2.0
    make = _noise_event(0.01, 100)
    assert _eps(make, round(result.value - 0.01, 12), 1e-5) > 2.0
    assert calibrate_subsampled_gaussian(**kwargs) is result  # cached


def test_mozo_beta_is_the_largest_within_tolerance() -> None:
    kwargs = dict(epsilon=2.0, delta=1e-5, sampling_rate=0.001, steps=200, order=8)
    result = calibrate_mozo(**kwargs)
    assert result.epsilon <= 2.0
    beyond = me.mozo_event(beta=result.value + 1e-6, order=8, sampling_rate=0.001, steps=200)
    assert RDP.epsilon(beyond, delta=1e-5) > 2.0


def test_clip_blend_temperature_is_the_smallest_within_tolerance() -> None:
    kwargs = dict(epsilon=4.0, delta=1e-5, clip=10.0, subset_size=50, steps=64)
    result = calibrate_clip_blend_temperature(**kwargs)
    assert result.epsilon <= 4.0
    event = me.clip_blend_event(clip=10.0, subset_size=50, temperature=result.value, steps=64)
    assert get_accountant("auto").epsilon(event, delta=1e-5) == pytest.approx(result.epsilon, rel=1e-9)
    # A clearly smaller temperature overshoots.
    colder = me.clip_blend_event(clip=10.0, subset_size=50, temperature=result.value * (1 - 1e-3), steps=64)
    assert get_accountant("auto").epsilon(colder, delta=1e-5) > 4.0


def test_clip_blend_replace_one_needs_twice_the_temperature() -> None:
    """Replace-one doubles ε0 = c/(sτ), so the same guarantee needs τ twice as large."""
    kwargs = dict(epsilon=4.0, delta=1e-5, clip=10.0, subset_size=50, steps=64)
    add_remove = calibrate_clip_blend_temperature(**kwargs, neighbouring=ADD_REMOVE)
    replace_one = calibrate_clip_blend_temperature(**kwargs)  # replace-one is the default
    assert replace_one.epsilon <= 4.0
    assert replace_one.value == pytest.approx(2 * add_remove.value, rel=1e-3)
    assert calibrate_clip_blend_temperature(**kwargs, neighbouring=REPLACE_ONE) == replace_one


def test_calibration_result_is_consistent_with_the_event_factory() -> None:
    """The ε reported is that of the returned value's event, at the requested δ."""
    make = _noise_event(0.05, 20)
    result = calibrate(make, epsilon=1.5, delta=1e-6, lo=0.3, hi=5.0, grid=0.05, accountant="rdp")
    assert result.epsilon == RDP.epsilon(make(result.value), delta=1e-6)
    # Not some other δ:
    assert result.epsilon != RDP.epsilon(make(result.value), delta=1e-3)


def test_calibrate_accepts_an_accountant_instance() -> None:
    make = _noise_event(0.05, 20)
    by_name = calibrate(make, epsilon=1.5, delta=1e-6, lo=0.3, hi=5.0, grid=0.05, accountant="rdp")
    by_instance = calibrate(make, epsilon=1.5, delta=1e-6, lo=0.3, hi=5.0, grid=0.05, accountant=RDP)
    assert by_name == by_instance


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_a_tolerance_below_float_resolution_still_terminates() -> None:
    result = calibrate(_noise_event(0.01, 10), **{**GOOD, "tolerance": 1e-300})
    assert result.epsilon <= GOOD["epsilon"]


def test_adadpsyn_says_when_goodradius_and_coverage_alone_spend_the_budget() -> None:
    """TREC's smallest label (86 records, 20 drawn a token: rate 0.233) over 24 tokens at the default σ0 = 10,
    σ2 = 3: those steps alone cost ε ≈ 8.43 at δ = 1e-5, so no σ1 meets ε = 4 and the error says why."""
    from dp_icl_plugin.accounting.calibration import calibrate_adadpsyn
    from dp_icl_plugin.errors import CalibrationError

    with pytest.raises(CalibrationError, match=r"alone cost epsilon=8\.4\d? over 24 tokens"):
        calibrate_adadpsyn(
            epsilon=4.0, delta=1e-5, sampling_rate=20 / 86, steps=24, t_hat=1, sigma0=10.0, sigma2=3.0, labels_touched=2
        )
    fits = calibrate_adadpsyn(
        epsilon=9.0, delta=1e-5, sampling_rate=20 / 86, steps=24, t_hat=1, sigma0=10.0, sigma2=3.0, labels_touched=2
    )
    assert fits.epsilon <= 9.0
