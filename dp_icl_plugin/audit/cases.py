"""Audit cases: each runs one of the library's own mechanisms on worst-case-style neighbouring inputs.

A case names the privacy claim the library makes for one call of the mechanism (the event it charges, its ε
at the audit's δ from the tightest accountant) and draws outputs by calling the real mechanism function. The
*broken* variant runs the same code with half the noise (for MOZO: without its mixing constraint; for the
keyword threshold: with noise and threshold over the tokens some shard said only; for the
individual filter: with the filter's refusal ignored; for clip-blend synthesis: with s and τ read from the
data, the defect issue 14 fixed) while keeping the claim, so the audit must catch it. The mixed-ledger case
keeps the mechanism and breaks the claim instead: the total of its components taken at face value, the way
a ledger that ignored neighbouring relations composed them. The decoder case (:mod:`.decoder_case`) runs the
real ``MozoDecoder`` on a real model in bfloat16 and breaks the backend instead: the public zero-shot row
computed in the shared, padded batch of the private rows, as before row isolation. The expert-decoding
cases (:mod:`.expert_case`) run the real kNN retrieval and expert token step, broken with the temperature
halved and with the divisor read from the data, sparse expert decoding with its sparse-vector test
without noise, and expert decoding paid per token with a refused expert's slot left empty (no move-up); the
sparse-vector test alone is broken with its noise halved. The keyword-hints case
(:mod:`.keyword_case`) runs the real records' votes and threshold release, broken by letting a record vote every
word it holds. The privacy-unit cases
(:mod:`.unit_case`) draw units as the library does, D against D minus a whole unit, broken by sampling that
unit's records as if independent.
Inputs are chosen so that the telling output is rare but observable: a family of neighbouring pairs, tuned
for the claimed noise and for half of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost
from dp_icl_plugin.accounting.renyi_filter import RenyiFilter
from dp_icl_plugin.audit import decoder_case, expert_case, keyword_case, unit_case
from dp_icl_plugin.audit.sampling import loop, rare_token_public_row
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.mechanisms.adadpsyn_aggregation import release_token
from dp_icl_plugin.mechanisms.clip_blend_sampling import blended_scores, clip_blend_token
from dp_icl_plugin.mechanisms.gaussian_aggregation import noisy_argmax, pta_distributions, restrict
from dp_icl_plugin.mechanisms.keyword_ptr import stable_top_k
from dp_icl_plugin.mechanisms.keyword_threshold import threshold_keywords, threshold_sensitivity
from dp_icl_plugin.mechanisms.mozo_mixing import mozo_distribution
from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max
from dp_icl_plugin.mechanisms.sparse_vector import AboveThreshold
from dp_icl_plugin.retrieval.retriever import SQRT2, noise_for_uses
from dp_icl_plugin.synthesis.clip_blend import ClipBlendSynthesizer

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
        sample_share: the fraction of the audit's samples this case draws (a case whose one output costs
            many mechanism calls draws fewer, so that ``--quick`` stays quick; one that draws its outputs at
            once from fixed laws may draw more).
        broken_event: when set, the broken variant runs the shipped mechanism and is judged against this
            (wrong) claim instead.
        requires: when set, says why the case cannot run here (a sentence naming what to install), or None
            when it can; a case that cannot run is reported as skipped.
        broken_shows: when set, says why the broken variant's defect does not show on this machine (measured
            before any sample, e.g. kernels that keep padded rows bit-identical), or None when it does; such a
            broken row is reported as skipped with that measurement, not judged (it would read MISSED whatever
            the audit's power, and the shipped row still runs).
    """

    name: str
    event: ev.DPEvent
    delta: float
    pairs: Callable[[bool], list[Sampler]]
    claim_delta: float | None = None
    broken_as: str = "noise halved"
    sample_share: float = 1.0
    broken_event: ev.DPEvent | None = None
    requires: Callable[[], str | None] | None = None
    broken_shows: Callable[[], str | None] | None = None

    @property
    def claimed_epsilon(self) -> float:
        return tightest().epsilon(self.event, delta=self.claim_delta or self.delta)

    def claim(self, broken: bool) -> float:
        """The ε a variant is judged against: the shipped claim, or the broken accounting's.

        Args:
            broken: judge the broken variant.
        """
        if broken and self.broken_event is not None:
            return tightest().epsilon(self.broken_event, delta=self.claim_delta or self.delta)
        return self.claimed_epsilon


