"""What a method samples: the *elements* of a privacy unit, and how much of one element reaches a prompt.

Every method draws elements and lets each drawn element put its records into **one** prompt (or one row) of the
step. Under a record-level ledger an element is one record (``(record,)``), and nothing below draws randomness,
so record-level runs are what they were. Under a unit-level ledger an element is one privacy unit (a person:
``PrivateRecord.unit``) with its records, bounded before they reach a prompt (contribution bounding):

- **Records.** A drawn element puts at most ``records_per_unit`` = k of its records into its prompt, a uniformly
  random k of them drawn afresh each time it is drawn (:func:`records_of`). The choice depends on that unit's
  records and the randomness alone.
- **Labels.** For the label-conditioned methods (Tang, PTA, AdaDPSyn, clip-blend), a unit takes part in the
  generation of at most ``labels_per_unit`` = c of the labels the run generates: a uniformly random c of its
  labels, drawn once per run (:func:`label_elements`).

Why the record-level analysis then holds per unit. Fix the randomness of every other unit. Adding, removing or
replacing all records of one unit changes, in each label's run, at most one element, and that element's records
enter one prompt (or row) of a step, as one record's did: each method's per-step sensitivity bound holds as
stated for a record, whatever the unit's records are. The choices above are made for each unit from its own
records, so the runs on the two datasets are mixtures over the same choices of the other units with the same
weights; the hockey-stick divergence is jointly convex and the Rényi divergence jointly quasi-convex, so the
bound for every fixed choice is a bound for the mixture. Sampling rates are over units: the number of units of a
label is declared public (``PrivateDataset(public_unit_counts=...)``), or for methods that sample the whole
dataset without replacement under replace-one it is the number of units, which that relation keeps fixed.

A unit that spans c labels changes c labels' runs, which the record-level analysis (labels partition the
records) does not see: :func:`labels_charged` gives the number of label runs a unit-level event composes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin.accounting.neighbouring import PER_RECORD, PER_UNIT, check_privacy_unit
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.errors import ConfigurationError

__all__ = [
    "Element",
    "all_elements",
    "label_elements",
    "labels_charged",
    "population",
    "records_of",
    "require_units",
    "unit_user_id",
]

Element = tuple[PrivateRecord, ...]
"""One sampled element: a record alone (record level), or one unit's records of a label (unit level)."""


def require_units(dataset: PrivateDataset, privacy_unit: str) -> str:
    """``privacy_unit``, after checking that a unit-level run has every record's unit.

    Args:
        dataset: the private records.
        privacy_unit: ``"record"`` or ``"unit"`` (the ledger's).

    Raises:
        ConfigurationError: an unknown unit, or a record without a unit under ``"unit"``.
    """
    unit = check_privacy_unit(privacy_unit)
    if unit == PER_UNIT:
        dataset.check_units()
    return unit


def population(dataset: PrivateDataset, label: str, privacy_unit: str) -> int:
    """The declared public number of elements of ``label``: records (``public_label_counts``) or units
    (``public_unit_counts``). Never read from the records.

    Args:
        dataset: the private records.
        label: one of its labels.
        privacy_unit: ``"record"`` or ``"unit"``.

    Raises:
        ConfigurationError: nothing declared for that unit, or an unknown label.
    """
    if check_privacy_unit(privacy_unit) == PER_RECORD:
        return dataset.public_count(label)
    return dataset.public_unit_count(label)


def labels_charged(dataset: PrivateDataset, labels: Sequence[str], privacy_unit: str) -> int:
    """How many of the run's label generations one element may take part in: 1 for a record (labels partition
    the records), ``min(labels_per_unit, len(labels))`` for a unit.

    Args:
        dataset: the private records (its ``labels_per_unit``).
        labels: the labels the run generates.
        privacy_unit: ``"record"`` or ``"unit"``.
    """
    if check_privacy_unit(privacy_unit) == PER_RECORD:
        return 1
    bound = dataset.labels_per_unit
    return len(labels) if bound is None else min(bound, len(labels))


def label_elements(
    dataset: PrivateDataset, labels: Sequence[str], privacy_unit: str, rng: np.random.Generator
) -> dict[str, tuple[Element, ...]]:
    """Each label's elements for one run (private: use only inside a mechanism, after the charge).

    Record level: every record of the label alone, in order; ``rng`` is not used. Unit level: each unit's
    records of the label, for the units that keep that label: a unit with more than ``labels_per_unit`` of the
    run's labels keeps a uniformly random ``labels_per_unit`` of them (drawn from ``rng``, unit by unit).

    Args:
        dataset: the private records.
        labels: the labels the run generates.
        privacy_unit: ``"record"`` or ``"unit"``.
        rng: the randomness of the label choice.
    """
    if check_privacy_unit(privacy_unit) == PER_RECORD:
        return {y: tuple((r,) for r in dataset.records(y)) for y in labels}
    by_unit: dict[str, dict[str, list[PrivateRecord]]] = {}
    for y in labels:
        for record in dataset.records(y):
            by_unit.setdefault(unit_user_id(record.unit), {}).setdefault(y, []).append(record)
    bound = labels_charged(dataset, labels, privacy_unit)
    out: dict[str, list[Element]] = {y: [] for y in labels}
    for per_label in by_unit.values():
        kept = list(per_label)
        if len(kept) > bound:
            kept = [kept[int(i)] for i in sorted(rng.choice(len(kept), size=bound, replace=False))]
        for y in kept:
            out[y].append(tuple(per_label[y]))
    return {y: tuple(elements) for y, elements in out.items()}


def all_elements(dataset: PrivateDataset, privacy_unit: str) -> tuple[Element, ...]:
    """Every element of the dataset, whatever its labels (for methods that sample the whole dataset: DPS-MOZO,
    the clip-blend decoder): each record alone, or each unit with all its records (in label order).

    Args:
        dataset: the private records.
        privacy_unit: ``"record"`` or ``"unit"``.
    """
    records = [r for y in dataset.labels for r in dataset.records(y)]
    if check_privacy_unit(privacy_unit) == PER_RECORD:
        return tuple((r,) for r in records)
    by_unit: dict[str, list[PrivateRecord]] = {}
    for record in records:
        by_unit.setdefault(unit_user_id(record.unit), []).append(record)
    return tuple(tuple(rs) for rs in by_unit.values())


def records_of(element: Element, limit: int, rng: np.random.Generator) -> list[PrivateRecord]:
    """The records one drawn element puts into its prompt: all of them when it has at most ``limit`` (a record
    alone: ``rng`` is not used), else a uniformly random ``limit`` of them, in their order.

    Args:
        element: the element drawn.
        limit: k, the public contribution bound (``PrivateDataset.records_per_unit``).
        rng: the randomness of the choice.

    Raises:
        ConfigurationError: ``limit`` is not positive.
    """
    if limit < 1:
        raise ConfigurationError(f"records_per_unit must be at least 1, got {limit}")
    if len(element) <= limit:
        return list(element)
    return [element[int(i)] for i in sorted(rng.choice(len(element), size=limit, replace=False))]


def unit_user_id(unit: str | int | None) -> str:
    """A record's unit as the key every method groups by (and a private index's user id): a string as is, an
    integer in decimal. A string unit that spells an integer unit is the same unit (two ids merged into one are
    protected together; one person split into two would not be).

    Args:
        unit: the record's unit.

    Raises:
        ConfigurationError: the record has no unit.
    """
    if unit is None:
        raise ConfigurationError("a record in a unit-level run names no unit")
    return unit if isinstance(unit, str) else str(int(unit))
