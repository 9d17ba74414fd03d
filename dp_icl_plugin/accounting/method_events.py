"""The privacy events of the published DP-ICL methods, built from their parameters.

Each factory states the paper's accounting and the relation it holds under; the methods build their runs
on these, so that what is charged is exactly what is analysed. See the papers for the algorithms (Tang et al.
2024; Yamasaki et al. (PTA) 2025; Gao et al. (AdaDPSyn) 2025, Algorithm 1; Bhusal et al., Algorithm 1;
Flemings et al. (DPS-MOZO), Algorithms 1–3) and :mod:`~dp_icl_plugin.accounting.neighbouring` for the
relations.
"""

from __future__ import annotations

import math

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, REPLACE_ONE, check_relation
from dp_icl_plugin.errors import UnsupportedEventError

__all__ = [
    "SIMPLEX_SENSITIVITY",
    "adadpsyn_event",
    "clip_blend_event",
    "clip_blend_paper_epsilon",
    "clip_blend_token_epsilon",
    "good_radius_steps",
    "mozo_event",
    "mozo_rdp_target",
    "require_replace_one",
    "tang_event",
]

SIMPLEX_SENSITIVITY = math.sqrt(2.0)
"""ℓ2 distance between two probability vectors is at most √2 (Tang et al. 2024)."""


def tang_event(
    *, noise_multiplier: float, sampling_rate: float, steps: int, neighbouring: str = REPLACE_ONE
) -> ev.DPEvent:
    """Tang et al. 2024 / PTA (Yamasaki et al. 2025): ``steps`` Poisson-subsampled Gaussian aggregations.

    Each token releases argmax of Σ_i p_i + N(0, 2σ²). One record's presence changes one prompt, hence one
    probability vector p_i: ℓ2 contribution at most √2 (the inner Gaussian's add/remove sensitivity,
    noise multiplier σ), after Poisson sampling at a fixed rate q = M·N/n_y (n_y the declared public size).
    ``steps`` = T × demonstrations per label (PTA, App. D.3). PTA's reshaping keeps each p_i a probability
    vector, so its accounting is identical.

    - add/remove (the papers'): the Poisson-subsampled Gaussian pair.
    - replace-one: the replaced record keeps the other's coin, prompt and place (a coupling: the coin of a
      record absent from a dataset never affects that dataset's output), so token t is
      (1−q)·N(0) + q·N(u) against (1−q)·N(0) + q·N(w), |u|, |w| ≤ √2, charged as dp-accounting's replace-one
      pair (centres ∓√2, ``PoissonSampledEvent``). A replacement that changes the label removes a record
      from one label's run and adds one to another's; with the shared coin, token t of the two runs is
      u = (p, 0) against w = (0, p'): a removal in one run beside an addition in the other
      (remove^T ⊗ add^T over T tokens). That the replace-one charge covers it is checked numerically with
      dp-accounting's PLDs, not proven (``tests/test_tang_pta.py``: the charge is never below it by more
      than the 1e-3 discretisation on the grid tested; at q = 1 the pairs are shifts of 2√2 and 2). Every
      label is charged at the largest rate; a smaller one is dominated by it.

    Args:
        noise_multiplier: σ.
        sampling_rate: q, in (0, 1].
        steps: the tokens composed.
        neighbouring: the ledger's relation.

    Raises:
        ConfigurationError: a parameter is out of range, or the relation is unknown.
    """
    relation = check_relation(neighbouring)
    gaussian = ev.GaussianEvent(
        noise_multiplier=noise_multiplier, sensitivity=SIMPLEX_SENSITIVITY, neighbouring=ADD_REMOVE
    )
    token = ev.PoissonSampledEvent(sampling_rate=sampling_rate, event=gaussian, neighbouring=relation)
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def require_replace_one(method: str, neighbouring: str) -> None:
    """Refuse, before any charge, a method whose only analysis is replace-one under an add/remove ledger.

    Args:
        method: the method's name, for the message.
        neighbouring: the ledger's relation.

    Raises:
        UnsupportedEventError: ``neighbouring`` is add/remove.
        ConfigurationError: ``neighbouring`` names no relation.
    """
    if check_relation(neighbouring) != REPLACE_ONE:
        raise UnsupportedEventError(
            f"{method} samples records without replacement and has an analysis only for replace-one neighbours; "
            "an add/remove ledger cannot hold it (use a replace-one ledger, the default)"
        )


