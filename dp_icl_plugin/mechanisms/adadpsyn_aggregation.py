"""AdaDPSyn's data-adaptive aggregation of next-token distributions (Gao et al., ICLR 2025, Algorithm 1).

Per token, the M next-token distributions p_1..p_M over the K public candidates are aggregated by
"Precision-Focused Iterative Radius Reduction" (Gao et al., Algorithm 1, lines 5–23):

1. :func:`good_radius`: a target radius r from GoodRadius (Nissim et al. 2016; App. A.2, Algorithms 4–5),
   a DP binary search over [0, √2/2] with tolerance θ;
2. R ← √2/2 and a first :func:`noisy_mean` of the points (line 8), mapped back with :func:`to_simplex`
   (line 9);
3. up to T̂ rounds (lines 10–22): a :func:`noisy_coverage` check of the ball (centre, r + m(R)) with
   m(R) = 2λRσ1√K/M (:func:`coverage_margin`), stopping when the noisy count is below μM or R < r + m(R);
   else R ← r + m(R), every point is moved into the ball (centre, R) by :func:`project_to_ball` and the
   :func:`noisy_mean` of the projected points is the new centre (mapped back to the simplex);
4. the released token is the argmax of the last centre (line 23): :func:`release_token`.

Privacy claim: replace-one neighbours on the M points (one private record sits in one prompt, so it
changes one point). Per token: 2⌈log2(√2/(2θ))⌉ Gaussian queries of a sensitivity-2 score with noise std
2σ0, at most T̂ + 1 Gaussian means whose sum has sensitivity 2R (std 2Rσ1), at most T̂ Gaussian counts of
sensitivity 1 (std σ2); everything else (r's use, the radius schedule, the simplex map, the argmax) is
post-processing of those outputs. This is exactly
:func:`~dp_icl_plugin.accounting.method_events.adadpsyn_event`'s per-token event (App. B, Theorem 3).
All noise is drawn from the ``rng`` passed in; a noise multiplier of 0 switches a step's noise off (the
ε = ∞ baseline, not private).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.method_events import good_radius_steps
from dp_icl_plugin.errors import ConfigurationError

__all__ = [
    "SCORE_SENSITIVITY",
    "SIMPLEX_RADIUS",
    "TokenRelease",
    "ball_volume",
    "coverage_count",
    "coverage_margin",
    "good_radius",
    "good_radius_score",
    "noisy_coverage",
    "noisy_good_radius_score",
    "noisy_mean",
    "project_to_ball",
    "release_token",
    "to_simplex",
]

SIMPLEX_RADIUS = math.sqrt(2.0) / 2.0
"""Half the ℓ2 diameter √2 of the probability simplex: R's start and GoodRadius's upper end (§4.3, fn. 2)."""

SCORE_SENSITIVITY = 2.0
"""ℓ2 (= ℓ1) sensitivity of the GoodRadius score L(r) under replace-one (Nissim et al. 2016; App. A.2)."""

_TOLERANCE = 1e-9  # slack for float rounding in the domain checks that the sensitivities rest on


def _points(points: object, name: str = "points") -> np.ndarray:
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        raise ConfigurationError(f"{name} must have shape (M ≥ 1, K ≥ 1), got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ConfigurationError(f"{name} must be finite")
    return p


def _probability_rows(points: object) -> np.ndarray:
    p = _points(points, "distributions")
    if p.min() < 0 or np.any(np.abs(p.sum(axis=1) - 1.0) > 1e-6):
        raise ConfigurationError("each row must be a probability vector over the candidates (sum 1, ≥ 0)")
    return p


def _centre(centre: object, dim: int) -> np.ndarray:
    c = np.asarray(centre, dtype=np.float64)
    if c.shape != (dim,) or not np.all(np.isfinite(c)):
        raise ConfigurationError(f"centre must be a finite vector of shape ({dim},), got {c.shape}")
    return c


def _noise_multiplier(name: str, value: float) -> float:
    return check.non_negative_finite(name, value)


def _pairwise_distances(points: np.ndarray) -> np.ndarray:
    # direct differences (not the Gram trick), so that identical points are at distance exactly 0
    diff = points[:, None, :] - points[None, :, :]
    return np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))


def _check_volume(t: object, n_points: int) -> int:
    volume = check.positive_int("t", t)
    if volume > n_points:
        raise ConfigurationError(f"t = {volume} exceeds the number of points ({n_points})")
    return volume


def _score(distances: np.ndarray, radius: float, t: int) -> float:
    capped = np.minimum((distances <= radius).sum(axis=1), t)  # B̄_r(x_i) = min(|B_r(x_i)|, t)
    return float(np.sort(capped)[::-1][:t].sum()) / t  # the t largest: the max over distinct i_1..i_t


# ---------------------------------------------------------------------------------------------- GoodRadius


def good_radius_score(points: np.ndarray, radius: float, *, t: int) -> float:
    """GoodRadius's score L(r) (Algorithm 4, line 3): the mean of the t largest capped ball counts.

    L(r) = (1/t)·max over distinct i_1..i_t of Σ_j min(|B_r(x_{i_j})|, t), with |B_r(x)| the number of points
    within ℓ2 distance r of x (itself included). L(r) ≥ t iff t points each have t points within r.

    Sensitivity 2 under replace-one (Nissim et al. 2016): replacing one point changes every other capped
    count by at most 1 (t terms: ≤ t) and its own term by at most t, so the sum moves by ≤ 2t and L by ≤ 2.

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        radius: r ≥ 0.
        t: the ball volume, 1 ≤ t ≤ M.

    Raises:
        ConfigurationError: malformed points, or ``radius`` or ``t`` out of range.
    """
    p = _points(points)
    return _score(_pairwise_distances(p), check.non_negative_finite("radius", radius), _check_volume(t, len(p)))


def noisy_good_radius_score(
    points: np.ndarray, radius: float, *, t: int, sigma0: float, rng: np.random.Generator
) -> float:
    """L(r) + N(0, 4σ0²) (Algorithm 5, lines 6–7): the Gaussian mechanism, sensitivity 2, std 2σ0.

    Noise multiplier σ0 on a sensitivity-2 query: (α, α/(2σ0²))-RDP (App. A.2, Theorem 2). One binary-search
    query; :func:`good_radius` makes two per step.

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        radius: r ≥ 0.
        t: the ball volume, 1 ≤ t ≤ M.
        sigma0: noise multiplier; 0 switches the noise off (not private).
        rng: the noise source.

    Raises:
        ConfigurationError: malformed points, or a parameter out of range.
    """
    score = good_radius_score(points, radius, t=t)
    sigma0 = _noise_multiplier("sigma0", sigma0)
    return score + float(rng.normal(0.0, SCORE_SENSITIVITY * sigma0)) if sigma0 > 0 else score


def good_radius(points: np.ndarray, *, t: int, sigma0: float, theta: float, rng: np.random.Generator) -> float:
    """GoodRadius with its DP binary search (App. A.2, Algorithm 4 line 4 and Algorithm 5).

    On [r_low, r_high] = [0, √2/2], each step takes r_mid and two noisy scores, L̃(r_mid) and L̃(r_mid/2),
    each L + N(0, 4σ0²) (sensitivity 2, std 2σ0); if either reaches t then r_high ← r_mid, else
    r_low ← r_mid. Returns (r_low + r_high)/2.

    Exactly ``good_radius_steps(theta)`` = ⌈log2(√2/(2θ))⌉ steps are run (the paper's ``while r_high − r_low
    > θ`` loop, counted up front so that float rounding can never add a step the event does not charge;
    for θ ≥ √2/2, where the paper's loop would not run, one step is run, as the event charges one):
    2⌈log2(√2/(2θ))⌉ Gaussian queries with noise multiplier σ0, as in ``adadpsyn_event``. Without noise
    (σ0 = 0) the result is within θ/2 of min{r : L(r) ≥ t} clamped to [0, √2/2].

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        t: the desired ball volume (the paper's ρM), 1 ≤ t ≤ M.
        sigma0: noise multiplier (std 2σ0 on each score); 0 switches the noise off (not private).
        theta: tolerance of the search (the paper's 0.1).
        rng: the noise source.

    Returns:
        A radius in [0, √2/2].

    Raises:
        ConfigurationError: malformed points, or a parameter out of range.
    """
    p = _points(points)
    volume = _check_volume(t, len(p))
    sigma0 = _noise_multiplier("sigma0", sigma0)
    std = SCORE_SENSITIVITY * sigma0
    distances = _pairwise_distances(p)
    low, high = 0.0, SIMPLEX_RADIUS
    for _ in range(good_radius_steps(theta)):
        mid = (low + high) / 2.0
        # both queries are made every step (the event charges two), even when the first decides
        full = _score(distances, mid, volume) + (float(rng.normal(0.0, std)) if std > 0 else 0.0)  # line 6
        half = _score(distances, mid / 2.0, volume) + (float(rng.normal(0.0, std)) if std > 0 else 0.0)  # line 7
        if half >= volume or full >= volume:  # lines 8–11 (both branches set r_high)
            high = mid
        else:
            low = mid
    return (low + high) / 2.0


# ---------------------------------------------------------------------------------------------- projected mean


def to_simplex(vector: np.ndarray) -> np.ndarray:
    """max(v, 0)/‖max(v, 0)‖₁ (Algorithm 1, lines 9 and 21): the paper's map back onto the simplex.

    Not the Euclidean projection: the paper clips and renormalises. Post-processing (no privacy cost). If no
    entry is positive the result is uniform, whose argmax is the first candidate (the most likely public
    token).

    Args:
        vector: a finite vector, shape (K,).

    Raises:
        ConfigurationError: ``vector`` is empty, not one-dimensional or not finite.
    """
    v = np.asarray(vector, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
        raise ConfigurationError(f"vector must be a non-empty finite vector, got shape {v.shape}")
    clipped = np.maximum(v, 0.0)
    mass = clipped.sum()
    return clipped / mass if mass > 0 else np.full_like(v, 1.0 / v.size)


def project_to_ball(points: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """p̃_i = c + (p_i − c)/max(1, ‖p_i − c‖₂/R) (Algorithm 1, line 19): each point moved into the ball (c, R).

    Points already inside are unchanged; any two results are within 2R, which bounds the sensitivity of
    their sum by 2R under replace-one (App. B).

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        centre: c, shape (K,).
        radius: R > 0.

    Raises:
        ConfigurationError: malformed points or centre, or ``radius`` not positive.
    """
    p = _points(points)
    c = _centre(centre, p.shape[1])
    r = check.positive_finite("radius", radius)
    offsets = p - c
    scale = np.linalg.norm(offsets, axis=1) / r
    # points inside are returned as they are (c + (p − c) could differ from p in the last bit)
    return np.where((scale <= 1.0)[:, None], p, c + offsets / np.maximum(scale, 1.0)[:, None])


def noisy_mean(
    points: np.ndarray,
    *,
    radius: float,
    sigma1: float,
    rng: np.random.Generator,
    centre: np.ndarray | None = None,
) -> np.ndarray:
    """(1/M)(Σ_i p̃_i + N(0, 4R²σ1² I)) (Algorithm 1, lines 8 and 20): the Gaussian mechanism on a sum.

    Sensitivity 2R under replace-one: with ``centre`` given, every row must lie in the ball (centre, R)
    (after :func:`project_to_ball`), a set of diameter 2R; without it (line 8) every row must be a
    probability vector, a set of diameter √2, and R must be at least √2/2. Both are checked, so a row
    outside the domain the sensitivity assumes is refused rather than under-noised. The noise std on the sum
    is 2Rσ1 (noise multiplier σ1), as in ``adadpsyn_event``.

    Args:
        points: the rows p̃_i, shape (M, K).
        radius: R.
        sigma1: noise multiplier; 0 gives the exact mean (not private).
        rng: the noise source.
        centre: the ball's centre (public: a previous DP output), or None for the first mean.

    Returns:
        The noisy mean, shape (K,) (not yet mapped back to the simplex).

    Raises:
        ConfigurationError: a row outside the domain above, malformed inputs, or a parameter out of range.
    """
    r = check.positive_finite("radius", radius)
    sigma1 = _noise_multiplier("sigma1", sigma1)
    if centre is None:
        p = _probability_rows(points)
        if r < SIMPLEX_RADIUS * (1.0 - _TOLERANCE):
            raise ConfigurationError(f"without a centre the radius must be at least √2/2 (got {r})")
    else:
        p = _points(points)
        c = _centre(centre, p.shape[1])
        if np.any(np.linalg.norm(p - c, axis=1) > r * (1.0 + _TOLERANCE) + _TOLERANCE):
            raise ConfigurationError("every row must lie in the ball (centre, radius): the 2R sensitivity needs it")
    total = p.sum(axis=0)
    if sigma1 > 0:
        total = total + rng.normal(0.0, 2.0 * r * sigma1, size=total.shape)
    return total / len(p)


# ---------------------------------------------------------------------------------------------- coverage check


def coverage_margin(radius: float, *, sigma1: float, lam: float, dim: int, n_points: int) -> float:
    """2λRσ1√K/M (Algorithm 1, lines 11, 15, 18): room for the mean's noise around the target radius.

    Args:
        radius: R.
        sigma1: the means' noise multiplier σ1.
        lam: λ.
        dim: K, the number of candidates.
        n_points: M.
    """
    return 2.0 * lam * radius * sigma1 * math.sqrt(dim) / n_points


def coverage_count(points: np.ndarray, centre: np.ndarray, radius: float) -> int:
    """The number of points within ℓ2 distance ``radius`` of ``centre`` (Algorithm 1, line 11).

    Sensitivity 1 under replace-one: each point adds 0 or 1.

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        centre: the ball's centre, shape (K,).
        radius: the ball's radius, ≥ 0.

    Raises:
        ConfigurationError: malformed points or centre, or a negative radius.
    """
    p = _points(points)
    c = _centre(centre, p.shape[1])
    r = check.non_negative_finite("radius", radius)
    return int(np.count_nonzero(np.linalg.norm(p - c, axis=1) <= r))


def noisy_coverage(
    points: np.ndarray, centre: np.ndarray, radius: float, *, sigma2: float, rng: np.random.Generator
) -> float:
    """count + N(0, σ2²) (Algorithm 1, line 12): the Gaussian mechanism, sensitivity 1, std σ2.

    Args:
        points: the M points (next-token distributions over K candidates), shape (M, K).
        centre: the ball's centre, shape (K,).
        radius: the ball's radius, ≥ 0.
        sigma2: noise std; 0 switches the noise off (not private).
        rng: the noise source.

    Raises:
        ConfigurationError: malformed inputs, or a parameter out of range.
    """
    count = float(coverage_count(points, centre, radius))
    sigma2 = _noise_multiplier("sigma2", sigma2)
    return count + float(rng.normal(0.0, sigma2)) if sigma2 > 0 else count


# ---------------------------------------------------------------------------------------------- one token


@dataclass(frozen=True)
class TokenRelease:
    """One token's aggregation; every field is a DP output or post-processing of DP outputs.

    Attributes:
        index: the released candidate, argmax of ``distribution`` (line 23).
        distribution: the last centre p̃ mapped back to the simplex, shape (K,).
        target_radius: GoodRadius's r.
        radius: the last R used for a projected mean (√2/2 when no round reduced it).
        rounds: coverage checks made (≤ T̂).
        means: noisy means computed (1 + the rounds that passed both checks; ≤ T̂ + 1).
    """

    index: int
    distribution: np.ndarray
    target_radius: float
    radius: float
    rounds: int
    means: int


def ball_volume(rho: float, n_points: int) -> int:
    """t = ⌈ρM⌉ (at least 1, at most M): GoodRadius's ball volume for a fraction ρ of the M points.

    Args:
        rho: the fraction ρ.
        n_points: M.
    """
    return min(n_points, max(1, math.ceil(rho * n_points - _TOLERANCE)))


def release_token(
    distributions: np.ndarray,
    *,
    sigma0: float,
    sigma1: float,
    sigma2: float,
    t_hat: int,
    rng: np.random.Generator,
    theta: float = 0.1,
    rho: float = 0.8,
    mu: float = 0.55,
    lam: float = 0.2,
) -> TokenRelease:
    """Algorithm 1, lines 5–23, for one token: GoodRadius, projected means with coverage checks, argmax.

    Replace-one neighbours on the rows. Per call: 2·good_radius_steps(θ) score queries (sensitivity 2, std
    2σ0), at most T̂ + 1 means (sensitivity 2R, std 2Rσ1), at most T̂ counts (sensitivity 1, std σ2): the
    per-token event of ``method_events.adadpsyn_event`` (App. B). Setting every σ to 0 gives the same
    computation without noise (also zero margin 2λRσ1√K/M): the ε = ∞ baseline, not private.

    Args:
        distributions: p_1..p_M over the K candidates, each a probability vector; shape (M, K).
        sigma0: the noise multiplier of GoodRadius's scores.
        sigma1: the noise multiplier of the means.
        sigma2: the noise std of the coverage counts.
        t_hat: T̂, the maximum number of radius-reduction rounds.
        rng: the noise source.
        theta: GoodRadius's tolerance θ.
        rho: the fraction ρ of points GoodRadius's ball should hold (t = ⌈ρM⌉).
        mu: the coverage threshold μ (a round stops when the noisy count is below μM).
        lam: λ in the margin 2λRσ1√K/M.

    Raises:
        ConfigurationError: a row is not a probability vector, or a parameter is out of range.
    """
    p = _probability_rows(distributions)
    n_points, dim = p.shape
    sigma0 = _noise_multiplier("sigma0", sigma0)
    sigma1 = _noise_multiplier("sigma1", sigma1)
    sigma2 = _noise_multiplier("sigma2", sigma2)
    rounds_max = check.positive_int("t_hat", t_hat)
    check.positive_finite("theta", theta)
    for name, value in (("rho", rho), ("mu", mu)):
        if not 0.0 < check.real(name, value) <= 1.0:
            raise ConfigurationError(f"{name} must lie in (0, 1], got {value!r}")
    lam = check.non_negative_finite("lam", lam)

    target = good_radius(p, t=ball_volume(rho, n_points), sigma0=sigma0, theta=theta, rng=rng)  # line 5
    radius = SIMPLEX_RADIUS  # line 6
    centre = to_simplex(noisy_mean(p, radius=radius, sigma1=sigma1, rng=rng))  # lines 7–9
    rounds, means = 0, 1
    for _ in range(rounds_max):  # line 10
        reach = target + coverage_margin(radius, sigma1=sigma1, lam=lam, dim=dim, n_points=n_points)
        rounds += 1
        if noisy_coverage(p, centre, reach, sigma2=sigma2, rng=rng) < mu * n_points:  # lines 11–14
            break
        if radius < reach:  # lines 15–17
            break
        radius = reach  # line 18
        projected = project_to_ball(p, centre, radius)  # line 19
        centre = to_simplex(noisy_mean(projected, radius=radius, sigma1=sigma1, rng=rng, centre=centre))  # 20–21
        means += 1
    return TokenRelease(
        index=int(np.argmax(centre)),
        distribution=centre,
        target_radius=target,
        radius=radius,
        rounds=rounds,
        means=means,
    )
