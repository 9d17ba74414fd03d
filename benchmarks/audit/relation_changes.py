"""What one replace-one ledger changes, method by method: relation, sensitivity and ε, before and after.

"Before" is the analysis the library charged until the one-ledger change (issue 14): add/remove for Tang/PTA
and clip-blend, with the sampling rate, clip-blend's divisor s and temperature read from the observed record
counts, one label run for AdaDPSyn, and the kNN filter's add/remove cover charge composed as is. "After" is what
a replace-one ledger (the default) charges now for the same mechanism, and what the shipped calibration picks
for the same target.

    python benchmarks/audit/relation_changes.py          # about 10 s on 2 cores
"""

from __future__ import annotations

import math

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.calibration import (
    calibrate_adadpsyn,
    calibrate_clip_blend_temperature,
    calibrate_mozo,
    calibrate_subsampled_gaussian,
)
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, REPLACE_ONE

DELTA = 1 / 1600
KNN_COVER = ev.ApproxDPEvent(2.0, 1e-6, neighbouring=ADD_REMOVE)


def eps(event: ev.DPEvent, delta: float) -> float:
    return tightest().epsilon(event, delta=delta)


def tang() -> list[str]:
    """PTA's GINC settings (Table 4): M = 5 prompts × N = 4 records of n_y = 1,600 per token, 36 steps."""
    q, steps, delta = 20 / 1600, 36, DELTA
    rows = []
    for target in (1.0, 2.0, 4.0, 8.0):
        paper = calibrate_subsampled_gaussian(
            epsilon=target, delta=delta, sampling_rate=q, steps=steps, accountant="prv", neighbouring=ADD_REMOVE
        ).value
        shipped = calibrate_subsampled_gaussian(epsilon=target, delta=delta, sampling_rate=q, steps=steps).value
        under_ro = eps(me.tang_event(noise_multiplier=paper, sampling_rate=q, steps=steps), delta)
        rows.append(
            f"| Tang / PTA, target ε = {target:g} | add/remove → replace-one | √2 (one p_i) | "
            f"σ = {paper:.2f} | {under_ro:.3f} | σ = {shipped:.2f} |"
        )
    # q read from the data: |D_y| = M·N gave q = 1, and a new record displaced another from the prompts
    sigma = calibrate_subsampled_gaussian(
        epsilon=4.0, delta=delta, sampling_rate=1.0, steps=steps, accountant="prv", neighbouring=ADD_REMOVE, hi=30.0
    ).value
    # the same noise (std σ√2) against an ℓ2 shift of 2: multiplier σ√2/2
    noise = ev.GaussianEvent(sigma / math.sqrt(2.0), sensitivity=2.0, neighbouring=ADD_REMOVE)
    shift_two = ev.SelfComposedEvent(noise, steps)
    rows.append(
        f"| Tang / PTA, q from the observed count M·N = 20 (q = 1), 36 steps, target ε = 4 | q observed → "
        f"q = M·N/n_y declared | √2 charged, 2 real (two rows change) | σ = {sigma:.2f} | "
        f"{eps(shift_two, delta):.3f} | rate from the declared size |"
    )
    return rows


def _clip_blend_temperatures() -> tuple[float, float]:
    """τ for ε = 1 over T = 20 tokens, c = 10, s = 100, δ = 1/100: add/remove (before) and replace-one (now)."""
    common = {"epsilon": 1.0, "delta": 1e-2, "clip": 10.0, "subset_size": 100, "steps": 20}
    before = calibrate_clip_blend_temperature(**common, neighbouring=ADD_REMOVE).value
    return before, calibrate_clip_blend_temperature(**common).value


def clip_blend() -> list[str]:
    """The issue's case: ε = 1, T = 20, c = 10, 100 records of one label (δ = 1/100)."""
    delta, steps, c = 1e-2, 20, 10.0
    before, after = _clip_blend_temperatures()
    leak = eps(me.clip_blend_event(clip=c, subset_size=100, temperature=before, steps=steps), delta)
    eps0_before = me.clip_blend_token_epsilon(clip=c, subset_size=100, temperature=before, neighbouring=ADD_REMOVE)
    eps0_after = me.clip_blend_token_epsilon(clip=c, subset_size=100, temperature=after)
    return [
        f"| clip-blend synthesis, ε = 1, T = 20, s = 100 | add/remove (s, τ from the data) → replace-one "
        f"(s declared) | c/(2s) → c/s per entry of ẑ | τ = {before:.4f}, ε0 = {eps0_before:.3f} | {leak:.3f} | "
        f"τ = {after:.4f}, ε0 = {eps0_after:.3f} |"
    ]