def good_radius_steps(theta: float) -> int:
    """Number of DP binary-search steps of GoodRadius over [0, √2/2] at tolerance θ: ⌈log2(√2/(2θ))⌉.

    Args:
        theta: the tolerance θ > 0.

    Returns:
        The number of steps, at least 1.

    Raises:
        ConfigurationError: ``theta`` is not positive and finite.
    """
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
    labels_touched: int = 1,
) -> ev.DPEvent:
    """AdaDPSyn (Gao et al. 2025, Theorem 1 and App. B): per token, sampled without replacement.

    Replace-one neighbours of the slots a label's records are drawn from (n_y slots, the declared size;
    see ``synthesis/adadpsyn.py``): a swap changes one slot. Per token: GoodRadius = 2⌈log2(√2/(2θ))⌉
    Gaussian queries of a sensitivity-2 score with noise std 2σ0 (multiplier σ0); T̂+1 projected means with
    sensitivity 2R and std 2Rσ1 (multiplier σ1); T̂ coverage counts with sensitivity 1 and std σ2. The
    per-token RDP is amplified by sampling M·N of n_y slots without replacement (WBK 2019, Thm 9) and
    composed over ``steps`` tokens; ``labels_touched`` such runs (2 when a replacement may change a record's
    label: one slot of each of two labels' runs changes, and the independent runs' RDP adds up).

    Args:
        sigma0: GoodRadius's noise multiplier σ0.
        sigma1: the projected means' noise multiplier σ1.
        sigma2: the coverage counts' noise std σ2.
        sampling_rate: γ = M·N/n_y, in (0, 1].
        steps: the tokens composed per label.
        t_hat: T̂, the most radius-reduction rounds per token.
        theta: GoodRadius's tolerance θ.
        labels_touched: the labels' runs one replacement may change (1 or 2 per record; up to 2c per unit that
            takes part in c labels).

    Raises:
        ConfigurationError: a parameter is out of range (a zero noise multiplier included).
    """
    t_hat = check.positive_int("t_hat", t_hat)
    ro = REPLACE_ONE
    parts = ev.compose(
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma0), 2.0, neighbouring=ro), 2 * good_radius_steps(theta)),
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma1), neighbouring=ro), t_hat + 1),
        ev.SelfComposedEvent(ev.GaussianEvent(float(sigma2), neighbouring=ro), t_hat),
    )
    token = ev.SampledWithoutReplacementEvent(sampling_rate=sampling_rate, event=parts)
    total = check.positive_int("steps", steps) * check.positive_int("labels_touched", labels_touched)
    return ev.SelfComposedEvent(token, total)


def mozo_event(*, beta: float, order: float, sampling_rate: float, steps: int) -> ev.DPEvent:
    """DPS-MOZO (Flemings et al., Theorem B.3 and App. B): ``steps`` = n_queries × T_max tokens.

    Replace-one neighbours only (n = |D| is the same for both; no add/remove analysis exists). Each token
    is (α, 4βα)-RDP (proven for the projected mechanism this library releases through, see
    ``MozoTokenEvent``), amplified by sampling n_shots records without replacement (q = n_shots/|D|),
    composed over every token of every answer.

    Args:
        beta: β.
        order: the Rényi order α.
        sampling_rate: q = n_shots/|D|, in (0, 1].
        steps: the tokens composed.

    Raises:
        ConfigurationError: a parameter is out of range.
    """
    per_token = ev.MozoTokenEvent(beta=beta, order=order, neighbouring=REPLACE_ONE)
    token = ev.SampledWithoutReplacementEvent(sampling_rate=sampling_rate, event=per_token)
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def mozo_rdp_target(*, epsilon: float, delta: float, order: float) -> float:
    """ε̃: the RDP budget at order α that converts to (ε, δ) by Balle et al. 2020 (MOZO Algorithm 2, line 3).

    Args:
        epsilon: the target ε.
        delta: the target δ, in (0, 1).
        order: the Rényi order α.

    Raises:
        ConfigurationError: a parameter is out of range.
    """
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.probability_open("delta", delta)
    a = check.order("order", order)
    return epsilon - math.log((a - 1) / a) + (math.log(delta) + math.log(a)) / (a - 1)