# -- report-noisy-max (kNN votes): one vote moves between two labels -------------------------------------------
_RNM_STD = 3.0


def _rnm_pairs(broken: bool) -> list[Sampler]:
    std = _RNM_STD / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_RNM_STD, _RNM_STD / 2):
        gap = max(2, round(2.5 * tuned * math.sqrt(2)))  # label 0 trails by ≈ 2.5 noise sds on D'
        counts = {False: np.array([1.0, gap - 1.0]), True: np.array([0.0, float(gap)])}
        samplers.append(
            lambda nb, n, rng, c=counts: loop(lambda r: report_noisy_max(c[nb], noise_std=std, rng=r))(n, rng)
        )
    return samplers


# -- the sparse-vector test (AboveThreshold): queries that move in opposite directions ------------------------
_SVT_SCALE = 1.0  # b = Δ/ε_s with Δ = 1: one run is ε_s = 1 pure DP
_SVT_STEPS = 5


def _sparse_vector_pairs(broken: bool) -> list[Sampler]:
    """One run of :class:`AboveThreshold` over five sensitivity-1 queries, D = (0, 0, 0, 0, 1) against
    D′ = (1, 1, 1, 1, 0) (each query moves by Δ, in opposite directions at the end: the pattern where the bound
    of Dwork & Roth's Thm. 3.23 is nearly tight), the output the first ⊤'s position (5: none). Broken: the noise
    halved (the scale of a run claimed at ε_s, spent at 2ε_s)."""
    scale = _SVT_SCALE / (2 if broken else 1)
    samplers: list[Any] = []
    for tuned in (_SVT_SCALE, _SVT_SCALE / 2):
        queries = {False: [0.0] * (_SVT_STEPS - 1) + [1.0], True: [1.0] * (_SVT_STEPS - 1) + [0.0]}

        def first_above(r: np.random.Generator, values: list[float], threshold: float = -tuned) -> int:
            test = AboveThreshold(threshold=threshold, scale=scale, positives=1, rng=r)
            return next((i for i, v in enumerate(values) if test.above(v)), len(values))

        samplers.append(lambda nb, n, rng, q=queries, f=first_above: loop(lambda r: f(r, q[nb]))(n, rng))
    return samplers


# -- Gaussian aggregation (Tang et al.): one prompt's distribution moves to the other token --------------------
_TANG_SIGMA = 1.0


def _tang_pairs(broken: bool) -> list[Sampler]:
    sigma = _TANG_SIGMA / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_TANG_SIGMA, _TANG_SIGMA / 2):
        m = max(2, round(3.0 * 2 * tuned))  # the difference of the two noisy sums has std 2σ
        others = np.tile([0.0, 1.0], (m - 1, 1))
        rows = {False: np.vstack([[1.0, 0.0], others]), True: np.vstack([[0.0, 1.0], others])}
        samplers.append(
            lambda nb, n, rng, r=rows: loop(lambda g: noisy_argmax(r[nb], noise_multiplier=sigma, rng=g))(n, rng)
        )
    return samplers


# -- PTA (Yamasaki et al. 2025): one prompt's reshaped distribution moves to the other candidate ---------------
# The rows go through the real reshaping (eq. 13, α = 2, with the base term) and restriction to a public
# vocabulary without renormalising, then the clipped noisy argmax (Algorithm 1, line 10), as PTASynthesizer
# calls them. Private log-probabilities near a vertex make the reshaped rows near vertices too, so the one
# replaced prompt moves the sum by almost the full √2. Claim: Tang's per-token event (PTA App. D.2).
_PTA_ALPHA, _PTA_VOCAB = 2.0, np.array([0, 1])  # 3 tokens; the candidates are the first two


def _pta_rows(m: int, first: int) -> np.ndarray:
    log = np.log(np.full((m, 3), 1e-6))
    log[0, first] = log[1:, 1] = math.log1p(-2e-6)
    flat = np.log(np.full(3, 1.0 / 3.0))
    reshaped = pta_distributions(log, flat, alpha=_PTA_ALPHA, base_logprobs=flat)
    return restrict(reshaped, _PTA_VOCAB, renormalize=False)


