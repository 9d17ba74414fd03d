"""What each method would do with a budget, computed before anything is charged (``dp-icl plan``).

Nothing here reads private data or charges a ledger: every figure is a function of public settings (the
dataset size the caller states, ε, δ, how many answers of how many tokens, the methods' settings).

How much the records can move one token (the *token shift*) is computed in
:mod:`dp_icl_plugin.mechanisms.token_shift`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.allowance import allowance_budget
from dp_icl_plugin.accounting.calibration import calibrate_clip_blend_temperature, calibrate_mozo
from dp_icl_plugin.accounting.individual_filter import FILTER_ORDERS
from dp_icl_plugin.accounting.neighbouring import REPLACE_ONE, check_relation
from dp_icl_plugin.decoding.knn_experts import filter_budget_for
from dp_icl_plugin.decoding.pay_as_you_go import ALLOWANCE_DELTA_SHARE, calibrate_per_token, mozo_filter_order
from dp_icl_plugin.errors import CalibrationError, ConfigurationError
from dp_icl_plugin.mechanisms.keyword_threshold import keyword_threshold, record_vote_sensitivity, threshold_sensitivity
from dp_icl_plugin.mechanisms.token_shift import (
    MIN_KEYWORD_PASS,
    WEAK_SHIFT,
    agreeing_to_tip,
    best_token_probability,
    keyword_pass_probability,
    log_odds_shift,
    mozo_shift,
    verdict,
)
from dp_icl_plugin.retrieval.embedding import default_embedder, embed_texts
from dp_icl_plugin.retrieval.retriever import EXPERT_CLIP, KNNConfig, noise_for_uses, token_epsilon_for_uses

__all__ = ["MethodOutlook", "Plan", "estimate_min_similarity", "plan"]


@dataclass(frozen=True)
class MethodOutlook:
    """One method's figures for a plan (all public).

    Attributes:
        method: the method's name.
        pays: ``"per answer"``, ``"per token"`` or ``"once"``.
        settings: what it would run with (calibrated noise, temperature, β, ...).
        token_shift: the most probability the records can add to one token (None where it does not apply).
        verdict: ``"useful"``, ``"weak"``, ``"useless"`` (or ``"refused"`` where the component would refuse).
        note: one sentence on what decides it.
    """

    method: str
    pays: str
    settings: dict[str, Any]
    token_shift: float | None
    verdict: str
    note: str


@dataclass(frozen=True)
class Plan:
    """Every method's outlook and the recommendation (see :func:`plan`).

    Attributes:
        inputs: the settings the plan was made for.
        methods: each method's outlook.
        recommendation: which method to use, and why.
        carrying: what the dataset can carry at this budget (agreeing records a token needs; see the module).
    """

    inputs: dict[str, Any]
    methods: list[MethodOutlook] = field(default_factory=list)
    recommendation: str = ""
    carrying: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the inputs, each method's figures by name, the recommendation."""
        return {
            "inputs": self.inputs,
            "methods": {
                m.method: {
                    "pays": m.pays,
                    **m.settings,
                    "token_shift": m.token_shift,
                    "verdict": m.verdict,
                    "note": m.note,
                }
                for m in self.methods
            },
            "recommendation": self.recommendation,
            "carrying": self.carrying,
        }


