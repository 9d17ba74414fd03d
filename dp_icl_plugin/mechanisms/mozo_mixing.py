"""DPS-MOZO's per-token mechanism (Flemings et al., "Differentially Private In-context Learning via Sampling
Few-shot Mixed with Zero-shot Outputs", §4.1, Algorithm 1, eqs. 2–3).

One token: restrict the zero-shot log-probabilities ℓ0 (query + generated tokens, no private data) and the
n_shots one-shot log-probabilities ℓ_i (one private record + query + generated tokens) to the top-k tokens
of the zero-shot output (public, Algorithm 1 line 5); for each record pick the largest λ_i ∈ [0, λ_max] with
max(D_α(p̄_i‖p0), D_α(p0‖p̄_i)) ≤ βα, where p̄_i = softmax(λ_i ℓ_i + (1 − λ_i) ℓ0) (eqs. 2–3); sample the
next token from the normalised product Π_i p̄_i (ensemble decoding, line 16).

Privacy claim (the paper's, Theorem B.3): replace-one neighbours; each token is (α, 4βα)-RDP (hence at every
order ≤ α), the n_shots records being drawn without replacement from D (q = n_shots/|D|, amplification by
Wang, Balle & Kasiviswanathan 2019, Thm 9); accounted by ``method_events.mozo_event`` (RDP, composed over all
generated tokens). The zero-shot output and the tokens generated so far are public (post-processing).

Caveat: the proof of Theorem B.3 has two gaps, and the bound fails for ``variant="paper"``:

1. The triangle-like inequality it uses (Thm B.1, Steinke 2022) needs the divergence bounds at *every* order
   (a zCDP-style hypothesis); eq. 3 constrains one order α. With one order the ball does not bound
   D_α(p̄_i‖p̄'_i) at all: P = (1 − s·r^((α−1)/α)², …), Q = (1 − s'·r^((α−1)/α), …), R = (1 − r, r) lie
   deep inside the ball around Q for small s, s', yet D_α(P‖R) → ∞ as r → 0.
2. Its additivity step (Thm B.2) is about product *measures*; the normalised pointwise product of
   distributions over one vocabulary is not one, and can increase the divergence.

``tests/test_mozo.py`` shows both: with n_shots = 1 the released distributions of two neighbouring datasets
are unboundedly far apart at order α, and with n_shots = 4 at the paper's ε = 4 setting (α = 5, β = 0.342)
three tokens suffice to exceed 4βα.

``variant="projected"`` keeps the paper's λ_i and product, then shrinks the output towards the public centre
softmax(n_shots·ℓ0) (the output when every λ_i = 0) until D_{2α}(out‖c0) ≤ r1 and D_{2α−1}(c0‖out) ≤ r2
(:func:`project_output`); Hölder's inequality then gives D_α(out(D)‖out(D')) ≤ 4βα for *any* two datasets,
so the same event (``mozo_event``) accounts for it soundly. When the paper's output already lies in that
ball, both variants release the same distribution.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = [
    "LAMBDA_MAX",
    "VARIANTS",
    "MozoOutput",
    "MozoToken",
    "fit_lambda",
    "holder_radii",
    "mix",
    "mozo_distribution",
    "mozo_token",
    "nonprivate_token",
    "product_logprobs",
    "project_output",
    "renyi_divergence",
    "sample_logprobs",
    "sample_product",
    "symmetric_renyi_divergence",
    "top_k_support",
]

LAMBDA_MAX = 1.5
"""The paper's upper limit on λ_i (§4.1, after Xu 2023)."""

_TOLERANCE = 1e-6

VARIANTS = ("paper", "projected")
"""``"paper"``: Algorithm 1 as published; ``"projected"``: its output shrunk into a provable 4βα ball."""


class MozoToken(NamedTuple):
    """One released token and its diagnostics.

    Attributes:
        token_id: the sampled token (a vocabulary id).
        lambdas: the mixing weight λ_i of each one-shot output, shape (n_shots,).
    """

    token_id: int
    lambdas: np.ndarray