def _pta_pairs(broken: bool) -> list[Sampler]:
    sigma = _TANG_SIGMA / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_TANG_SIGMA, _TANG_SIGMA / 2):
        m = max(2, round(3.0 * 2 * tuned))
        rows = {False: _pta_rows(m, 0), True: _pta_rows(m, 1)}
        samplers.append(
            lambda nb, n, rng, r=rows: loop(
                lambda g: noisy_argmax(r[nb], noise_multiplier=sigma, rng=g, clip_negative=True)
            )(n, rng)
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
                (
                    stable_top_k(
                        np.array([1, 2]), np.array([g[nb], 0]), k=1, noise_std=std, delta=_PTR_DELTA, rng=rng
                    ).passed
                    for _ in range(n)
                ),
                dtype=np.int64,
                count=n,
            )
        )
    return samplers


# -- keyword threshold: one shard's answer swaps its keyword (m = 1) for another ---------------------------------
# Token 0 is said only by the changed shard. Broken: noise and threshold over the said tokens only (the
# partition-selection shortcut, which needs a δ that this claim does not have): token 0 can then never
# pass on D', and passing on D gives it away.
_KW_STD, _KW_VOCAB = 2.0, 4


def _keyword_threshold_pairs(broken: bool) -> list[Sampler]:
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for others in (0, 3):  # token 1: said by no other shard, or by three
        counts = {False: np.array([1, others, 0, 0]), True: np.array([0, others + 1, 0, 0])}

        def draw(g: np.random.Generator, h: np.ndarray) -> int:
            said = np.flatnonzero(h) if broken else np.arange(h.size)
            out = threshold_keywords(h[said], noise_std=_KW_STD, limit=_KW_VOCAB, rng=g).keywords or ()
            return sum(1 << int(said[t]) for t in out)

        samplers.append(lambda nb, n, rng, c=counts, d=draw: loop(lambda g: d(g, c[nb]))(n, rng))
    return samplers


# -- clip-blend: one private prompt (favouring the rare token) is removed --------------------------------------
_CLIP, _S, _TAU = 10.0, 10, 1.0