def plan(
    *,
    records: int,
    epsilon: float,
    delta: float,
    answers: int,
    tokens: int,
    relation: str = REPLACE_ONE,
    k: int = 40,
    candidates: int | None = None,
    shards: int = 10,
    keywords_per_answer: int = 4,
    n_shots: int = 4,
    mozo_order: float = 8.0,
    subset_size: int | None = None,
    clip: float = 10.0,
    vocab_size: int = 49152,
    choices: int | None = None,
    agreeing: int = 10,
    paid_tokens: int = 2,
    expected_tokens: int | None = None,
    demonstrations: int = 4,
) -> Plan:
    """What each method would do with (ε, δ) for ``answers`` answers of ``tokens`` tokens over ``records``
    records, and which to use. Never charges anything.

    Args:
        records: the number of private records (as the caller knows it; the plan reads no data).
        epsilon: the ε of the ledger's budget for this use.
        delta: the δ of that budget.
        answers: how many answers the app needs.
        tokens: the longest answer in tokens (with public answer choices, their
            :attr:`~dp_icl_plugin.decoding.choices.AnswerChoices.decisions`; with a JSON schema,
            :meth:`~dp_icl_plugin.decoding.structured.JSONSchemaAnswers.decisions`: the tokens a mechanism decides).
        relation: the ledger's neighbouring relation (kNN's filter budget is what covers (ε, δ) on it).
        k: kNN experts per answer (expert decoding) and records per vote.
        candidates: records expected to pass ``min_similarity`` per query (default ``k``): they pay each answer.
        shards: the kNN keyword answer's shards.
        keywords_per_answer: the keywords each of its shards' answers (keyword hints: each record) contributes.
        n_shots: DPS-MOZO's records per token.
        mozo_order: DPS-MOZO's Rényi order α.
        subset_size: clip-blend's fixed subset (default min(records, k)).
        clip: clip-blend's clipping bound.
        vocab_size: the model's vocabulary (SmolLM2: 49152), for the keyword threshold and for clip-blend's
            support (it draws from the whole vocabulary).
        choices: the number of public answer choices when answers are restricted to them (clip-blend then draws
            among those), or None for free text.
        agreeing: how many records you expect to share a fact (a fix, a label's cue): the plan gives the ε at
            which that many would tip a token through expert decoding.
        paid_tokens: sparse expert decoding's paid tokens per answer (the rest are the public greedy answer).
        expected_tokens: the tokens an answer is expected to run (public; default ``tokens``): DPS-MOZO and
            clip-blend paid per token (``pay_per_token=True``) calibrate for ``answers`` answers of this many, on an
            allowance of ε at a tenth of δ (:mod:`~dp_icl_plugin.decoding.pay_as_you_go`).
        demonstrations: the public inputs a pay-once synthesis for free text answers, each in ``tokens`` tokens
            (:class:`~dp_icl_plugin.synthesis.tang_answers.TangAnswerSynthesizer` at its default M and N).

    Raises:
        ConfigurationError: a setting out of range.
    """
    n = check.positive_int("records", records)
    eps, dlt = check.positive_finite("epsilon", epsilon), check.probability_open("delta", delta)
    a, t = check.positive_int("answers", answers), check.positive_int("tokens", tokens)
    rel = check_relation(relation)
    k = check.positive_int("k", k)
    c = k if candidates is None else check.positive_int("candidates", candidates)
    s = min(n, k) if subset_size is None else check.positive_int("subset_size", subset_size)
    j = check.positive_int("agreeing", agreeing)
    paid = check.positive_int("paid_tokens", paid_tokens)
    demos = check.positive_int("demonstrations", demonstrations)
    # what clip-blend draws from: the vocabulary, or the public choices
    support = check.positive_int(
        "vocab_size" if choices is None else "choices", vocab_size if choices is None else choices
    )
    e = t if expected_tokens is None else check.positive_int("expected_tokens", expected_tokens)
    if e > t:
        raise ConfigurationError(f"expected_tokens ({e}) cannot exceed tokens ({t}), the longest answer")
    if n_shots > n or s > n:
        raise ConfigurationError(f"n_shots ({n_shots}) and subset_size ({s}) cannot exceed the {n} records")
    inputs = {
        "records": n,
        "epsilon": eps,
        "delta": dlt,
        "answers": a,
        "tokens": t,
        "relation": rel,
        "k": k,
        "candidates_per_answer": c,
        "agreeing": j,
        "paid_tokens": paid,
        "expected_tokens": e,
        "demonstrations": demos,
    }
    out = [
        _outlook("dps-mozo decoding", lambda: _mozo(eps, dlt, n, a, t, n_shots, mozo_order, rel)),
        _outlook("clip-blend decoding", lambda: _clip_blend(eps, dlt, a, t, s, clip, rel, support)),
        _outlook("knn expert decoding", lambda: _experts(eps, dlt, n, a, t, k, c, rel, j)),
        _outlook("knn sparse expert decoding", lambda: _sparse_experts(eps, dlt, n, a, t, k, c, rel, paid)),
        _outlook(
            "knn keyword answer", lambda: _keywords(eps, dlt, n, a, c, shards, keywords_per_answer, vocab_size, rel)
        ),
        _outlook(
            "knn keyword hints", lambda: _keyword_hints(eps, dlt, n, a, c, keywords_per_answer, vocab_size, rel, j)
        ),
        _outlook(
            "dps-mozo decoding, paid per token", lambda: _mozo_per_token(eps, dlt, n, a, e, n_shots, mozo_order, rel)
        ),
        _outlook(
            "clip-blend decoding, paid per token",
            lambda: _clip_blend_per_token(eps, dlt, a, e, s, clip, rel, support),
        ),
        _outlook(PAY_ONCE_ANSWERS, lambda: _tang_answers(eps, dlt, n, t, demos, rel)),
    ]
    if choices is not None:
        inputs["choices"] = support
    return Plan(inputs, out, _recommend(out, a, t), _carrying(out, n, j))