class MozoOutput(NamedTuple):
    """The distribution a token is drawn from.

    Attributes:
        support: the public top-k token ids, most likely first, shape (K,).
        logprobs: the output's log-probabilities over ``support``, shape (K,).
        lambdas: the mixing weight λ_i of each one-shot output, shape (n_shots,).
        scale: t of the "projected" variant (1 when nothing was shrunk, and always 1 for "paper").
    """

    support: np.ndarray
    logprobs: np.ndarray
    lambdas: np.ndarray
    scale: float


def _log_normalize(log_weights: np.ndarray) -> np.ndarray:
    """Log-probabilities from log-weights along the last axis (−inf entries stay −inf)."""
    top = np.max(log_weights, axis=-1, keepdims=True)
    shifted = log_weights - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _as_logprobs(name: str, values: np.ndarray, ndim: int) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != ndim or x.shape[-1] == 0 or (ndim == 2 and x.shape[0] == 0):
        raise ConfigurationError(f"{name} must have {ndim} non-empty dimension(s), got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ConfigurationError(f"{name} must not contain NaN or +inf")
    if not np.isfinite(x).any(axis=-1).all():
        raise ConfigurationError(f"every row of {name} needs a finite entry")
    return x


def _renyi_rows(lp: np.ndarray, lq: np.ndarray, a: float) -> np.ndarray:
    """D_α between normalised log-probability rows (shapes broadcast to (n, K)); no validation (internal)."""
    # where P(x) = 0 the term is 0 whatever Q(x) is (α > 1); keep −inf there, avoiding −inf + inf
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isneginf(lp), -np.inf, a * lp + (1.0 - a) * lq)
    top = np.max(terms, axis=-1)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        log_sum = safe + np.log(np.sum(np.exp(terms - safe[..., None]), axis=-1))
    return np.where(np.isposinf(top), np.inf, np.maximum(0.0, log_sum / (a - 1.0)))


def renyi_divergence(log_p: np.ndarray, log_q: np.ndarray, order: float) -> float:
    """D_α(P‖Q) = 1/(α−1) · log Σ_x P(x)^α Q(x)^(1−α), computed in log space.

    Args:
        log_p: log-weights of P, shape (K,); normalised here, so log-probabilities, logits or any per-row
            shift of them give the same result. −inf means probability 0.
        log_q: log-weights of Q over the same support, likewise.
        order: α in (1, ∞).

    Returns:
        The divergence (≥ 0; rounding below 0 is clipped), ``inf`` when P puts mass where Q has none.

    Raises:
        ConfigurationError: ``order`` is not in (1, ∞), or the rows are malformed or of different shapes.
    """
    a = check.order("order", order)
    lp = _log_normalize(_as_logprobs("log_p", log_p, 1))
    lq = _log_normalize(_as_logprobs("log_q", log_q, 1))
    if lp.shape != lq.shape:
        raise ConfigurationError(f"log_p and log_q need the same shape, got {lp.shape} and {lq.shape}")
    # where P(x) = 0 the term is 0 whatever Q(x) is (α > 1); keep −inf there, avoiding −inf + inf
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isneginf(lp), -np.inf, a * lp + (1.0 - a) * lq)
    top = np.max(terms)
    if np.isposinf(top):
        return math.inf
    log_sum = top + math.log(float(np.sum(np.exp(terms - top))))
    return max(0.0, log_sum / (a - 1.0))


def symmetric_renyi_divergence(log_p: np.ndarray, log_q: np.ndarray, order: float) -> float:
    """D_α^↔(P‖Q) = max(D_α(P‖Q), D_α(Q‖P)) (the paper's eq. 1).

    Args:
        log_p: log-weights of P, shape (K,) (normalised here).
        log_q: log-weights of Q over the same support, shape (K,).
        order: α in (1, ∞).

    Raises:
        ConfigurationError: as :func:`renyi_divergence`.
    """
    return max(renyi_divergence(log_p, log_q, order), renyi_divergence(log_q, log_p, order))


