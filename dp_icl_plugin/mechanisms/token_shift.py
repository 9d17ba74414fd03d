"""How much private records can move one released token: the figure that says whether a paid release can
carry anything of them (the *token shift*). Public settings only.

The figure that decides whether a DP decoder can give back anything the zero-shot answer would not is the
largest probability any set of records can add to one token:

- clip-blend samples from softmax(ẑ/τ), ẑ = (z̄ + clip_c(u))/2, expert decoding from softmax(ℓ0/T0 + z̄/(2τ)), with
  the records' mean z̄ ∈ [−c, c]: against rows that favour nothing, the records add at most R = c/τ = ε0·s/2 nats to
  one token's log-odds over any other (s the fixed divisor: the subset size, or k experts), which raises a token's
  probability by at most tanh(R/4) (the largest p′ − p with logit(p′) − logit(p) = R, at p = 1/(1 + e^{R/2})).
- DPS-MOZO's projected output lies within D_{2α}(out‖c0) ≤ r1 and D_{2α−1}(c0‖out) ≤ r2 of the public centre
  (Hölder radii, :func:`~dp_icl_plugin.mechanisms.mozo_mixing.holder_radii`): :func:`mozo_shift` finds the largest
  gain that ball allows. The centre softmax(n_shots·ℓ0) is the zero-shot row sharpened: sampling near it is
  near-greedy zero-shot decoding.

Below :data:`USELESS_SHIFT` the answer is the zero-shot one with high probability: the decoders warn
(:class:`~dp_icl_plugin.errors.WeakReleaseWarning`).

**How many records must agree.** Where each record adds at most r nats (its share of R: r = R/s for s records
in a fixed divisor), a token whose log-odds j records raise together gains at most tanh(j·r/4): it *tips* (gains
:data:`WEAK_SHIFT`, enough to turn a close call) only when j ≥ :func:`agreeing_to_tip` (r) = ⌈4·atanh(WEAK_SHIFT)/r⌉.
A fact fewer records share than that cannot reach an answer, whatever the model; a figure above s says no set of
the records an answer reads can carry one. The keyword answer of kNN refuses outright when even a
keyword that every shard says would pass its threshold with probability below :data:`MIN_KEYWORD_PASS`.
"""

from __future__ import annotations

import math
import warnings

from scipy.special import ndtr

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import WeakReleaseWarning
from dp_icl_plugin.mechanisms.mozo_mixing import holder_radii

__all__ = [
    "MIN_KEYWORD_PASS",
    "TIP_NATS",
    "USELESS_SHIFT",
    "WEAK_SHIFT",
    "agreeing_to_tip",
    "best_token_probability",
    "keyword_pass_probability",
    "log_odds_shift",
    "mozo_shift",
    "verdict",
    "warn_if_weak",
]

USELESS_SHIFT = 0.05
"""A token shift below this: the records cannot change an answer in any way a reader would see."""
WEAK_SHIFT = 0.25
"""A token shift below this: the records can tip close calls only."""
TIP_NATS = 4.0 * math.atanh(WEAK_SHIFT)
"""The log-odds rise that tips a token: the one whose most probability gain, tanh(R/4), is :data:`WEAK_SHIFT`."""
MIN_KEYWORD_PASS = 0.05
"""A keyword every shard says must pass the threshold at least this often, or the keyword answer is refused."""


def log_odds_shift(nats: float) -> float:
    """The most probability a token can gain when its log-odds over every other token rise by ``nats``: tanh(R/4).

    Args:
        nats: R ≥ 0, the rise in log-odds.

    Raises:
        ConfigurationError: ``nats`` is negative or not finite.
    """
    return math.tanh(check.non_negative_finite("nats", nats) / 4.0)


def best_token_probability(nats: float, support: int) -> float:
    """The most probability one token can have when every token's score lies within ``nats`` of every other's,
    over ``support`` tokens: 1 / (1 + (K − 1)·e^(−R)) (the token at the top, all others at the bottom).

    Args:
        nats: R ≥ 0, the widest gap between two tokens' scores (after the temperature).
        support: K ≥ 1, the tokens that can be drawn.

    Raises:
        ConfigurationError: ``nats`` negative or not finite, or ``support`` not a positive int.
    """
    r = check.non_negative_finite("nats", nats)
    k = check.positive_int("support", support)
    return 1.0 / (1.0 + (k - 1) * math.exp(-r))