def _outlook(name: str, compute: Callable[[], MethodOutlook]) -> MethodOutlook:
    """A method's outlook, or "refused" with the reason when no setting of it meets the budget."""
    try:
        return compute()
    except (CalibrationError, ConfigurationError) as exc:
        return MethodOutlook(name, "per answer", {}, 0.0, "refused", f"no setting meets the budget: {exc}")


def _mozo(eps, dlt, n, a, t, n_shots, order, rel) -> MethodOutlook:
    name = "dps-mozo decoding"
    if rel != REPLACE_ONE:
        return MethodOutlook(name, "per answer", {}, None, "refused", "DPS-MOZO needs a replace-one ledger")
    beta = calibrate_mozo(epsilon=eps, delta=dlt, sampling_rate=n_shots / n, steps=a * t, order=order).value
    shift = mozo_shift(beta, order)
    return MethodOutlook(
        name,
        "per answer",
        {"beta": beta, "n_shots": n_shots, "records_per_token": n_shots},
        shift,
        verdict(shift),
        f"the records add at most {shift:.3g} to a token's probability around the zero-shot row "
        f"sharpened {n_shots}-fold (near-greedy zero-shot)",
    )


def _allowance(eps: float, dlt: float, rel: str, orders: tuple[float, ...] = FILTER_ORDERS):
    """The filter of a per-token allowance of ε at the decoders' default δ share (public arithmetic)."""
    cover = ev.ApproxDPEvent(eps, dlt * ALLOWANCE_DELTA_SHARE, neighbouring=rel)
    return allowance_budget(cover, rel, orders)


def _mozo_per_token(eps, dlt, n, a, e, n_shots, order, rel) -> MethodOutlook:
    name = "dps-mozo decoding, paid per token"
    if rel != REPLACE_ONE:
        return MethodOutlook(name, "per token", {}, None, "refused", "DPS-MOZO needs a replace-one ledger")
    q = n_shots / n
    beta = calibrate_per_token(
        lambda b: me.mozo_event(beta=b, order=order, sampling_rate=q, steps=1),
        steps=a * e,
        filter_budget=_allowance(eps, dlt, rel, (mozo_filter_order(order),)),
        neighbouring=rel,
        lo=1e-9,
        hi=100.0,
        find="largest",
    )
    shift = mozo_shift(beta, order)
    return MethodOutlook(
        name,
        "per token",
        {"beta": beta, "n_shots": n_shots, "tokens_paid": a * e},
        shift,
        verdict(shift),
        f"an allowance paying {a * e} token mechanisms ({a} answers of {e} tokens on average; each answer pays the "
        f"tokens it ran): the records add at most {shift:.3g} to a token's probability",
    )


def _clip_blend_per_token(eps, dlt, a, e, s, clip, rel, support) -> MethodOutlook:
    inv_tau = calibrate_per_token(
        lambda x: me.clip_blend_event(clip=clip, subset_size=s, temperature=1.0 / x, steps=1, neighbouring=rel),
        steps=a * e,
        filter_budget=_allowance(eps, dlt, rel),
        neighbouring=rel,
        lo=1e-9,
        hi=1e3 * s / clip,
        find="largest",
    )
    nats = clip * inv_tau
    shift = log_odds_shift(nats)
    best, salad = _clip_blend_fluency(nats, support)
    return MethodOutlook(
        "clip-blend decoding, paid per token",
        "per token",
        {
            "temperature": 1.0 / inv_tau,
            "clip": clip,
            "subset_size": s,
            "log_odds_range": nats,
            "best_token_probability": best,
            "tokens_paid": a * e,
        },
        shift,
        "useless" if salad else verdict(shift),
        salad + f"an allowance paying {a * e} token mechanisms ({a} answers of {e} tokens on average): the {s} records "
        f"of one fixed subset add at most {nats:.3g} nats to a token's log-odds",
    )


