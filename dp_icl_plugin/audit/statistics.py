"""Empirical lower bounds on ε from samples of a mechanism on two neighbouring inputs.

If M is (ε, δ)-DP then for every event S, P[M(D) ∈ S] ≤ e^ε P[M(D') ∈ S] + δ, and the same with D and D'
swapped. A test that finds S with p = P[M(D) ∈ S] and q = P[M(D') ∈ S] therefore proves
ε ≥ log((p − δ)/q). With samples, p and q are estimated with one-sided Clopper–Pearson bounds (p from below,
q from above), so the bound holds with the stated confidence. The event is chosen on one half of the samples
and evaluated on the other half, so that picking the best event does not bias the bound.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["clopper_pearson", "epsilon_lower_bound"]


def clopper_pearson(successes: int, trials: int, *, confidence: float) -> tuple[float, float]:
    """Two one-sided Clopper–Pearson bounds (lower, upper), each holding with probability ``confidence``.

    Args:
        successes: the successes observed.
        trials: the trials, at least 1.
        confidence: each bound's confidence level.

    Raises:
        ConfigurationError: not 0 ≤ successes ≤ trials, or no trials.
    """
    if trials <= 0 or not 0 <= successes <= trials:
        raise ConfigurationError("need 0 ≤ successes ≤ trials and trials ≥ 1")
    a = 1.0 - confidence
    lower = 0.0 if successes == 0 else float(beta.ppf(a, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1 - a, successes + 1, trials - successes))
    return lower, upper


def _counts(outputs: np.ndarray, values: np.ndarray) -> np.ndarray:
    return (outputs[:, None] == values[None, :]).sum(axis=0)


def epsilon_lower_bound(
    on_d: np.ndarray, on_d_prime: np.ndarray, *, delta: float, confidence: float = 0.95
) -> tuple[float, str]:
    """The largest ε the samples prove (0 if none), and the event that proves it.

    Events: "the output equals v" and "the output does not equal v" for every value v seen, in both
    directions (D against D' and D' against D). ``confidence`` is the level of the whole statement: the
    two Clopper–Pearson bounds of the chosen test each get half of the error.

    Args:
        on_d: outputs on D (at least 4).
        on_d_prime: outputs on D′ (at least 4).
        delta: the δ of the claim tested.
        confidence: the statement's level.

    Raises:
        ConfigurationError: fewer than 4 samples on an input, or a bad ``delta``.
    """
    x = np.asarray(on_d).ravel()
    y = np.asarray(on_d_prime).ravel()
    if len(x) < 4 or len(y) < 4:
        raise ConfigurationError("need at least 4 samples on each input")
    delta = check.non_negative_finite("delta", delta)
    half_x, half_y = len(x) // 2, len(y) // 2
    values = np.unique(np.concatenate([x, y]))
    # Choose the event on the first halves (plug-in ratio), evaluate it on the second halves.
    px, py = _counts(x[:half_x], values) / half_x, _counts(y[:half_y], values) / half_y
    candidates = []
    for p, q, direction in ((px, py, "D"), (py, px, "D'")):
        for inside in (True, False):
            pe, qe = (p, q) if inside else (1 - p, 1 - q)
            with np.errstate(divide="ignore", invalid="ignore"):
                score = np.log(np.maximum(pe - delta, 1e-300) / np.maximum(qe, 1.0 / (4 * max(half_x, half_y))))
            i = int(np.argmax(score))
            candidates.append((float(score[i]), values[i], inside, direction))
    _, value, inside, direction = max(candidates, key=lambda c: c[0])
    first, second = (x[half_x:], y[half_y:]) if direction == "D" else (y[half_y:], x[half_x:])
    hit_first = int(np.sum(first == value)) if inside else int(np.sum(first != value))
    hit_second = int(np.sum(second == value)) if inside else int(np.sum(second != value))
    level = 1 - (1 - confidence) / 2
    p_lo, _ = clopper_pearson(hit_first, len(first), confidence=level)
    _, q_hi = clopper_pearson(hit_second, len(second), confidence=level)
    bound = math.log((p_lo - delta) / q_hi) if p_lo > delta and q_hi > 0 else 0.0
    event = f"output {'=' if inside else '≠'} {value} on {direction}"
    return max(bound, 0.0), event
