"""Audit cases: each runs one of the library's own mechanisms on worst-case-style neighbouring inputs.

A case names the privacy claim the library makes for one call of the mechanism (the event it charges, its ε
at the audit's δ from the tightest accountant) and draws outputs by calling the real mechanism function. The
*broken* variant runs the same code with half the noise (for MOZO: without its mixing constraint) while
keeping the claim, so the audit must catch it. Inputs are chosen so that the telling output is rare but
observable: a family of neighbouring pairs, tuned for the claimed noise and for half of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.mechanisms.clip_blend import blended_scores, clip_blend_token
from dp_icl_plugin.mechanisms.gaussian_aggregation import noisy_argmax
from dp_icl_plugin.mechanisms.keyword_ptr import stable_top_k
from dp_icl_plugin.mechanisms.mozo import mozo_distribution
from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max

__all__ = ["CASES", "AuditCase"]

Sampler = Callable[[bool, int, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class AuditCase:
    """One mechanism under audit.

    Attributes:
        name: the mechanism.
        event: what the library charges for one call (its claim).
        delta: the δ the claim is audited at (the test's δ).
        broken_as: what the broken variant changes.
        claim_delta: the δ the event's ε is computed at (smaller than ``delta`` by the δ₀ of an
            approximate-DP mechanism such as PTR; equal otherwise).
        pairs: for ``broken`` False/True, samplers ``(neighbour, n, rng) -> outputs``, one per neighbouring pair.
    """

    name: str
    event: ev.DPEvent
    delta: float
    pairs: Callable[[bool], list[Sampler]]
    claim_delta: float | None = None
    broken_as: str = "noise halved"

    @property
    def claimed_epsilon(self) -> float:
        return tightest().epsilon(self.event, delta=self.claim_delta or self.delta)


def _loop(draw: Callable[[np.random.Generator], int]) -> Callable[[int, np.random.Generator], np.ndarray]:
    return lambda n, rng: np.fromiter((draw(rng) for _ in range(n)), dtype=np.int64, count=n)


# -- report-noisy-max (kNN votes): one vote moves between two labels -------------------------------------------
_RNM_STD = 3.0


def _rnm_pairs(broken: bool) -> list[Sampler]:
    std = _RNM_STD / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_RNM_STD, _RNM_STD / 2):
        gap = max(2, round(2.5 * tuned * math.sqrt(2)))  # label 0 trails by ≈ 2.5 noise sds on D'
        counts = {False: np.array([1.0, gap - 1.0]), True: np.array([0.0, float(gap)])}
        samplers.append(
            lambda nb, n, rng, c=counts: _loop(lambda r: report_noisy_max(c[nb], noise_std=std, rng=r))(n, rng)
        )
    return samplers


# -- Gaussian aggregation (Tang / PTA): one prompt's distribution moves to the other token --------------------
_TANG_SIGMA = 1.0


def _tang_pairs(broken: bool) -> list[Sampler]:
    sigma = _TANG_SIGMA / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_TANG_SIGMA, _TANG_SIGMA / 2):
        m = max(2, round(3.0 * 2 * tuned))  # the difference of the two noisy sums has std 2σ
        others = np.tile([0.0, 1.0], (m - 1, 1))
        rows = {False: np.vstack([[1.0, 0.0], others]), True: np.vstack([[0.0, 1.0], others])}
        samplers.append(
            lambda nb, n, rng, r=rows: _loop(lambda g: noisy_argmax(r[nb], noise_multiplier=sigma, rng=g))(n, rng)
        )
    return samplers


# -- keyword propose-test-release: the stability distance moves by one ------------------------------------------
_PTR_STD, _PTR_DELTA = 1.0, 0.01


def _ptr_pairs(broken: bool) -> list[Sampler]:
    std = _PTR_STD / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for d in (0, 1, 2):  # histograms at stability distance d and d + 1 (k = 1)
        gaps = {False: 2 * d + 1, True: 2 * d + 3}
        samplers.append(
            lambda nb, n, rng, g=gaps: np.fromiter(
                (stable_top_k(np.array([1, 2]), np.array([g[nb], 0]), k=1, noise_std=std, delta=_PTR_DELTA,
                              rng=rng).passed for _ in range(n)),
                dtype=np.int64, count=n,
            )
        )  # fmt: skip
    return samplers


# -- clip-blend: one private prompt (favouring the rare token) is removed --------------------------------------
_CLIP, _S, _TAU = 10.0, 10, 1.0


def _clip_pairs(broken: bool) -> list[Sampler]:
    tau = _TAU / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_TAU, _TAU / 2):
        # neutral private rows; the public row pushes token 0 down until it is rare (P ≈ 0.02) at the tuned τ
        rows = np.zeros((_S - 1, 2))
        push = 0.0
        for push in np.linspace(0, 2 * _CLIP, 401):
            z = blended_scores(rows, np.array([0.0, push]), clip=_CLIP, subset_size=_S)
            if z[1] - z[0] >= math.log(50.0) * tuned:
                break
        public = np.array([0.0, push])
        private = {False: np.vstack([[2 * _CLIP, 0.0], rows]), True: rows}  # D has one more prompt, for token 0
        samplers.append(
            lambda nb, n, rng, p=private, u=public: _loop(
                lambda g: clip_blend_token(p[nb], u, clip=_CLIP, subset_size=_S, temperature=tau, rng=g)
            )(n, rng)
        )
    return samplers


# -- DPS-MOZO (projected): one one-shot prompt's distribution changes ----------------------------------------
_BETA, _ORDER = 0.05, 8.0


def _mozo_pairs(broken: bool) -> list[Sampler]:
    # Broken: the mixing constraint off (λ up to its limit, no projection): the bug of skipping the bisection.
    beta, variant = (1e3, "paper") if broken else (_BETA, "projected")
    zero = np.log(np.array([0.97, 0.01, 0.01, 0.01]))
    others = np.tile(zero, (3, 1))
    rows = {False: np.vstack([np.log([0.01, 0.01, 0.01, 0.97]), others]), True: np.vstack([zero, others])}

    def sampler(nb: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        out = mozo_distribution(rows[nb], zero, beta=beta, order=_ORDER, top_k=4, variant=variant)
        probs = np.exp(out.logprobs - out.logprobs.max())
        return out.support[rng.choice(len(probs), size=n, p=probs / probs.sum())]

    return [sampler]


CASES: tuple[AuditCase, ...] = (
    AuditCase("report-noisy-max (kNN vote)", ev.GaussianEvent(_RNM_STD / math.sqrt(2), math.sqrt(2)), 1e-4,
              _rnm_pairs),
    AuditCase("Gaussian aggregation (Tang/PTA token)", ev.GaussianEvent(_TANG_SIGMA, math.sqrt(2)), 1e-4,
              _tang_pairs),
    AuditCase("keyword PTR test", ev.GaussianEvent(_PTR_STD), _PTR_DELTA + 1e-3, _ptr_pairs, claim_delta=1e-3),
    AuditCase("clip-blend token", ev.ExponentialMechanismEvent(_CLIP / (_S * _TAU)), 1e-6, _clip_pairs),
    AuditCase("DPS-MOZO token (projected)", ev.MozoTokenEvent(beta=_BETA, order=_ORDER), 1e-3, _mozo_pairs,
              broken_as="mixing constraint off"),
)  # fmt: skip
"""The mechanisms audited; their claims are the per-call events the library charges."""