def _clip_blend_fluency(nats: float, support: int) -> tuple[float, str]:
    """Clip-blend's answers as text: its blended scores (the public row's and the records', each clipped to
    [−c, c] and halved) span at most 2c, so at τ = c/``nats`` no token's log-odds over another exceed 2·nats and
    the likeliest of ``support`` tokens gets at most :func:`best_token_probability`. Below one half the answer is
    close to random draws from the support (word salad): the returned sentence says so (empty otherwise)."""
    best = best_token_probability(2.0 * nats, support)
    if best >= 0.5:
        return best, ""
    return best, (
        f"its answers are near-random: the temperature the budget needs leaves every token within "
        f"{2.0 * nats:.3g} nats of every other, so the likeliest of the {support:,} tokens it draws from gets at most "
        f"{best:.2g} of the probability (word salad for free text; with public answer choices it draws among "
        "those); "
    )


def _clip_blend(eps, dlt, a, t, s, clip, rel, support) -> MethodOutlook:
    tau = calibrate_clip_blend_temperature(
        epsilon=eps, delta=dlt, clip=clip, subset_size=s, steps=a * t, neighbouring=rel
    ).value
    nats = clip / tau
    shift = log_odds_shift(nats)
    best, salad = _clip_blend_fluency(nats, support)
    return MethodOutlook(
        "clip-blend decoding",
        "per answer",
        {
            "temperature": tau,
            "clip": clip,
            "subset_size": s,
            "log_odds_range": nats,
            "records_to_tip_a_token": agreeing_to_tip(nats / s),
            "records_read_per_answer": s,
            "best_token_probability": best,
        },
        shift,
        "useless" if salad else verdict(shift),
        salad + f"the {s} records of one fixed subset add at most {nats:.3g} nats to a token's log-odds, "
        f"every answer from the same subset",
    )


def _experts(eps, dlt, n, a, t, k, c, rel, agreeing) -> MethodOutlook:
    budget = filter_budget_for(eps, dlt, rel)
    uses = max(1, math.ceil(a * c / n))
    eps0 = token_epsilon_for_uses(budget, uses=uses, tokens=t)
    nats = eps0 * min(k, n) / 2.0  # k experts, or every record where there are fewer
    shift = log_odds_shift(nats)
    settings = {
        "per_record_epsilon": budget.epsilon,
        "per_record_delta": budget.delta,
        "uses": uses,
        "token_epsilon": eps0,
        "log_odds_range": nats,
        "clip": EXPERT_CLIP,
        "expert_temperature": EXPERT_CLIP / nats,
        "records_paying_per_answer": c,
        "answers_before_records_run_out": n * uses // c,
        # one topic asked again and again: its k nearest records serve `uses` answers each, then drop out and the
        # next k nearest take over; once fewer than k records above min_similarity have budget, the experts thin
        # out and the answers drift to the zero-shot answer (no error: how many records remain is private)
        "same_question_answers_per_k_records": uses,
        # one expert adds at most ε0/2 nats (ε0 is calibrated per record, whatever k): j agreeing experts j·ε0/2
        "records_to_tip_a_token": agreeing_to_tip(eps0 / 2.0),
        "records_read_per_answer": min(k, n),
        "epsilon_for_agreeing_records": _experts_epsilon_for(agreeing, dlt, rel, uses, t),
    }
    return MethodOutlook(
        "knn expert decoding",
        "per answer (each record its own budget)",
        settings,
        shift,
        verdict(shift),
        f"{k} nearest records steer each token by up to {nats:.3g} nats; a record pays only for the "
        f"answers it is a candidate of ({uses} of them): one question asked again gets {uses} answers from its "
        f"{k} nearest records, then {uses} from the next {k}, and so on; when the records near it are used up its "
        "answers become the zero-shot answer, silently (that count is private)",
    )