def clip_blend_token_epsilon(
    *, clip: float, subset_size: int, temperature: float, neighbouring: str = REPLACE_ONE
) -> float:
    """ε0 of one clip-blend token: an exponential mechanism on ẑ = (z̄ + u)/2 with temperature τ.

    Clipped logits lie in [−c, c] and z̄ divides their sum by the fixed subset size s.
    - add/remove one prompt (the paper's relation, Lemma 2): ẑ moves by at most c/(2s) per entry, so
      ε0 = 2Δ/τ = c/(sτ). Requires the divisor s to be public and fixed (not the number of prompts present,
      not computed from the data) and the group's members not to depend on other records.
    - replace-one (a prompt's record swapped): an entry can move from −c to c, ẑ by c/s per entry, so
      ε0 = 2c/(sτ): twice the paper's figure.

    Args:
        clip: the clipping bound c.
        subset_size: s, the fixed divisor.
        temperature: τ.
        neighbouring: the ledger's relation.

    Raises:
        ConfigurationError: a parameter is out of range, or the relation is unknown.
    """
    c = check.positive_finite("clip", clip)
    s = check.positive_int("subset_size", subset_size)
    tau = check.positive_finite("temperature", temperature)
    return (c if check_relation(neighbouring) == ADD_REMOVE else 2.0 * c) / (s * tau)


def clip_blend_event(
    *, clip: float, subset_size: int, temperature: float, steps: int, neighbouring: str = REPLACE_ONE
) -> ev.DPEvent:
    """Clip-blend synthesis or decoding (Bhusal et al., Algorithm 1, Lemma 2): ``steps`` exponential mechanisms.

    Each token is ε0-DP and ε0-bounded-range (ε0²/8-zCDP) with ε0 from :func:`clip_blend_token_epsilon`
    for the given neighbouring relation; the accountants compose that far more tightly than advanced
    composition. The prompts are fixed (no sampling), so there is no amplification.

    Args:
        clip: the clipping bound c.
        subset_size: s, the fixed divisor.
        temperature: τ.
        steps: the tokens composed.
        neighbouring: the ledger's relation.

    Raises:
        ConfigurationError: a parameter is out of range, or the relation is unknown.
    """
    eps0 = clip_blend_token_epsilon(
        clip=clip, subset_size=subset_size, temperature=temperature, neighbouring=neighbouring
    )
    token = ev.ExponentialMechanismEvent(eps0, neighbouring=check_relation(neighbouring))
    return ev.SelfComposedEvent(token, check.positive_int("steps", steps))


def clip_blend_paper_epsilon(*, clip: float, subset_size: int, temperature: float, steps: int, delta: float) -> float:
    """The paper's figure c·√(2T ln(1/δ))/(sτ) (add/remove): advanced composition without its
    T·ε0(e^ε0−1) term. Not a valid bound when ε0 is not small: report it only next to the real guarantee.

    Args:
        clip: the clipping bound c.
        subset_size: s, the fixed divisor.
        temperature: τ.
        steps: T, the tokens composed.
        delta: the δ of the figure, in (0, 1).

    Raises:
        ConfigurationError: a parameter is out of range.
    """
    eps0 = clip_blend_token_epsilon(
        clip=clip, subset_size=subset_size, temperature=temperature, neighbouring=ADD_REMOVE
    )
    t = check.positive_int("steps", steps)
    return eps0 * math.sqrt(2.0 * t * math.log(1.0 / check.probability_open("delta", delta)))
