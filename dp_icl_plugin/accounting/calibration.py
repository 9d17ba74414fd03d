"""Calibration: the least noise (or the most signal) whose event meets an (ε, δ) target.

A search over a one-parameter event factory. On a grid it returns the smallest (or largest) grid value
meeting the target; without a grid it bisects to ``tolerance``. Either way the returned value was
evaluated and meets the target: calibration never overshoots. Results of the named calibrations are
cached, and every accountant caches its own evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import Accountant, get_accountant
from dp_icl_plugin.accounting.neighbouring import REPLACE_ONE
from dp_icl_plugin.errors import CalibrationError, ConfigurationError

__all__ = [
    "CalibrationResult",
    "calibrate",
    "calibrate_adadpsyn",
    "calibrate_clip_blend_temperature",
    "calibrate_mozo",
    "calibrate_subsampled_gaussian",
]


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated parameter and the ε it achieves at ``delta`` under ``accountant``.

    Attributes:
        value: the calibrated parameter.
        epsilon: the ε it achieves.
        delta: the δ that ε holds at.
        accountant: the accountant's name.
    """

    value: float
    epsilon: float
    delta: float
    accountant: str


MAX_GRID_POINTS = 10**9


def _grid_size(lo: float, hi: float, grid: float) -> int:
    """How many grid points ``lo, lo + grid, …`` lie in ``[lo, hi]`` (refused past MAX_GRID_POINTS)."""
    n = (hi - lo) / grid + 1e-9
    if not n < MAX_GRID_POINTS:
        raise ConfigurationError(f"grid={grid} puts more than {MAX_GRID_POINTS:,} points in [{lo}, {hi}]")
    return math.floor(n) + 1


def _grid_point(lo: float, grid: float, i: int) -> float:
    return round(lo + i * grid, 12)