def _sparse_experts(eps, dlt, n, a, t, k, c, rel, paid) -> MethodOutlook:
    budget = filter_budget_for(eps, dlt, rel)
    uses = max(1, math.ceil(a * c / n))
    config = KNNConfig(k=k, shards=1, expert_paid_tokens=paid)
    p = config.paid_tokens(t)
    ratio, threshold = config.expert_test_ratio, config.expert_test_threshold
    assert threshold is not None
    eps0 = token_epsilon_for_uses(budget, uses=uses, tokens=p, test_ratio=ratio)
    read = min(k, c, n)  # the experts an answer reads: k, or fewer candidates, or every record
    nats = eps0 * min(k, n) / 2.0
    shift = log_odds_shift(nats)
    # j experts that move from the public greedy token to another raise the margin by up to j·ε0/2 (from a tie)
    to_pass = math.ceil(2.0 * threshold / eps0)
    tip = agreeing_to_tip(eps0 / 2.0)
    never = (
        f"the test passes only by its noise: it needs about {to_pass} records agreeing against the public answer, "
        f"more than the {read} an answer reads, so the answers are the public greedy answer but for noise (the "
        "records do not steer them); "
        if to_pass > read
        else ""
    )
    return MethodOutlook(
        "knn sparse expert decoding",
        "per answer (each record its own budget)",
        {
            "per_record_epsilon": budget.epsilon,
            "uses": uses,
            "paid_tokens": p,
            "token_epsilon": eps0,
            "test_epsilon": ratio * eps0,
            "test_threshold": threshold,
            "log_odds_range": nats,
            "records_to_pass_the_test": to_pass,
            "records_to_tip_a_token": None if tip is None else max(tip, to_pass),
            "records_read_per_answer": read,
        },
        shift,
        "useless" if never else verdict(shift),
        never + f"at most {p} tokens of an answer come from the {k} nearest records, each steered by up to {nats:.3g} "
        f"nats; the others are the public greedy answer, free. A token is paid where about {to_pass} records "
        f"agree against the public answer (the sparse-vector test's threshold, {threshold:g} nats)",
    )


def _experts_epsilon_for(agreeing: int, dlt: float, rel: str, uses: int, tokens: int) -> float | None:
    """The least ε (rounded up to 3 significant figures) at which ``agreeing`` expert records tip a token for
    the same answers, or None above ε = 1000 (where no DP claim means anything)."""

    def tips(eps: float) -> bool:
        try:
            eps0 = token_epsilon_for_uses(filter_budget_for(eps, dlt, rel), uses=uses, tokens=tokens)
        except ConfigurationError:
            return False
        return (agreeing_to_tip(eps0 / 2.0) or math.inf) <= agreeing

    low, high = 1e-3, 1e3
    if not tips(high):
        return None
    if tips(low):
        return low
    for _ in range(60):  # ε0 grows with ε: bisection in log space
        mid = math.sqrt(low * high)
        low, high = (low, mid) if tips(mid) else (mid, high)
    scale = 10.0 ** (math.floor(math.log10(high)) - 2)
    return float(f"{math.ceil(high / scale - 1e-9) * scale:.3g}")  # up: at or above the least ε that tips