def agreeing_to_tip(nats_per_record: float) -> int | None:
    """How many records must raise one token's log-odds together for it to tip: the least j with
    j·``nats_per_record`` ≥ :data:`TIP_NATS` (None when a record moves nothing).

    Args:
        nats_per_record: r ≥ 0, the most one record adds to a token's log-odds over any other.

    Raises:
        ConfigurationError: ``nats_per_record`` is negative or not finite.
    """
    r = check.non_negative_finite("nats_per_record", nats_per_record)
    if r == 0.0:
        return None
    j = TIP_NATS / r
    return max(1, math.ceil(j - 1e-9 * j))  # 1e-9: j·r equal to TIP_NATS up to rounding is enough


def mozo_shift(beta: float, order: float) -> float:
    """DPS-MOZO's largest probability gain on one token, over every public centre c0 and every output the
    projection admits: max p − c over c ∈ (0, 1) and two-point tilts (p on the token, the rest scaled) with
    D_{2α}(out‖c0) ≤ r1 and D_{2α−1}(c0‖out) ≤ r2 (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.holder_radii`).
    Moving mass onto one token and scaling the rest is the cheapest way to gain it in any Rényi divergence
    (the divergence of the two-point coarsening is at most that of the whole); c runs over a grid.

    Args:
        beta: β.
        order: the Rényi order α.

    Raises:
        ConfigurationError: ``beta`` or ``order`` is out of range.
    """
    r1, r2 = holder_radii(beta, order)
    a = check.order("order", order)

    def renyi(p: float, q: float, k: float) -> float:  # D_k between (p, 1 − p) and (q, 1 − q)
        terms = [k * math.log(p) + (1 - k) * math.log(q)]
        if p < 1:
            terms.append(k * math.log1p(-p) + (1 - k) * math.log1p(-q))
        top = max(terms)
        return (top + math.log(sum(math.exp(t - top) for t in terms))) / (k - 1)

    def fits(p: float, c: float) -> bool:  # p = 1 leaves the centre's other mass on a point of probability 0
        return p < 1 and renyi(p, c, 2 * a) <= r1 and renyi(c, p, 2 * a - 1) <= r2

    best = 0.0
    for c in [10.0**e for e in (-6, -5, -4, -3)] + [i / 40 for i in range(1, 40)]:
        low, high = c, 1.0
        for _ in range(60):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if fits(mid, c) else (low, mid)
        best = max(best, low - c)
    return best


def verdict(shift: float) -> str:
    """``"useless"``, ``"weak"`` or ``"useful"`` for a token shift (see :data:`USELESS_SHIFT`, :data:`WEAK_SHIFT`).

    Args:
        shift: a token shift.
    """
    return "useless" if shift < USELESS_SHIFT else "weak" if shift < WEAK_SHIFT else "useful"


def keyword_pass_probability(threshold: float, shards: int, noise_std: float) -> float:
    """P[shards + N(0, σ²) > T]: how often a keyword that every shard says is released.

    Args:
        threshold: T.
        shards: the number of shards (the keyword's count).
        noise_std: σ.

    Raises:
        ConfigurationError: ``noise_std`` is not positive and finite.
    """
    return float(ndtr((shards - threshold) / check.positive_finite("noise_std", noise_std)))  # the normal tail


def warn_if_weak(what: str, shift: float, change: str, *, read: int | None = None) -> None:
    """Warn (:class:`~dp_icl_plugin.errors.WeakReleaseWarning`) when ``shift`` is below :data:`USELESS_SHIFT`:
    the answers would be paid for and be the zero-shot ones with high probability.

    Args:
        what: the release, for the message.
        shift: its token shift (the ``read`` records all agreeing).
        change: the setting to change, for the message.
        read: the records an answer reads, each adding an equal share of the shift's log-odds (a fixed divisor):
            the message then says how many of them must agree for a token to tip (:func:`agreeing_to_tip`).
    """
    if shift < USELESS_SHIFT:
        agree = ""
        if read is not None and shift > 0:
            need = agreeing_to_tip(4.0 * math.atanh(shift) / read)
            agree = f" (a token tips only when {need} records agree on it; an answer reads {read})"
        warnings.warn(
            f"{what}: the private records can add at most {shift:.3g} to any token's probability (below "
            f"{USELESS_SHIFT}){agree}, so the answers will almost surely be the zero-shot answers while each is "
            f"charged; {change} (see `dp-icl plan`)",
            WeakReleaseWarning,
            stacklevel=3,
        )
