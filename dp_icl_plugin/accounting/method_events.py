"""The privacy events of the published DP-ICL methods, built from their parameters.

Each factory states the paper's accounting; the methods issue builds its runs on these, so that what is
charged is exactly what is analysed. See ``../shared/REFERENCE.md`` §1–5 for the algorithms.
"""

from __future__ import annotations

import math

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev

__all__ = [
    "adadpsyn_event",
    "clip_blend_event",
    "clip_blend_paper_epsilon",
    "clip_blend_token_epsilon",
    "good_radius_steps",
    "mozo_event",
    "mozo_rdp_target",
    "tang_event",
]

SIMPLEX_SENSITIVITY = math.sqrt(2.0)
"""ℓ2 distance between two probability vectors is at most √2 (Tang et al. 2024)."""


def tang_event(*, noise_multiplier: float, sampling_rate: float, steps: int) -> ev.DPEvent:
    """Tang et al. 2024 / PTA (Yamasaki et al. 2025): ``steps`` Poisson-subsampled Gaussian aggregations.

    Add/remove neighbours; each token releases argmax of Σ_i p_i + N(0, 2σ²): a sum of probability
    vectors (ℓ2 sensitivity √2) with noise multiplier σ, after Poisson sampling at rate q = M·N/|D_y|.
    ``steps`` = T × demonstrations per label (PTA, App. D.3). PTA's reshaping keeps each p_i a
    probability vector, so its accounting is identical.
    """
    gaussian = ev.GaussianEvent(noise_multiplier=noise_multiplier, sensitivity=SIMPLEX_SENSITIVITY)
    token = ev.PoissonSampledEvent(sampling_rate=sampling_rate, event=gaussian)
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def good_radius_steps(theta: float) -> int:
    """Number of DP binary-search steps of GoodRadius over [0, √2/2] at tolerance θ: ⌈log2(√2/(2θ))⌉."""
    theta = check.positive_finite("theta", theta)
    return max(1, math.ceil(math.log2(math.sqrt(2.0) / (2.0 * theta))))


def adadpsyn_event(
    *,
    sigma0: float,
    sigma1: float,
    sigma2: float,
    sampling_rate: float,
    steps: int,
    t_hat: int,
    theta: float = 0.1,
) -> ev.DPEvent:
    """AdaDPSyn (Gao et al. 2025, Theorem 1 and App. B): per token, sampled without replacement.

    Replace-one neighbours. Per token: GoodRadius = 2⌈log2(√2/(2θ))⌉ Gaussian queries of a sensitivity-2
    score with noise std 2σ0 (multiplier σ0); T̂+1 projected means with sensitivity 2R and std 2Rσ1
    (multiplier σ1); T̂ coverage counts with sensitivity 1 and std σ2. The per-token RDP is amplified by
    sampling M·N of |D_y| records without replacement (WBK 2019, Thm 9) and composed over ``steps`` tokens.
    """
    t_hat = check.positive_int("t_hat", t_hat)
    parts = ev.compose(
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma0), sensitivity=2.0), 2 * good_radius_steps(theta)),
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma1)), t_hat + 1),
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma2)), t_hat),
    )
    token = ev.SampledWithoutReplacementEvent(sampling_rate=sampling_rate, event=parts)
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def mozo_event(*, beta: float, order: float, sampling_rate: float, steps: int) -> ev.DPEvent:
    """DPS-MOZO (Flemings et al., Theorem B.3 and App. B): ``steps`` = n_queries × T_max tokens.

    Replace-one neighbours. Each token is (α, 4βα)-RDP, amplified by sampling n_shots records without
    replacement (q = n_shots/|D|), composed over every token of every answer.
    """
    token = ev.SampledWithoutReplacementEvent(sampling_rate=sampling_rate, event=ev.MozoTokenEvent(beta=beta, order=order))
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def mozo_rdp_target(*, epsilon: float, delta: float, order: float) -> float:
    """ε̃: the RDP budget at order α that converts to (ε, δ) by Balle et al. 2020 (MOZO Algorithm 2, line 3)."""
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.probability_open("delta", delta)
    a = check.order("order", order)
    return epsilon - math.log((a - 1) / a) + (math.log(delta) + math.log(a)) / (a - 1)


def clip_blend_token_epsilon(*, clip: float, subset_size: int, temperature: float) -> float:
    """ε0 = 2Δ/τ = c/(sτ): one clip-blend token is an exponential mechanism with utility sensitivity c/(2s)."""
    c = check.positive_finite("clip", clip)
    s = check.positive_int("subset_size", subset_size)
    tau = check.positive_finite("temperature", temperature)
    return c / (s * tau)


def clip_blend_event(*, clip: float, subset_size: int, temperature: float, steps: int) -> ev.DPEvent:
    """Clip-blend synthesis (Bhusal et al., Algorithm 1, Lemma 2): ``steps`` exponential mechanisms.

    Replace-one neighbours within the fixed disjoint subsets: the averaged clipped logits move by at most
    c/s per entry, the blended logits by c/(2s). Each token is ε0 = c/(sτ)-DP and ε0-bounded-range
    (ε0²/8-zCDP), which the accountants compose far more tightly than advanced composition.
    """
    eps0 = clip_blend_token_epsilon(clip=clip, subset_size=subset_size, temperature=temperature)
    return ev.SelfComposedEvent(ev.ExponentialMechanismEvent(eps0), check.positive_int("steps", steps))


def clip_blend_paper_epsilon(*, clip: float, subset_size: int, temperature: float, steps: int, delta: float) -> float:
    """The paper's figure c·√(2T ln(1/δ))/(sτ): advanced composition without its T·ε0(e^ε0−1) term.

    Not a valid bound when ε0 is not small: report it only next to the real guarantee.
    """
    eps0 = clip_blend_token_epsilon(clip=clip, subset_size=subset_size, temperature=temperature)
    t = check.positive_int("steps", steps)
    return eps0 * math.sqrt(2.0 * t * math.log(1.0 / check.probability_open("delta", delta)))