def _carrying(methods: list[MethodOutlook], records: int, agreeing: int) -> str:
    """One sentence: how many agreeing records a token needs, by the per-answer method that needs fewest,
    against the records an answer reads and the dataset's size; and the ε for ``agreeing`` records."""
    counted = [
        (m.settings["records_to_tip_a_token"], m)
        for m in methods
        if m.verdict != "refused"
        and m.settings.get("records_to_tip_a_token") is not None
        and m.settings.get("best_token_probability", 1.0) >= 0.5  # not where every answer is word salad
    ]
    if not counted:
        return "no per-answer method can run at this budget (see each method's note)"
    need, best = min(counted, key=lambda pair: pair[0])
    read = min(best.settings["records_read_per_answer"], records)  # k experts of fewer records: all of them
    gain = f"{WEAK_SHIFT:g} more probability"
    if need > read:
        small = " (the dataset itself is too small for that)" if need > records else ""
        where = (
            f"a token needs {need} records agreeing on it ({best.method}) to gain {gain}; an answer reads {read} "
            f"of the {records} records{small}: no fact the records share can reach an answer at this budget"
        )
    else:
        where = (
            f"a token gains {gain} when {need} of the {read} records an answer reads agree on it ({best.method}); "
            "a fact fewer records share stays out of the answers"
        )
    experts = next((m for m in methods if m.method == "knn expert decoding" and m.verdict != "refused"), None)
    hints = next((m for m in methods if m.method == "knn keyword hints" and m.verdict != "refused"), None)
    if hints is not None:
        where += (
            f"; a keyword reaches an answer's prompt (knn keyword hints) when about "
            f"{hints.settings['records_to_pass_a_keyword']} of its candidate records share it"
        )
    if experts is None or need <= agreeing:
        return where
    eps_for = experts.settings["epsilon_for_agreeing_records"]
    if eps_for is None:
        return f"{where}; {agreeing} agreeing records would not tip a token at any ε up to 1000 for these answers"
    return f"{where}; {agreeing} agreeing records would tip one through expert decoding at ε ≥ {eps_for:g}"


def _keywords(eps, dlt, n, a, c, shards, m, vocab, rel) -> MethodOutlook:
    budget = filter_budget_for(eps, dlt, rel)
    uses = max(1, math.ceil(a * c / n))
    sigma = noise_for_uses(budget, uses=uses, sensitivity=threshold_sensitivity(m))
    threshold = keyword_threshold(sigma, vocab)
    passes = keyword_pass_probability(threshold, shards, sigma)
    ok = passes >= MIN_KEYWORD_PASS
    return MethodOutlook(
        "knn keyword answer",
        "per answer (each record its own budget)",
        {
            "uses": uses,
            "noise_std": sigma,
            "threshold": threshold,
            "shards": shards,
            "unanimous_keyword_passes": passes,
        },
        None,
        "useful" if passes >= 0.5 else "weak" if ok else "refused",
        f"threshold {threshold:.3g} against at most {shards} shard votes: a keyword every shard "
        f"says passes with probability {passes:.3g}",
    )


def _keyword_hints(eps, dlt, n, a, c, m, vocab, rel, agreeing) -> MethodOutlook:
    budget = filter_budget_for(eps, dlt, rel)
    uses = max(1, math.ceil(a * c / n))
    sigma = noise_for_uses(budget, uses=uses, sensitivity=record_vote_sensitivity(m))
    threshold = keyword_threshold(sigma, vocab)
    passes = keyword_pass_probability(threshold, agreeing, sigma)
    need = math.ceil(threshold)
    small = f"; the dataset's {n} records are fewer" if need > n else ""
    return MethodOutlook(
        "knn keyword hints",
        "per answer (each record its own budget)",
        {
            "uses": uses,
            "noise_std": sigma,
            "threshold": threshold,
            "records_to_pass_a_keyword": need,
            "agreeing_keyword_passes": passes,
        },
        None,
        "useful" if passes >= 0.5 else "weak" if passes >= MIN_KEYWORD_PASS else "useless",
        f"a keyword passes half the time when {need} of an answer's candidate records share it{small}; a "
        f"keyword {agreeing} of them share passes with probability {passes:.3g}",
    )


PAY_ONCE_ANSWERS = "tang synthesis for public inputs (pay once)"
#: a one-sided 95 % normal quantile: a token's lead (in prompts) that beats one rival 95 % of the time is
#: z·2σ (the difference of two coordinates' noise, each N(0, 2σ²), has std 2σ)
_WIN_95 = 1.6448536269514722


