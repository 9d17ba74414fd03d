"""Audit cases for privacy units: a synthesizer's and a decoder's token on D against D minus one whole unit.

**Relation, sensitivity, accounting.** Add/remove of one unit (``privacy_unit="unit"``): D holds a *canary unit*
with :data:`CANARY_RECORDS` records beside ordinary units; D′ is D without it (every other unit's records kept,
the declared unit count the same). Each case draws its elements exactly as the library does
(:mod:`~dp_icl_plugin.data.units`: :func:`~dp_icl_plugin.data.units.label_elements` or
:func:`~dp_icl_plugin.data.units.all_elements`, then the method's own draw and
:func:`~dp_icl_plugin.data.units.records_of` with ``records_per_unit`` = 1) and releases one token with the
method's own mechanism; the claim is the record-level per-token event with the unit as its element, tagged per
unit, what the library charges per token:

- **Tang synthesis token** (the draw of Tang, PTA; AdaDPSyn draws the same elements without replacement): the
  units Poisson-sampled at q = M·N/n_units = 1 (every unit is drawn, the worst case: no amplification) and
  dealt to M prompts (:func:`~dp_icl_plugin.templates.prompting.poisson_prompts`), then
  :func:`~dp_icl_plugin.mechanisms.gaussian_aggregation.noisy_argmax`. A prompt holding a canary record puts its
  mass on token 0, any other prompt on token 1 (a worst-case model: the claim holds for every model). One unit
  moves one prompt: sensitivity √2. Claim: ``tang_event(σ, q=1, steps=1)`` per unit.
- **Clip-blend decoder token**: the decoder's one fixed subset of expected size s from N declared units
  (:func:`~dp_icl_plugin.steps.clip_blend_step.assign_groups`; s = N: every unit joins), one prompt per unit, then
  :func:`~dp_icl_plugin.mechanisms.clip_blend_sampling.clip_blend_token`. A canary prompt pushes token 0 to the
  clip; the public row makes token 0 rare without it. One unit moves one prompt: ε0 = c/(sτ). Claim:
  ``clip_blend_event(steps=1)`` per unit.

- **Tang synthesis across labels**: the canary unit holds 4 records in each of :data:`LABELS` labels, k = 3 of them
  enter its one prompt per label and token; every label's token is released as above, and the output is whether at
  least :data:`_ACROSS_THRESHOLD` labels released the canary's token (post-processing: a threshold on the
  likelihood ratio, which grows with that count). Claim: the unit takes part in every label's run, c = labels, so
  ``tang_event`` over c steps.

**The broken variant: records sampled as if independent.** The same code with every record its own element
(``privacy_unit="record"`` for the draw) while the unit-level claim stands: the canary unit's records then enter
up to :data:`CANARY_RECORDS` prompts, and its influence is that many records' (group privacy the charge does not
pay for), which the audit must catch. Across labels, the broken claim is one label's run: labels taken to partition
units as they partition records, the c-label charge left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, PER_RECORD, PER_UNIT
from dp_icl_plugin.audit.sampling import loop, rare_token_public_row
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import all_elements, label_elements, records_of
from dp_icl_plugin.mechanisms.clip_blend_sampling import clip_blend_token
from dp_icl_plugin.mechanisms.gaussian_aggregation import noisy_argmax
from dp_icl_plugin.steps.clip_blend_step import assign_groups
from dp_icl_plugin.templates.prompting import poisson_prompts

__all__ = [
    "CANARY_RECORDS",
    "DELTA",
    "clip_blend_decoder_event",
    "clip_blend_decoder_pairs",
    "tang_across_labels_event",
    "tang_across_labels_pairs",
    "tang_synthesis_event",
    "tang_synthesis_pairs",
]

Sampler = Callable[[bool, int, np.random.Generator], np.ndarray]

CANARY_RECORDS = 8  # the canary unit's records
DELTA = 1e-4
_CANARY = "canary"


def _datasets(n_units: int, *, records_per_other: int) -> dict[bool, PrivateDataset]:
    """D (the canary unit and ``n_units`` − 1 ordinary units) under False, D′ (without the canary unit) under True;
    one label, ``n_units`` units declared on both."""
    canary = [PrivateRecord(f"{_CANARY} {i}", "a", unit="canary") for i in range(CANARY_RECORDS)]
    others = [
        PrivateRecord(f"plain {u} {j}", "a", unit=f"u{u}") for u in range(n_units - 1) for j in range(records_per_other)
    ]
    return {
        False: PrivateDataset(canary + others, public_unit_counts={"a": n_units}),
        True: PrivateDataset(others, public_unit_counts={"a": n_units}),
    }


def _has_canary(records: list[PrivateRecord]) -> bool:
    return any(r.text.startswith(_CANARY) for r in records)


# -- Tang synthesis: units Poisson-sampled and dealt to prompts ------------------------------------------------
_TANG_SIGMA, _TANG_PROMPTS, _TANG_UNITS = 1.0, 6, 12  # q = M·N/n_units = 6·2/12 = 1


def tang_synthesis_event() -> ev.DPEvent:
    """The claim: one Tang token per unit at q = 1 (add/remove of a unit)."""
    event = me.tang_event(noise_multiplier=_TANG_SIGMA, sampling_rate=1.0, steps=1, neighbouring=ADD_REMOVE)
    return ev.with_privacy_unit(event, PER_UNIT)


def tang_synthesis_pairs(broken: bool) -> list[Sampler]:
    """One pair: D against D minus the canary unit; ``broken`` draws records as if independent.

    Args:
        broken: sample every record as its own element (the claim kept).
    """
    data = _datasets(_TANG_UNITS, records_per_other=2)
    drawn = PER_RECORD if broken else PER_UNIT

    def token(neighbour: bool, rng: np.random.Generator) -> int:
        elements = label_elements(data[neighbour], ["a"], drawn, rng)["a"]
        prompts = poisson_prompts(elements, sampling_rate=1.0, n_prompts=_TANG_PROMPTS, rng=rng, records_per_element=1)
        rows = np.array([[1.0, 0.0] if _has_canary(p) else [0.0, 1.0] for p in prompts])
        return noisy_argmax(rows, noise_multiplier=_TANG_SIGMA, rng=rng)

    sampler: Any = lambda nb, n, rng: loop(lambda g: token(nb, g))(n, rng)  # noqa: E731
    return [sampler]


# -- clip-blend decoder: the fixed subset drawn by unit ---------------------------------------------------------
_CLIP, _S, _TAU = 10.0, 10, 1.0  # ε0 = c/(sτ) = 1 per token; s = N = 10 units: every unit joins the subset


def clip_blend_decoder_event() -> ev.DPEvent:
    """The claim: one clip-blend decoder token per unit (add/remove of a unit)."""
    event = me.clip_blend_event(clip=_CLIP, subset_size=_S, temperature=_TAU, steps=1, neighbouring=ADD_REMOVE)
    return ev.with_privacy_unit(event, PER_UNIT)


def clip_blend_decoder_pairs(broken: bool) -> list[Sampler]:
    """One pair: D against D minus the canary unit; ``broken`` draws records as if independent.

    Args:
        broken: every record its own element (the claim kept).
    """
    data = _datasets(_S, records_per_other=1)
    drawn = PER_RECORD if broken else PER_UNIT
    # the public row that makes token 0 rare (P ≈ 0.02) when no canary prompt is in the subset
    public = rare_token_public_row(np.zeros((_S - 1, 2)), clip=_CLIP, subset_size=_S, temperature=_TAU)

    def token(neighbour: bool, rng: np.random.Generator) -> int:
        elements = all_elements(data[neighbour], drawn)
        (members,) = assign_groups(len(elements), population=_S, n_groups=1, subset_size=_S, rng=rng)
        subset = [records_of(elements[int(i)], 1, rng) for i in members]
        private = np.array([[2 * _CLIP, 0.0] if _has_canary(p) else [0.0, 0.0] for p in subset]).reshape(-1, 2)
        return clip_blend_token(private, public, clip=_CLIP, subset_size=_S, temperature=_TAU, rng=rng)

    sampler: Any = lambda nb, n, rng: loop(lambda g: token(nb, g))(n, rng)  # noqa: E731
    return [sampler]


# -- Tang synthesis across labels: one unit in every label's run --------------------------------------------------
LABELS, _ACROSS_SIGMA, _ACROSS_PROMPTS, _ACROSS_K, _ACROSS_THRESHOLD = 12, 2.0, 6, 3, 4


def tang_across_labels_event(labels_charged: int = LABELS) -> ev.DPEvent:
    """The claim: one token in each of ``labels_charged`` labels' runs per unit at q = 1 (the shipped charge is every
    label, c = :data:`LABELS`; the broken one a single label's run).

    Args:
        labels_charged: the label runs the claim composes.
    """
    event = me.tang_event(
        noise_multiplier=_ACROSS_SIGMA, sampling_rate=1.0, steps=labels_charged, neighbouring=ADD_REMOVE
    )
    return ev.with_privacy_unit(event, PER_UNIT)


def tang_across_labels_pairs(broken: bool) -> list[Sampler]:
    """One pair: D against D minus the canary unit (4 records in each label, k = 3); the mechanism as shipped (the
    broken variant changes the claim, :func:`tang_across_labels_event` with one label).

    Args:
        broken: unused (the claim is what breaks).
    """
    labels = [f"y{i}" for i in range(LABELS)]
    canary = [PrivateRecord(f"{_CANARY} {y} {j}", y, unit="canary") for y in labels for j in range(4)]
    others = [PrivateRecord(f"plain {u} {y}", y, unit=f"u{u}") for u in range(2 * _ACROSS_PROMPTS - 1) for y in labels]
    declared = {y: 2 * _ACROSS_PROMPTS for y in labels}  # q = M·N/u_y = 6·2/12 = 1
    data = {
        nb: PrivateDataset(records, public_unit_counts=declared, records_per_unit=_ACROSS_K)
        for nb, records in ((False, canary + others), (True, others))
    }
    # labels_per_unit is every label: no choice to draw, the elements are the same for every sample
    elements = {nb: label_elements(data[nb], labels, PER_UNIT, np.random.default_rng(0)) for nb in (False, True)}

    def output(neighbour: bool, rng: np.random.Generator) -> int:
        released = 0
        for label in labels:
            prompts = poisson_prompts(
                elements[neighbour][label],
                sampling_rate=1.0,
                n_prompts=_ACROSS_PROMPTS,
                rng=rng,
                records_per_element=_ACROSS_K,
            )
            rows = np.array([[1.0, 0.0] if _has_canary(p) else [0.0, 1.0] for p in prompts])
            released += noisy_argmax(rows, noise_multiplier=_ACROSS_SIGMA, rng=rng) == 0
        return int(released >= _ACROSS_THRESHOLD)

    sampler: Any = lambda nb, n, rng: loop(lambda g: output(nb, g))(n, rng)  # noqa: E731
    return [sampler]
