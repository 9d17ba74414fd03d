"""The privacy events of the published DP-ICL methods, built from their parameters.

Each factory states the paper's accounting; the methods issue builds its runs on these, so that what is
charged is exactly what is analysed. See ``../shared/REFERENCE.md`` §1–5 for the algorithms.
"""

from __future__ import annotations

import math

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.errors import ConfigurationError

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

    Replace-one neighbours. Each token is (α, 4βα)-RDP (proven for the projected mechanism this library
    releases through, see ``MozoTokenEvent``), amplified by sampling n_shots records without replacement
    (q = n_shots/|D|), composed over every token of every answer.
    """
    per_token = ev.MozoTokenEvent(beta=beta, order=order)
    token = ev.SampledWithoutReplacementEvent(sampling_rate=sampling_rate, event=per_token)
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def mozo_rdp_target(*, epsilon: float, delta: float, order: float) -> float:
    """ε̃: the RDP budget at order α that converts to (ε, δ) by Balle et al. 2020 (MOZO Algorithm 2, line 3)."""
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.probability_open("delta", delta)
    a = check.order("order", order)
    return epsilon - math.log((a - 1) / a) + (math.log(delta) + math.log(a)) / (a - 1)


def clip_blend_token_epsilon(
    *, clip: float, subset_size: int, temperature: float, neighbouring: str = ev.ADD_REMOVE
) -> float:
    """ε0 of one clip-blend token: an exponential mechanism on ẑ = (z̄ + u)/2 with temperature τ.

    Clipped logits lie in [−c, c] and z̄ divides their sum by the fixed subset size s.
    - add/remove one prompt (the paper's relation, Lemma 2): ẑ moves by at most c/(2s) per entry, so
      ε0 = 2Δ/τ = c/(sτ). Requires the mechanism to divide by the fixed s, not by the prompts present.
    - replace-one (a prompt's record swapped): an entry can move from −c to c, ẑ by c/s per entry, so
      ε0 = 2c/(sτ): twice the paper's figure.
    """
    c = check.positive_finite("clip", clip)
    s = check.positive_int("subset_size", subset_size)
    tau = check.positive_finite("temperature", temperature)
    if neighbouring not in (ev.ADD_REMOVE, ev.REPLACE_ONE):
        raise ConfigurationError(f"neighbouring must be {ev.ADD_REMOVE!r} or {ev.REPLACE_ONE!r}")
    return (c if neighbouring == ev.ADD_REMOVE else 2.0 * c) / (s * tau)


def clip_blend_event(
    *, clip: float, subset_size: int, temperature: float, steps: int, neighbouring: str = ev.ADD_REMOVE
) -> ev.DPEvent:
    """Clip-blend synthesis or decoding (Bhusal et al., Algorithm 1, Lemma 2): ``steps`` exponential mechanisms.

    Each token is ε0-DP and ε0-bounded-range (ε0²/8-zCDP) with ε0 from :func:`clip_blend_token_epsilon`
    for the given neighbouring relation; the accountants compose that far more tightly than advanced
    composition. The prompts are fixed (no sampling), so there is no amplification.
    """
    eps0 = clip_blend_token_epsilon(clip=clip, subset_size=subset_size, temperature=temperature,
                                    neighbouring=neighbouring)  # fmt: skip
    return ev.SelfComposedEvent(ev.ExponentialMechanismEvent(eps0), check.positive_int("steps", steps))


def clip_blend_paper_epsilon(*, clip: float, subset_size: int, temperature: float, steps: int, delta: float) -> float:
    """The paper's figure c·√(2T ln(1/δ))/(sτ) (add/remove): advanced composition without its
    T·ε0(e^ε0−1) term. Not a valid bound when ε0 is not small: report it only next to the real guarantee.
    """
    eps0 = clip_blend_token_epsilon(clip=clip, subset_size=subset_size, temperature=temperature)
    t = check.positive_int("steps", steps)
    return eps0 * math.sqrt(2.0 * t * math.log(1.0 / check.probability_open("delta", delta)))