def adadpsyn() -> list[str]:
    """AdaDPSyn at the same sizes (20 of 1,600 slots per token, 36 tokens, T̂ = 1, σ0 = 10, σ2 = 3)."""
    q, steps, delta = 20 / 1600, 36, DELTA
    rows = []
    for target in (1.0, 4.0):
        common = {
            "epsilon": target,
            "delta": delta,
            "sampling_rate": q,
            "steps": steps,
            "t_hat": 1,
            "sigma0": 10.0,
            "sigma2": 3.0,
        }
        paper = calibrate_adadpsyn(**common).value
        shipped = calibrate_adadpsyn(**common, labels_touched=2).value
        under_swap = eps(
            me.adadpsyn_event(
                sigma0=10.0, sigma1=paper, sigma2=3.0, sampling_rate=q, steps=steps, t_hat=1, labels_touched=2
            ),
            delta,
        )
        rows.append(
            f"| AdaDPSyn, target ε = {target:g} | replace-one within a label → any swap (2 label runs) | "
            f"2 (GoodRadius), 2R (means), 1 (counts) | σ1 = {paper:.2f} | {under_swap:.3f} | "
            f"σ1 = {shipped:.2f} |"
        )
    return rows


def mozo() -> list[str]:
    """DPS-MOZO at ε = 4, α = 5, 4 shots of |D| = 1,600, 100 tokens: replace-one before and after."""
    beta = calibrate_mozo(epsilon=4.0, delta=DELTA, sampling_rate=4 / 1600, steps=100, order=5.0).value
    e = eps(me.mozo_event(beta=beta, order=5.0, sampling_rate=4 / 1600, steps=100), DELTA)
    return [
        f"| DPS-MOZO, target ε = 4 (α = 5, 4 of 1,600, 100 tokens) | replace-one (unchanged) | one one-shot "
        f"prompt | β = {beta:.3f} | {e:.3f} | β = {beta:.3f} |"
    ]


def knn() -> list[str]:
    ro = to_relation(KNN_COVER, REPLACE_ONE)
    assert isinstance(ro, ev.ApproxDPEvent)
    return [
        f"| kNN filter cover charge (per-record budget (2, 1e-6)) | add/remove → replace-one (group of 2) | "
        f"a record leaves one vote, another joins it | (2, 1e-6), untagged | ({ro.epsilon:g}, {ro.delta:.3g}) | "
        f"({ro.epsilon:g}, {ro.delta:.3g}) |"
    ]


def mixed() -> list[str]:
    """One app's transcript at δ = 1/1,600: PTA (ε = 1), 100 MOZO tokens (ε = 4), the clip-blend run above and a
    kNN cover charge. Before, a ledger refused Tang next to MOZO and summed the rest at face value."""
    q, steps = 20 / 1600, 36
    beta = calibrate_mozo(epsilon=4.0, delta=DELTA, sampling_rate=4 / 1600, steps=100, order=5.0).value
    mozo_run = me.mozo_event(beta=beta, order=5.0, sampling_rate=4 / 1600, steps=100)
    tau_before, tau_after = _clip_blend_temperatures()
    eps0_face = me.clip_blend_token_epsilon(clip=10.0, subset_size=100, temperature=tau_before, neighbouring=ADD_REMOVE)
    # the old ledger composed the three as if they shared one relation: tag them alike to reproduce its figure
    face = ev.compose(
        mozo_run,
        ev.SelfComposedEvent(ev.ExponentialMechanismEvent(eps0_face, neighbouring=REPLACE_ONE), 20),
        ev.ApproxDPEvent(KNN_COVER.epsilon, KNN_COVER.delta, neighbouring=REPLACE_ONE),
    )
    held = ev.compose(
        mozo_run,
        me.clip_blend_event(clip=10.0, subset_size=100, temperature=tau_before, steps=20),
        to_relation(KNN_COVER, REPLACE_ONE),
    )
    sigma = calibrate_subsampled_gaussian(epsilon=1.0, delta=DELTA, sampling_rate=q, steps=steps).value
    now = ev.compose(
        me.tang_event(noise_multiplier=sigma, sampling_rate=q, steps=steps),
        mozo_run,
        me.clip_blend_event(clip=10.0, subset_size=100, temperature=tau_after, steps=20),
        to_relation(KNN_COVER, REPLACE_ONE),
    )
    return [
        f"| one ledger: PTA + MOZO + clip-blend + kNN cover | mixed relations → replace-one | as above | Tang "
        f"refused; the other three ε = {eps(face, DELTA):.3f} | {eps(held, DELTA):.3f} (the three) | "
        f"ε = {eps(now, DELTA):.3f} (all four) |"
    ]


def main() -> None:
    print("| method | relation | sensitivity | charged before | ε that held under replace-one | charged now |")
    print("|---|---|---|---:|---:|---:|")
    for rows in (tang(), clip_blend(), adadpsyn(), mozo(), knn(), mixed()):
        for row in rows:
            print(row)


if __name__ == "__main__":
    main()