def _tang_answers(eps, dlt, n, t, demos, rel) -> MethodOutlook:
    from dp_icl_plugin.synthesis.tang import tang_noise
    from dp_icl_plugin.synthesis.tang_answers import TangAnswerConfig

    m, per_prompt = TangAnswerConfig.n_prompts, TangAnswerConfig.records_per_prompt
    if m * per_prompt > n:
        raise ConfigurationError(f"M·N = {m * per_prompt} records a token exceed the {n} records")
    steps = demos * t
    sigma, _ = tang_noise(
        epsilon=eps, noise_multiplier=None, delta=dlt, sampling_rate=m * per_prompt / n, steps=steps, neighbouring=rel
    )
    lead = 2 * _WIN_95 * sigma
    half = float(0.5 * math.erfc(-(m / 2) / (2 * sigma) / math.sqrt(2)))  # Φ((M/2)/(2σ))
    return MethodOutlook(
        PAY_ONCE_ANSWERS,
        "once",
        {
            "noise_multiplier": sigma,
            "n_prompts": m,
            "records_per_prompt": per_prompt,
            "tokens_charged": steps,
            "prompts_ahead_to_win": lead,
            "half_agreeing_wins": half,
        },
        None,
        "useful" if lead <= m / 2 else "weak" if lead <= m else "useless",
        f"{demos} free-text demonstrations of {t} tokens, paid once (any number of answers then use them): "
        + (
            f"a token wins against one rival 95 % of the time when {lead:.2g} of the {m} prompts a token reads "
            "favour it more"
            if lead <= m
            else f"no token wins reliably: beating one rival 95 % of the time takes a lead of {lead:.3g} prompts, "
            f"more than the {m} a token reads"
        )
        + f" (σ = {sigma:.3g}); a token half of them favour wins with probability {half:.3g}",
    )


def _recommend(methods: list[MethodOutlook], answers: int, tokens: int) -> str:
    rated = [m for m in methods if m.token_shift is not None and m.verdict != "refused"]
    rank = {"useless": 0, "weak": 1, "useful": 2}  # a useless method never outranks a weak one, whatever its shift
    best = max(rated, key=lambda m: (rank[m.verdict], m.token_shift or 0.0), default=None)
    once = next((m for m in methods if m.method == PAY_ONCE_ANSWERS and m.verdict == "useful"), None)
    synthesize = (
        f"synthesize demonstrations once and reuse them (the cost does not grow with the answers; free text: "
        f"{once.method}, {once.note})"
        if once is not None
        else "synthesize demonstrations once and reuse them (the cost does not grow with the answers)"
    )
    if best is None or best.verdict == "useless":
        return (
            f"no per-answer method can change an answer at this budget ({answers} answers of {tokens} tokens): "
            f"{synthesize}, or raise epsilon / lower the answers or tokens"
        )
    extra = f" (weak: expect small gains; {synthesize} may do better)" if best.verdict == "weak" else ""
    return f"{best.method}: {best.note}{extra}"


def estimate_min_similarity(
    public: Sequence[str] | np.ndarray, *, k: int, records: int, embedder: object | None = None
) -> float:
    """A ``min_similarity`` at which about ``k`` of ``records`` private records pass for a typical query,
    estimated from **public** texts alone (queries like the app's, or any public sample of the records'
    distribution); the private records are never read.

    Each public text stands for a query, the others for a sample of the records: a query with m − 1 others
    sees about k·(m − 1)/records of them at the similarity that k records would reach; the estimate is the
    median over the queries of that rank's similarity. Every record at least this similar pays for an answer
    (:class:`~dp_icl_plugin.retrieval.KNNConfig`), so this sets how many pay. The public texts must resemble
    the records as the queries will: on E2E, whose test inputs name other restaurants than the records, the
    estimate was 0.99 where no record passes (the records' own 16th-nearest similarity to a query is 0.79).

    Args:
        public: public texts (embedded with ``embedder``, default all-MiniLM-L6-v2) or their unit vectors.
        k: experts per answer.
        records: the number of private records (as the caller states it).
        embedder: the embedder of the texts (default all-MiniLM-L6-v2).

    Raises:
        ConfigurationError: fewer than two public texts, or bad k / records.
    """
    k, n = check.positive_int("k", k), check.positive_int("records", records)
    if isinstance(public, np.ndarray):
        vectors = np.asarray(public, dtype=np.float64)
    else:
        vectors = embed_texts(embedder if embedder is not None else default_embedder(), list(public))
    m = len(vectors)
    if m < 2 or vectors.ndim != 2:
        raise ConfigurationError("estimate_min_similarity needs at least two public texts (or a 2-d array)")
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    rank = min(m - 1, max(1, math.ceil(k * (m - 1) / n)))
    kth = -np.sort(-sims, axis=1)[:, rank - 1]
    return float(np.clip(np.median(kth), -1.0, 1.0))