def top_k_support(zero_shot_logprobs: np.ndarray, k: int) -> np.ndarray:
    """The k most likely tokens of the zero-shot output (ties to the smaller id), most likely first.

    Tokens of zero zero-shot probability are never in the support: against p0 = 0 no λ > 0 could pass the
    divergence constraint, and the support is public, so leaving them out costs nothing.

    Args:
        zero_shot_logprobs: ℓ0, shape (V,).
        k: how many tokens to keep (fewer when fewer have positive probability).

    Returns:
        The token ids, shape (≤ k,).

    Raises:
        ConfigurationError: ``k`` is not a positive integer, or the row is malformed.
    """
    lp = _as_logprobs("zero_shot_logprobs", zero_shot_logprobs, 1)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigurationError(f"k must be a positive integer, got {k!r}")
    order = np.lexsort((np.arange(lp.size), -lp))
    finite = order[np.isfinite(lp[order])]
    return finite[: int(k)].astype(np.int64)


def mix(one_shot_logprobs: np.ndarray, zero_shot_logprobs: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """log p̄_i = log softmax(λ_i ℓ_i + (1 − λ_i) ℓ0) (eq. 2), row by row.

    Args:
        one_shot_logprobs: ℓ_i, shape (n, K) (logits or log-probabilities: softmax ignores per-row shifts).
        zero_shot_logprobs: ℓ0, shape (K,), finite.
        lambdas: λ_i ≥ 0, shape (n,). λ_i = 0 gives p0 exactly, whatever ℓ_i holds.

    Returns:
        Log-probabilities, shape (n, K).

    Raises:
        ConfigurationError: mismatched shapes, a non-finite ℓ0, or a negative or non-finite λ_i.
    """
    one = _as_logprobs("one_shot_logprobs", one_shot_logprobs, 2)
    zero = _as_logprobs("zero_shot_logprobs", zero_shot_logprobs, 1)
    lam = np.asarray(lambdas, dtype=np.float64)
    if one.shape[1:] != zero.shape or lam.shape != one.shape[:1]:
        raise ConfigurationError(f"shapes: one-shot {one.shape}, zero-shot {zero.shape}, lambdas {lam.shape}")
    if not np.all(np.isfinite(zero)):
        raise ConfigurationError("zero_shot_logprobs must be finite on the support")
    if not (np.all(np.isfinite(lam)) and np.all(lam >= 0)):
        raise ConfigurationError("lambdas must be finite and ≥ 0")
    # ℓ0 + λ(ℓ_i − ℓ0): −inf in ℓ_i stays −inf for λ > 0; for λ = 0 the row is ℓ0 (no 0·inf)
    with np.errstate(invalid="ignore"):
        mixed = zero + lam[:, None] * (one - zero)
    mixed = np.where(lam[:, None] == 0, zero, mixed)
    return _log_normalize(mixed)


def fit_lambda(
    one_shot_logprobs: np.ndarray,
    zero_shot_logprobs: np.ndarray,
    *,
    beta: float,
    order: float,
    lambda_max: float = LAMBDA_MAX,
    tolerance: float = _TOLERANCE,
) -> float:
    """The largest λ ∈ [0, λ_max] with D_α^↔(p̄_λ‖p0) ≤ βα (eq. 3), by bisection.

    Both D_α(p̄_λ‖p0) and D_α(p0‖p̄_λ) are non-decreasing in λ ≥ 0 (p̄_λ runs along an exponential family
    from p0: with A the log-partition function, their derivatives are α(A'(αλ) − A'(λ))/(α−1) and
    A'(λ) − A'((1−α)λ), both ≥ 0 as A is convex), so the feasible set is an interval [0, λ*]. The value
    returned was itself checked to meet the constraint (0 always does): within ``tolerance`` below λ*,
    never above it.

    Args:
        one_shot_logprobs: ℓ_i over the support, shape (K,).
        zero_shot_logprobs: ℓ0 over the support, shape (K,), finite.
        beta: target leakage β > 0.
        order: α in (1, ∞).
        lambda_max: the upper limit (the paper: 1.5).
        tolerance: bisection stops when the bracket is this narrow.

    Raises:
        ConfigurationError: a parameter is out of range, or the rows are malformed or of different shapes.
    """
    b, a = check.positive_finite("beta", beta), check.order("order", order)
    lam_max = check.positive_finite("lambda_max", lambda_max)
    tol = check.positive_finite("tolerance", tolerance)
    one = _as_logprobs("one_shot_logprobs", one_shot_logprobs, 1)[None, :]
    zero = _log_normalize(_as_logprobs("zero_shot_logprobs", zero_shot_logprobs, 1))
    if one.shape[1:] != zero.shape or not np.all(np.isfinite(zero)):
        raise ConfigurationError("one- and zero-shot rows need the same shape; the zero-shot row must be finite")
    return float(_fit_lambdas(_log_normalize(one), zero, radius=b * a, order=a, lambda_max=lam_max, tolerance=tol)[0])


def _fit_lambdas(
    one: np.ndarray, zero: np.ndarray, *, radius: float, order: float, lambda_max: float, tolerance: float
) -> np.ndarray:
    """:func:`fit_lambda` for every row of ``one`` at once (rows bisect in lockstep; internal, no validation)."""

    def meets(lams: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            mixed = zero + lams[:, None] * (one - zero)
        mixed = _log_normalize(np.where(lams[:, None] == 0, zero, mixed))
        forward, backward = _renyi_rows(mixed, zero, order), _renyi_rows(zero[None, :], mixed, order)
        return np.asarray(np.maximum(forward, backward) <= radius)

    n = one.shape[0]
    at_max = meets(np.full(n, lambda_max))
    good = np.where(at_max, lambda_max, 0.0)  # invariant: good meets the constraint, bad does not
    bad = np.full(n, lambda_max)
    active = ~at_max
    while active.any() and np.max(bad[active] - good[active]) > tolerance:
        mid = 0.5 * (good + bad)
        ok = meets(mid)
        good = np.where(active & ok, mid, good)
        bad = np.where(active & ~ok, mid, bad)
        active = active & (bad - good > tolerance)
    return good


def product_logprobs(mixed_logprobs: np.ndarray) -> np.ndarray:
    """log of the normalised product Π_i p̄_i (ensemble decoding, Algorithm 1 line 16), shape (K,).

    Args:
        mixed_logprobs: the rows log p̄_i, shape (n, K).

    Raises:
        ConfigurationError: the rows are malformed, or their product is zero everywhere.
    """
    rows = _as_logprobs("mixed_logprobs", mixed_logprobs, 2)
    total = np.sum(rows, axis=0)  # −inf in any factor stays −inf (a product with a zero)
    if not np.isfinite(total).any():
        raise ConfigurationError("the product of the mixed distributions is zero everywhere")
    return _log_normalize(total)


def sample_logprobs(logprobs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn from the distribution with log-weights ``logprobs`` (shape (K,)), by inverse CDF.

    Args:
        logprobs: log-weights, shape (K,) (normalised here).
        rng: the randomness.

    Raises:
        ConfigurationError: ``rng`` is not a ``numpy.random.Generator``, or the row is malformed.
    """
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator")
    probs = np.exp(_log_normalize(_as_logprobs("logprobs", logprobs, 1)))
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, int(np.flatnonzero(probs > 0)[-1]))  # rounding at the top lands on the last bin with mass


def sample_product(mixed_logprobs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn from the normalised product Π_i p̄_i (Algorithm 1, line 16), rows log p̄_i of shape (n, K).

    Args:
        mixed_logprobs: the rows log p̄_i, shape (n, K).
        rng: the randomness.

    Raises:
        ConfigurationError: as :func:`product_logprobs` and :func:`sample_logprobs`.
    """
    return sample_logprobs(product_logprobs(mixed_logprobs), rng)


def holder_radii(beta: float, order: float) -> tuple[float, float]:
    """Radii (r1, r2) with (α − ½)/(α − 1)·r1 + r2 = 4βα, split evenly: r1 = 2βα(α − 1)/(α − ½), r2 = 2βα.

    Args:
        beta: the target leakage β > 0.
        order: α in (1, ∞).

    Raises:
        ConfigurationError: ``beta`` or ``order`` is out of range.
    """
    b, a = check.positive_finite("beta", beta), check.order("order", order)
    return 2.0 * b * a * (a - 1.0) / (a - 0.5), 2.0 * b * a


def project_output(
    product: np.ndarray, center: np.ndarray, *, beta: float, order: float, tolerance: float = _TOLERANCE
) -> tuple[np.ndarray, float]:
    """Shrink the output towards a public centre until it provably costs at most 4βα (the "projected" variant).

    out_t = softmax(log c0 + t·(log out − log c0)) for the largest t ∈ [0, 1] (bisection; divergences from
    c0 grow with t as in :func:`fit_lambda`) with D_{2α}(out_t‖c0) ≤ r1 and D_{2α−1}(c0‖out_t) ≤ r2
    (:func:`holder_radii`). Any two outputs O, O' meeting this are close: by Hölder's inequality (Mironov 2017,
    Prop. 11 with p = q = 2) D_α(O‖O') ≤ (α − ½)/(α − 1)·D_{2α}(O‖c0) + D_{2α−1}(c0‖O') ≤ 4βα, whatever the
    records (and the λ_i) were. This holds at one order, unlike the paper's triangle-like step.

    Args:
        product: log-probabilities of the output, shape (K,), finite wherever ``center`` is.
        center: the public centre log c0, shape (K,), finite.
        beta: the target leakage β > 0.
        order: α in (1, ∞).
        tolerance: the bisection's bracket width on t.

    Returns:
        The projected log-probabilities and t.

    Raises:
        ConfigurationError: a parameter is out of range, or the rows are malformed or of different shapes.
    """
    a = check.order("order", order)
    tolerance = check.positive_finite("tolerance", tolerance)  # a bracket of width 0 would never close
    r1, r2 = holder_radii(beta, a)
    out = _log_normalize(_as_logprobs("product", product, 1))
    c0 = _log_normalize(_as_logprobs("center", center, 1))
    if out.shape != c0.shape or not np.all(np.isfinite(c0)):
        raise ConfigurationError("product and center need the same shape, and center must be finite")
    direction = out - c0  # −inf where the output has no mass: then D_{2α−1}(c0‖out_t) = ∞ for every t > 0

    def at(t: float) -> np.ndarray:
        return c0 if t == 0 else _log_normalize(c0 + t * direction)

    def meets(t: float) -> bool:
        o, c = at(t)[None, :], c0[None, :]
        return bool(_renyi_rows(o, c, 2.0 * a)[0] <= r1 and _renyi_rows(c, o, 2.0 * a - 1.0)[0] <= r2)

    if meets(1.0):
        return out, 1.0
    good, bad = 0.0, 1.0
    while bad - good > tolerance:
        mid = 0.5 * (good + bad)
        good, bad = (mid, bad) if meets(mid) else (good, mid)
    return at(good), good


def _support_rows(
    one_shot_logprobs: np.ndarray, zero_shot_logprobs: np.ndarray, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    one = _as_logprobs("one_shot_logprobs", one_shot_logprobs, 2)
    zero = _as_logprobs("zero_shot_logprobs", zero_shot_logprobs, 1)
    if one.shape[1:] != zero.shape:
        raise ConfigurationError(f"one-shot rows have {one.shape[1]} entries, the zero-shot row {zero.size}")
    support = top_k_support(zero, top_k)
    # truncation, then renormalisation on the support (Algorithm 1, lines 7 and 10)
    one_k = one[:, support]
    if not np.isfinite(one_k).any(axis=1).all():
        # a one-shot output with no mass on the support: only λ = 0 can pass the constraint; any finite
        # stand-in gives the same λ = 0 and p̄_i = p0
        one_k = np.where(np.isfinite(one_k).any(axis=1, keepdims=True), one_k, zero[support])
    return support, _log_normalize(one_k), _log_normalize(zero[support])


def mozo_distribution(
    one_shot_logprobs: np.ndarray,
    zero_shot_logprobs: np.ndarray,
    *,
    beta: float,
    order: float,
    top_k: int,
    lambda_max: float = LAMBDA_MAX,
    variant: str = "projected",
    tolerance: float = _TOLERANCE,
) -> MozoOutput:
    """The distribution one DPS-MOZO token is sampled from (Algorithm 1, lines 5–16).

    Args:
        one_shot_logprobs: log p(·|one private record, query, generated), shape (n_shots, V).
        zero_shot_logprobs: log p(·|query, generated), shape (V,) (public).
        beta: target leakage β (per-token RDP 4βα at order α, Theorem B.3).
        order: the Rényi order α.
        top_k: k of the public top-k support.
        lambda_max: the upper limit of λ_i (the paper: 1.5).
        variant: ``"paper"`` (Algorithm 1 as published) or ``"projected"`` (the same, then
            :func:`project_output` towards the public centre softmax(n_shots·ℓ0), the output when every
            λ_i = 0; this makes the 4βα per-token bound a theorem, see the module docstring).
        tolerance: the bisections' bracket width.

    Raises:
        ConfigurationError: a parameter is out of range, or the rows are malformed or of mismatched shapes.
    """
    if variant not in VARIANTS:
        raise ConfigurationError(f"variant must be one of {VARIANTS}, got {variant!r}")
    support, one, zero = _support_rows(one_shot_logprobs, zero_shot_logprobs, top_k)
    a = check.order("order", order)
    lambdas = _fit_lambdas(
        one,
        zero,
        radius=check.positive_finite("beta", beta) * a,
        order=a,
        lambda_max=check.positive_finite("lambda_max", lambda_max),
        tolerance=check.positive_finite("tolerance", tolerance),
    )
    output, scale = product_logprobs(mix(one, zero, lambdas)), 1.0
    if variant == "projected":
        center = _log_normalize(one.shape[0] * zero)
        output, scale = project_output(output, center, beta=beta, order=order, tolerance=tolerance)
    return MozoOutput(support, output, lambdas, scale)


def mozo_token(
    one_shot_logprobs: np.ndarray,
    zero_shot_logprobs: np.ndarray,
    *,
    beta: float,
    order: float,
    top_k: int,
    rng: np.random.Generator,
    lambda_max: float = LAMBDA_MAX,
    variant: str = "projected",
    tolerance: float = _TOLERANCE,
) -> MozoToken:
    """One DPS-MOZO token: a draw from :func:`mozo_distribution` with ``rng``; see the module docstring.

    Args:
        one_shot_logprobs: log p(·|one private record, query, generated), shape (n_shots, V).
        zero_shot_logprobs: log p(·|query, generated), shape (V,) (public).
        beta: target leakage β.
        order: the Rényi order α.
        top_k: k of the public top-k support.
        rng: the randomness.
        lambda_max: the upper limit of λ_i.
        variant: ``"paper"`` or ``"projected"`` (as :func:`mozo_distribution`).
        tolerance: the bisections' bracket width.

    Returns:
        The token id (a vocabulary id) and the λ_i (shape (n_shots,)) as diagnostics.

    Raises:
        ConfigurationError: as :func:`mozo_distribution`, or ``rng`` is not a ``numpy.random.Generator``.
    """
    out = mozo_distribution(
        one_shot_logprobs,
        zero_shot_logprobs,
        beta=beta,
        order=order,
        top_k=top_k,
        lambda_max=lambda_max,
        variant=variant,
        tolerance=tolerance,
    )
    return MozoToken(int(out.support[sample_logprobs(out.logprobs, rng)]), out.lambdas)


def nonprivate_token(
    one_shot_logprobs: np.ndarray, zero_shot_logprobs: np.ndarray, *, top_k: int, rng: np.random.Generator
) -> MozoToken:
    """The ε = ∞ baseline: few-shot ensemble decoding, Π_i p(·|record i, query) on the same top-k support.

    λ_i = 1 for every record, no constraint: the paper's "Few-shot" rows (Table 1). NOT differentially private.

    Args:
        one_shot_logprobs: log p(·|record i, query, generated), shape (n_shots, V).
        zero_shot_logprobs: log p(·|query, generated), shape (V,); sets the support.
        top_k: k of the top-k support.
        rng: the randomness.

    Raises:
        ConfigurationError: the rows are malformed, ``top_k`` is not positive, or ``rng`` is not a
            ``numpy.random.Generator``.
    """
    support, one, zero = _support_rows(one_shot_logprobs, zero_shot_logprobs, top_k)
    lambdas = np.ones(one.shape[0])
    return MozoToken(int(support[sample_product(mix(one, zero, lambdas), rng)]), lambdas)