def calibrate(
    make_event: Callable[[float], ev.DPEvent],
    *,
    epsilon: float,
    delta: float,
    lo: float,
    hi: float,
    find: str = "smallest",
    grid: float | None = None,
    tolerance: float = 1e-6,
    accountant: str | Accountant = "auto",
) -> CalibrationResult:
    """Search ``[lo, hi]`` for the smallest (``find="smallest"``, e.g. a noise multiplier, ε non-increasing
    in the parameter) or largest (``find="largest"``, e.g. β, ε non-decreasing) parameter meeting ε ≤ target.

    Args:
        make_event: the event of a parameter value.
        epsilon: the target ε.
        delta: the δ the target holds at, in (0, 1).
        lo: the search range's lower end.
        hi: the search range's upper end (finite, above ``lo``).
        find: ``"smallest"`` or ``"largest"``.
        grid: search the grid ``lo, lo + grid, …`` instead of bisecting.
        tolerance: the bisection's bracket width (without a grid).
        accountant: the accountant, or its name.

    Raises:
        CalibrationError: no value in range meets the target.
        ConfigurationError: a parameter is out of range, or the grid holds too many points.
    """
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.probability_open("delta", delta)
    lo, hi = check.real("lo", lo), check.real("hi", hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigurationError(f"need finite lo < hi, got [{lo}, {hi}]")
    if find not in ("smallest", "largest"):
        raise ConfigurationError("find must be 'smallest' or 'largest'")
    acc = get_accountant(accountant)

    def eps_at(x: float) -> float:
        return acc.epsilon(make_event(x), delta=delta)

    def meets(x: float) -> bool:
        return eps_at(x) <= epsilon

    # Orient the search so that "good" values are at the high end of `points` / the interval.
    if grid is not None:
        step = check.positive_finite("grid", grid)
        size = _grid_size(lo, hi, step)

        def point(i: int) -> float:  # the i-th point in search order (the grid is never materialised)
            return _grid_point(lo, step, i if find == "smallest" else size - 1 - i)

        if not meets(point(size - 1)):
            raise CalibrationError(
                f"no value in [{lo}, {hi}] meets epsilon={epsilon} at delta={delta}; widen the range"
            )
        bad, good = -1, size - 1  # invariant: point(good) meets; point(bad) does not (or -1)
        while good - bad > 1:
            i = (bad + good) // 2
            bad, good = (bad, i) if meets(point(i)) else (i, good)
        value = point(good)
    else:
        tolerance = check.positive_finite("tolerance", tolerance)
        good_end, bad_end = (hi, lo) if find == "smallest" else (lo, hi)
        if not meets(good_end):
            raise CalibrationError(
                f"no value in [{lo}, {hi}] meets epsilon={epsilon} at delta={delta}; widen the range"
            )
        if meets(bad_end):
            good_end = bad_end
        while abs(good_end - bad_end) > tolerance:
            mid = (good_end + bad_end) / 2
            if mid in (good_end, bad_end):  # adjacent floats: a tolerance below float resolution stops here
                break
            good_end, bad_end = (mid, bad_end) if meets(mid) else (good_end, mid)
        value = good_end
    return CalibrationResult(value=value, epsilon=eps_at(value), delta=delta, accountant=acc.name)


@lru_cache(maxsize=1024)
def calibrate_subsampled_gaussian(
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    grid: float | None = 0.01,
    lo: float = 0.3,
    hi: float = 3.0,
    accountant: str = "auto",
    neighbouring: str = REPLACE_ONE,
) -> CalibrationResult:
    """σ for ``steps`` Poisson-subsampled Gaussian aggregations (Tang et al. / PTA, App. D.3).

    The smallest σ on a 0.01 grid in [0.3, 3.0] (PTA's search) under ``neighbouring`` with the tightest
    accountant (what a ledger of that relation admits). ``accountant="prv", neighbouring="add_remove"``
    is PTA's own calibration (PRV, eps_error 0.01, delta_error 1e-10) and reproduces its Table 4.

    Args:
        epsilon: the target ε.
        delta: the δ the target holds at, in (0, 1).
        sampling_rate: q, the Poisson sampling rate, in (0, 1].
        steps: the aggregations (tokens) composed.
        grid: the grid step (None: bisection).
        lo: the search range's lower end.
        hi: the search range's upper end.
        accountant: the accountant's name.
        neighbouring: the ledger's relation.

    Raises:
        ConfigurationError: a parameter is out of range.
        CalibrationError: no value in the search range meets the target.
    """
    q = check.probability_half_open("sampling_rate", sampling_rate)
    n = check.positive_int("steps", steps)
    return calibrate(
        lambda s: me.tang_event(noise_multiplier=s, sampling_rate=q, steps=n, neighbouring=neighbouring),
        epsilon=epsilon,
        delta=delta,
        lo=lo,
        hi=hi,
        grid=grid,
        accountant=accountant,
    )


@lru_cache(maxsize=1024)
def calibrate_adadpsyn(
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    t_hat: int,
    sigma0: float,
    sigma2: float,
    theta: float = 0.1,
    labels_touched: int = 1,
    grid: float | None = 0.01,
    lo: float = 0.01,
    hi: float = 50.0,
) -> CalibrationResult:
    """σ1 of AdaDPSyn's projected means for given σ0, σ2 (Gao et al. 2025, App. B; RDP accounting).

    ``labels_touched=1`` is the paper's analysis (a swap within one label); see ``method_events.adadpsyn_event``.

    Args:
        epsilon: the target ε.
        delta: the δ the target holds at, in (0, 1).
        sampling_rate: γ, the rate of the draw without replacement, in (0, 1].
        steps: the tokens composed.
        t_hat: T̂, the most radius-reduction rounds per token.
        sigma0: GoodRadius's noise multiplier.
        sigma2: the coverage counts' noise std.
        theta: GoodRadius's tolerance θ.
        labels_touched: the labels one neighbouring change touches.
        grid: the grid step (None: bisection).
        lo: the search range's lower end.
        hi: the search range's upper end.

    Raises:
        ConfigurationError: a parameter is out of range.
        CalibrationError: no value in the search range meets the target.
    """
    q = check.probability_half_open("sampling_rate", sampling_rate)
    n, t = check.positive_int("steps", steps), check.positive_int("t_hat", t_hat)
    s0, s2 = check.positive_finite("sigma0", sigma0), check.positive_finite("sigma2", sigma2)
    touched = check.positive_int("labels_touched", labels_touched)

    def event(s1: float) -> ev.DPEvent:
        return me.adadpsyn_event(
            sigma0=s0, sigma1=s1, sigma2=s2, sampling_rate=q, steps=n, t_hat=t, theta=theta, labels_touched=touched
        )

    try:
        return calibrate(event, epsilon=epsilon, delta=delta, lo=lo, hi=hi, grid=grid, accountant="rdp")
    except CalibrationError:
        # no σ1 helps when GoodRadius and the coverage test alone (σ1 → ∞) already spend the budget: say so
        floor = get_accountant("rdp").epsilon(event(1e12), delta=delta)
        if floor < epsilon:
            raise
        raise CalibrationError(
            f"AdaDPSyn cannot meet epsilon={epsilon} at delta={delta}: its GoodRadius (sigma0={s0}) and coverage "
            f"(sigma2={s2}) steps alone cost epsilon={floor:.3g} over {n} tokens at sampling rate {q:.3g} (the "
            "smallest label's draw), whatever sigma1; raise sigma0 and sigma2, lower max_tokens or the draw per "
            "token, or give the smallest label more records"
        ) from None


@lru_cache(maxsize=1024)
def calibrate_mozo(
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    order: float,
    tolerance: float = 1e-7,
    hi: float = 100.0,
) -> CalibrationResult:
    """The largest β for DPS-MOZO (Flemings et al., App. B) by bisection; RDP accounting.

    The paper fixes the order α and solves steps·ε'(α) ≤ ε̃ (``method_events.mozo_rdp_target``); here every
    order ≤ α is tried, which can only allow a larger β, and gives the paper's β when α is the best order.

    Args:
        epsilon: the target ε.
        delta: the δ the target holds at, in (0, 1).
        sampling_rate: q = n_shots/|D|, in (0, 1].
        steps: the tokens composed.
        order: the Rényi order α.
        tolerance: the bisection's bracket width.
        hi: the largest β searched.

    Raises:
        ConfigurationError: a parameter is out of range.
        CalibrationError: no value in the search range meets the target.
    """
    q = check.probability_half_open("sampling_rate", sampling_rate)
    n, a = check.positive_int("steps", steps), check.order("order", order)
    return calibrate(
        lambda b: me.mozo_event(beta=b, order=a, sampling_rate=q, steps=n),
        epsilon=epsilon,
        delta=delta,
        lo=1e-9,
        hi=hi,
        find="largest",
        tolerance=tolerance,
        accountant="rdp",
    )


@lru_cache(maxsize=1024)
def calibrate_clip_blend_temperature(
    *,
    epsilon: float,
    delta: float,
    clip: float,
    subset_size: int,
    steps: int,
    neighbouring: str = REPLACE_ONE,
    tolerance: float = 1e-6,
) -> CalibrationResult:
    """The smallest temperature τ for clip-blend decoding meeting (ε, δ) under the tightest accounting.

    Searched as the largest inverse temperature 1/τ; the result's ``value`` is τ. A token's ε0 = c/(sτ)
    above 10ε cannot meet the target, which bounds the search.

    Args:
        epsilon: the target ε.
        delta: the δ the target holds at, in (0, 1).
        clip: the clipping bound c.
        subset_size: s, the subset's size.
        steps: the tokens composed.
        neighbouring: the ledger's relation.
        tolerance: the bisection's bracket width, relative to the search range.

    Raises:
        ConfigurationError: a parameter is out of range.
        CalibrationError: no value in the search range meets the target.
    """
    epsilon = check.positive_finite("epsilon", epsilon)
    hi = 10.0 * epsilon * check.positive_int("subset_size", subset_size) / check.positive_finite("clip", clip)
    # ε0 = c/(sτ) (add/remove) or 2c/(sτ) (replace-one); above 10ε nothing meets the target
    result = calibrate(
        lambda inv_tau: me.clip_blend_event(
            clip=clip, subset_size=subset_size, temperature=1.0 / inv_tau, steps=steps, neighbouring=neighbouring
        ),
        epsilon=epsilon,
        delta=delta,
        lo=hi * 1e-9,
        hi=hi,
        find="largest",
        tolerance=tolerance * hi,
    )
    return CalibrationResult(1.0 / result.value, result.epsilon, result.delta, result.accountant)