def _clip_pairs(broken: bool) -> list[Sampler]:
    tau = _TAU / (2 if broken else 1)
    samplers: list[Any] = []  # Samplers (the lambdas bind their pair's inputs as defaults)
    for tuned in (_TAU, _TAU / 2):
        # neutral private rows; the public row pushes token 0 down until it is rare (P ≈ 0.02) at the tuned τ
        rows = np.zeros((_S - 1, 2))
        public = rare_token_public_row(rows, clip=_CLIP, subset_size=_S, temperature=tuned)
        private = {False: np.vstack([[2 * _CLIP, 0.0], rows]), True: rows}  # D has one more prompt, for token 0
        samplers.append(
            lambda nb, n, rng, p=private, u=public: loop(
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


# -- AdaDPSyn, one token (Algorithm 1): one prompt's next-token distribution is replaced ------------------------
# Replace-one neighbours on the M = _ADA_M rows (label-preserving replace-one of a record changes one prompt).
# Claim: the per-token event of ``adadpsyn_event`` (App. B, Theorem 3): 2⌈log2(√2/(2θ))⌉ GoodRadius queries
# (sensitivity 2, std 2σ0), T̂ + 1 = 2 means (sensitivity 2R, std 2Rσ1), T̂ = 1 coverage count (sensitivity 1,
# std σ2), at δ = 0.05, a point of the claimed curve whose telling events the quick run can observe. σ0 and
# σ2 are the paper's (Table 13). λ is large so that the round stops at lines 15–17 (R < r + m(R)): the token
# is the argmax of the first noisy mean, whose sum moves by the full 2R = √2 when one row goes from one
# vertex of the simplex to the other. The output reveals one of the charged means only, so the real
# mechanism's bound stays well below the claim; half the noise doubles that mean's shift in sds.
_ADA_SIGMAS, _ADA_M, _ADA_LAMBDA, _ADA_DELTA = (10.0, 1.0, 3.0), 6, 1e3, 0.05


def _adadpsyn_step() -> ev.DPEvent:
    """The per-token event inside ``adadpsyn_event``: what one ``release_token`` call costs on fixed prompts
    (the audit's pair is the M prompts after the draw, so without the sampling amplification)."""
    s0, s1, s2 = _ADA_SIGMAS
    run = me.adadpsyn_event(sigma0=s0, sigma1=s1, sigma2=s2, sampling_rate=1.0, steps=1, t_hat=1)
    assert isinstance(run, ev.SelfComposedEvent) and isinstance(run.event, ev.SampledWithoutReplacementEvent)
    return run.event.event


def _adadpsyn_pairs(broken: bool) -> list[Sampler]:
    s0, s1, s2 = (s / (2 if broken else 1) for s in _ADA_SIGMAS)
    # Row 0 is (1, 0) on D and (0, 1) on D′; the other M − 1 rows are equal and put token 0 behind by g in
    # the sum on D′ (by g − 2 on D). One pair, tuned for half the noise (the difference of the two noisy
    # sums has std 2σ1): there token 0 is 2.8 sds behind on D′, rare but observable.
    g = 2.0 * (_ADA_SIGMAS[1] / 2) * 2.8
    x = (1.0 - (g - 1.0) / (_ADA_M - 1)) / 2.0
    others = np.tile([x, 1.0 - x], (_ADA_M - 1, 1))
    rows = {False: np.vstack([[1.0, 0.0], others]), True: np.vstack([[0.0, 1.0], others])}

    def sampler(nb: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        return loop(
            lambda r: release_token(rows[nb], sigma0=s0, sigma1=s1, sigma2=s2, t_hat=1, lam=_ADA_LAMBDA, rng=r).index
        )(n, rng)

    return [sampler]


# -- individual Rényi filter (kNN votes): one record's whole transcript over _RELEASES releases ---------------
# Add/remove the target record (the filter's relation). In each report-noisy-max vote (k = 4 nearest) the
# other records vote (1, 3); with the target (label 0) among the 4 nearest the 4th neighbour drops out and
# the votes are (2, 2): ℓ2 sensitivity √2, charged as the retriever charges a record with one candidate
# (Gaussian, noise multiplier σ/√2, sensitivity √2) in the real in-memory RenyiFilter, σ from the retriever's
# ``noise_for_uses`` for _USES releases. The target votes only while the filter admits it. Claim: the
# budget's (ε, δ) for the whole transcript, however many releases (Feldman & Zrnic 2021, Thm. 4.5; kNN
# DP-ICL Thm. 1). The output is the transcript reduced to the number of releases won by label 0 (the
# releases are exchangeable given who votes) and then to one bit: did label 0 win at least m of them, m about
# 3 sds above its mean on D′ (a tail event: rare but observable). Broken: the caller ignores the filter's
# refusal (uses every candidate, not the admitted ones), so the target votes in every release.
_FILTER = IndividualBudget(epsilon=2.0, delta=1e-3, approximate_delta=0.0)  # votes need no approximate δ
_USES, _RELEASES = 2, 48


def _filter_release() -> tuple[float, ReleaseCost]:
    """The vote noise σ (calibrated for _USES releases) and what one release costs the target."""

    std = noise_for_uses(_FILTER, uses=_USES, sensitivity=SQRT2)
    return std, ReleaseCost.of(
        ev.GaussianEvent(std / SQRT2, sensitivity=SQRT2, neighbouring=ev.ADD_REMOVE), _FILTER.orders
    )


def _admissions(cost: ReleaseCost) -> list[bool]:
    """Which of the releases a fresh filter admits the target to (charging it each time it does)."""
    target, filt = np.array([0]), RenyiFilter(_FILTER)
    return [bool(filt.charge(target, cost)[0]) for _ in range(_RELEASES)]


def _filter_pairs(broken: bool) -> list[Sampler]:
    std, cost = _filter_release()
    votes = {True: np.array([2.0, 2.0]), False: np.array([1.0, 3.0])}  # by "the target votes"
    q = 0.5 * math.erfc(1.0 / std)  # P(label 0 wins) without the target: P(N(0, 2σ²) > 2)
    m = round(_RELEASES * q + 3.0 * math.sqrt(_RELEASES * q * (1.0 - q)))

    def sampler(nb: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        # On D′ the target is absent: never charged, never votes. On D its charges depend on the public
        # schedule only, never on the outputs, so one run of the filter gives every transcript's admissions.
        plays = [False] * _RELEASES if nb else [True] * _RELEASES if broken else _admissions(cost)
        wins = np.zeros(n, dtype=np.int64)
        for play in plays:
            counts = votes[play]
            wins += np.fromiter(
                (report_noisy_max(counts, noise_std=std, rng=rng) == 0 for _ in range(n)), dtype=np.int64, count=n
            )
        return (wins >= m).astype(np.int64)

    return [sampler]


_AR: dict[str, Any] = {"neighbouring": ev.ADD_REMOVE}
_RO: dict[str, Any] = {"neighbouring": ev.REPLACE_ONE}


# -- clip-blend synthesis in its default configuration: D against D ∪ {x} (add/remove) ---------------------
# ClipBlendSynthesizer(epsilon=1.0, max_tokens=20) on one label of 100 records, declared size 100: its plan
# gives s = 100 and τ, and the claim is one token's ε0 = c/(sτ) under add/remove. Two tokens; every record
# favours token 0 (clipped (c, c − 19.9)), the added one token 1 (clipped (c − 20, c)), the public prompt
# leaves token 1 at probability 0.2 on D. Broken: s and τ read from the records (s = 100 on D, 101 on D',
# τ recalibrated for each), the defect of issue 14: the divisor moves every row's weight.
_CB_ROWS, _CB_ADDED = np.array([0.0, -19.9]), np.array([-20.0, 0.0])


def _clip_blend_plan(n_records: int, observed: bool) -> dict[str, Any]:

    data = PrivateDataset(
        [PrivateRecord(f"record {i}", "y") for i in range(n_records)],
        public_label_counts="observed" if observed else {"y": 100},
    )
    return ClipBlendSynthesizer(epsilon=1.0, max_tokens=20).plan(data, neighbouring=ev.ADD_REMOVE).params


def _clip_blend_synthesis_event() -> ev.DPEvent:
    return ev.ExponentialMechanismEvent(_clip_blend_plan(100, observed=False)["token_epsilon"], **_AR)


def _clip_blend_synthesis_pairs(broken: bool) -> list[Sampler]:
    plans = {False: _clip_blend_plan(100, broken), True: _clip_blend_plan(101, broken)}  # by "on D'"
    rows = {False: np.tile(_CB_ROWS, (100, 1)), True: np.vstack([np.tile(_CB_ROWS, (100, 1)), _CB_ADDED])}
    tau = plans[False]["temperature"]
    public = np.array([-(19.9 - 2 * tau * math.log(4.0)), 0.0])  # token 1 at probability 0.2 on D

    def sampler(nb: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        p = plans[nb]
        return loop(
            lambda g: clip_blend_token(
                rows[nb], public, clip=10.0, subset_size=p["subset_size"], temperature=p["temperature"], rng=g
            )
        )(n, rng)

    return [sampler]


# -- a transcript that mixes components on one replace-one ledger ------------------------------------------
# One record x is replaced by x' (replace-one, the ledger's relation) and four components release one output
# each: a Tang token (x's prompt moves from one vertex to the other: sensitivity √2, charged replace-one), a
# DPS-MOZO token (projected; x's one-shot prompt changes), a clip-blend decoding token (x's prompt favours
# token 0, x''s token 1: ẑ moves by c/s, twice the add/remove ε0 = c/(sτ)) and a kNN vote (one vote moves;
# the filter's add/remove Gaussian). The claim: the ledger's total of the four charges, each converted to
# replace-one (clip-blend's exponential mechanism and the vote's Gaussian by group privacy). The broken
# accounting: the old ledger's total, every charge at face value whatever its relation (clip-blend at c/(sτ)).
_MIX_CLIP, _MIX_S, _MIX_TAU, _MIX_TANG, _MIX_VOTE, _MIX_BETA = 10.0, 10, 0.5, 6.0, 8.0, 0.01


def _mixed_events() -> tuple[ev.DPEvent, ev.DPEvent]:

    tang = ev.GaussianEvent(_MIX_TANG, math.sqrt(2), **_RO)
    mozo = ev.MozoTokenEvent(beta=_MIX_BETA, order=_ORDER)
    clip = ev.ExponentialMechanismEvent(_MIX_CLIP / (_MIX_S * _MIX_TAU), **_AR)  # as the decoder's paper claims it
    vote = ev.GaussianEvent(_MIX_VOTE / math.sqrt(2), math.sqrt(2), **_AR)
    shipped = ev.compose(tang, mozo, to_relation(clip, ev.REPLACE_ONE), to_relation(vote, ev.REPLACE_ONE))
    face_value = ev.compose(
        tang,
        mozo,
        ev.ExponentialMechanismEvent(clip.epsilon, **_RO),
        ev.GaussianEvent(vote.noise_multiplier, vote.sensitivity, **_RO),
    )
    return shipped, face_value


def _mixed_pairs(broken: bool) -> list[Sampler]:
    del broken  # the mechanism is the shipped one; the broken variant's claim differs
    tang = {False: np.array([[1.0, 0.0], [0.0, 1.0]]), True: np.array([[0.0, 1.0], [0.0, 1.0]])}
    zero = np.log(np.array([0.97, 0.01, 0.01, 0.01]))
    mozo = {False: np.vstack([np.log([0.01, 0.01, 0.01, 0.97]), np.tile(zero, (3, 1))]), True: np.tile(zero, (4, 1))}
    others = np.zeros((_MIX_S - 1, 2))
    clip = {False: np.vstack([[2 * _MIX_CLIP, 0.0], others]), True: np.vstack([[0.0, 2 * _MIX_CLIP], others])}
    push = 0.0
    for push in np.linspace(0, 2 * _MIX_CLIP, 401):  # token 0 rare (P ≈ 0.02) on D'
        z = blended_scores(clip[True], np.array([0.0, push]), clip=_MIX_CLIP, subset_size=_MIX_S)
        if z[1] - z[0] >= math.log(50.0) * _MIX_TAU:
            break
    public = np.array([0.0, push])
    votes = {False: np.array([1.0, 3.0]), True: np.array([0.0, 4.0])}

    def sampler(nb: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        out = mozo_distribution(mozo[nb], zero, beta=_MIX_BETA, order=_ORDER, top_k=4, variant="projected")
        probs = np.exp(out.logprobs - out.logprobs.max())
        m = out.support[rng.choice(len(probs), size=n, p=probs / probs.sum())]
        t = loop(lambda g: noisy_argmax(tang[nb], noise_multiplier=_MIX_TANG, rng=g))(n, rng)
        c = loop(
            lambda g: clip_blend_token(
                clip[nb], public, clip=_MIX_CLIP, subset_size=_MIX_S, temperature=_MIX_TAU, rng=g
            )
        )(n, rng)
        v = loop(lambda g: report_noisy_max(votes[nb], noise_std=_MIX_VOTE, rng=g))(n, rng)
        return t + 2 * c + 4 * v + 8 * m

    return [sampler]


CASES: tuple[AuditCase, ...] = (
    AuditCase(
        "report-noisy-max (kNN vote)", ev.GaussianEvent(_RNM_STD / math.sqrt(2), math.sqrt(2), **_AR), 1e-4, _rnm_pairs
    ),
    AuditCase(
        "Gaussian aggregation (Tang token)", ev.GaussianEvent(_TANG_SIGMA, math.sqrt(2), **_RO), 1e-4, _tang_pairs
    ),
    AuditCase(
        "PTA token (reshaped, clipped argmax)", ev.GaussianEvent(_TANG_SIGMA, math.sqrt(2), **_RO), 1e-4, _pta_pairs
    ),
    AuditCase("keyword PTR test", ev.GaussianEvent(_PTR_STD, **_AR), _PTR_DELTA + 1e-3, _ptr_pairs, claim_delta=1e-3),
    AuditCase(
        "keyword threshold (Gaussian counts)",
        ev.GaussianEvent(_KW_STD / threshold_sensitivity(1), threshold_sensitivity(1), **_AR),
        1e-4,
        _keyword_threshold_pairs,
        broken_as="noise on the said tokens only",
    ),
    AuditCase("clip-blend token", ev.ExponentialMechanismEvent(_CLIP / (_S * _TAU), **_AR), 1e-6, _clip_pairs),
    AuditCase(
        "DPS-MOZO token (projected)",
        ev.MozoTokenEvent(beta=_BETA, order=_ORDER),
        1e-3,
        _mozo_pairs,
        broken_as="mixing constraint off",
    ),
    AuditCase("AdaDPSyn token (projected means)", _adadpsyn_step(), _ADA_DELTA, _adadpsyn_pairs, sample_share=0.25),
    AuditCase(
        "individual Rényi filter (kNN transcript)",
        _FILTER.as_event(),
        _FILTER.delta,
        _filter_pairs,
        broken_as="refusal ignored (votes past its cap)",
        sample_share=0.12,
    ),
    AuditCase(
        "clip-blend synthesis, default config (D vs D ∪ {x})",
        _clip_blend_synthesis_event(),
        1e-6,
        _clip_blend_synthesis_pairs,
        broken_as="s and τ read from the data",
    ),
    AuditCase(
        "mixed transcript on one ledger (Tang, MOZO, clip-blend, kNN vote)",
        _mixed_events()[0],
        1e-3,
        _mixed_pairs,
        broken_as="charges composed at face value, relations ignored",
        broken_event=_mixed_events()[1],
        sample_share=0.5,
    ),
    AuditCase(
        "kNN expert decoding token (an expert replaced by the next)",
        expert_case.expert_event(),
        expert_case.DELTA,
        expert_case.replacement_pairs,
        broken_as="expert temperature halved",
    ),
    AuditCase(
        "kNN expert decoding token (fewer than k experts, one removed)",
        expert_case.expert_event(),
        expert_case.DELTA,
        expert_case.removal_pairs,
        broken_as="divisor read from the data (experts present)",
    ),
    AuditCase(
        "kNN keyword hints release (records vote, one record removed)",
        keyword_case.keyword_hint_event(),
        keyword_case.DELTA,
        keyword_case.keyword_hint_pairs,
        broken_as="a record votes every word it holds (cap m dropped)",
    ),
    AuditCase(
        "sparse-vector test, one run (AboveThreshold, queries moving in opposite directions)",
        ev.PureDPEvent(1.0 / _SVT_SCALE, neighbouring=ev.ADD_REMOVE),
        1e-6,
        _sparse_vector_pairs,
        broken_as="noise halved",
    ),
    AuditCase(
        f"sparse expert decoding answer ({expert_case.SPARSE_STEPS} tokens, one paid, an expert replaced)",
        expert_case.sparse_event(),
        expert_case.DELTA,
        expert_case.sparse_pairs,
        broken_as="sparse-vector test without noise",
    ),
    AuditCase(
        f"kNN expert decoding paid per token ({expert_case.PER_TOKEN_STEPS} tokens, the removed expert refused "
        "after the first)",
        expert_case.per_token_event(),
        expert_case.DELTA,
        expert_case.per_token_pairs,
        broken_as="no move-up (a refused expert's slot left empty)",
        sample_share=8.0,
    ),
    AuditCase(
        f"Tang synthesis token per unit (D vs D minus a unit of {unit_case.CANARY_RECORDS} records)",
        unit_case.tang_synthesis_event(),
        unit_case.DELTA,
        unit_case.tang_synthesis_pairs,
        broken_as="records sampled as if independent",
    ),
    AuditCase(
        f"clip-blend decoder token per unit (D vs D minus a unit of {unit_case.CANARY_RECORDS} records)",
        unit_case.clip_blend_decoder_event(),
        unit_case.DELTA,
        unit_case.clip_blend_decoder_pairs,
        broken_as="records sampled as if independent",
    ),
    AuditCase(
        f"Tang synthesis per unit across {unit_case.LABELS} labels (k = 3 of a unit's records per prompt)",
        unit_case.tang_across_labels_event(),
        unit_case.DELTA,
        unit_case.tang_across_labels_pairs,
        broken_as="one label's run charged (labels taken to partition units)",
        broken_event=unit_case.tang_across_labels_event(1),
        sample_share=0.25,
    ),
    AuditCase(
        "DPS-MOZO decoding, bfloat16 SmolLM2 (one record short vs long)",
        ev.MozoTokenEvent(beta=decoder_case.BETA, order=decoder_case.ORDER),
        decoder_case.DELTA,
        decoder_case.decoder_pairs,
        broken_as="zero-shot row in the shared batch",
        requires=decoder_case.missing_requirements,
        broken_shows=decoder_case.defect_not_shown,
    ),
)
"""The mechanisms audited; their claims are the per-call events the library charges."""
