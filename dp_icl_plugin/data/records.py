"""Private records and the public demonstrations made from them; the types keep the two apart.

- :class:`PrivateRecord` holds private text (and its label); its ``repr`` and ``str`` never show the text.
- :class:`PrivateDataset` groups records by label and validates them before anything is charged.
- :class:`Demonstration` is a DP output: public by construction, safe to log, store and put in prompts.

Public prompt parts (instructions, label names, templates) are plain strings supplied by the developer;
nothing in this package turns a ``PrivateRecord`` into a string except a method's private prompts, whose
outputs are only released through a DP mechanism after the budget was charged.

**Which counts are public.** Label names are public (they appear in prompts). The number of records |D|
is public under replace-one neighbours (the relation keeps it fixed), not under add/remove. The count of
each label |D_y| is public under neither: a replacement may change a record's label. Every published
label-conditioned method sets a sampling rate or a divisor from |D_y| (Tang et al. 2024; PTA; AdaDPSyn;
clip-blend), and an analysis that assumes such a quantity fixed breaks when it is read from the data
(adding one record to a label of M·N records moves q from 1 to M·N/(M·N+1) and drops another record
with probability ≈ 0.63). So those methods take the per-label sizes the caller *declares* public
(``public_label_counts``): fixed numbers, published with the output, used as the population sizes of the
sampling and never recomputed from the records. ``public_label_counts="observed"`` declares the observed
counts public (the caller accepts that they are released).

**Privacy units.** A record may name its unit (``PrivateRecord(text, label, unit="patient-17")``): the person
whose data it is. Under a unit-level ledger (``PrivacyBudget(..., privacy_unit="unit")``) every method protects
all of a unit's records together (:mod:`~dp_icl_plugin.data.units`); it then samples units, not records, and
sizes its sampling by the number of units of each label the caller declares public (``public_unit_counts``),
letting a drawn unit put at most ``records_per_unit`` of its records into a prompt and take part in at most
``labels_per_unit`` labels' generation. Under a record-level ledger the units are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["Demonstration", "PrivateDataset", "PrivateRecord", "check_label_set"]


@dataclass(frozen=True, eq=False)
class PrivateRecord:
    """One private record: its text and its (public-vocabulary) label. Compared by identity, never by text.

    Attributes:
        text: the private text.
        label: its label, one of the dataset's public label set.
        unit: the privacy unit it belongs to (a person, a patient: a string or an integer id), or None. Private
            like the text; a unit-level ledger protects all records of one unit together.
    """

    text: str = field(repr=False)
    label: str = field(repr=False)
    unit: str | int | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return "PrivateRecord(<private>)"

    __str__ = __repr__


def check_label_set(labels: object) -> tuple[str, ...]:
    """A non-empty sequence of distinct, non-empty label names (public: they appear in prompts).

    Args:
        labels: the label names.

    Raises:
        ConfigurationError: not a sequence of names, empty, a name empty or not a string, or a repeated name.
    """
    if isinstance(labels, str) or not isinstance(labels, Iterable):
        raise ConfigurationError("labels must be a sequence of label names")
    result = tuple(labels)
    if not result:
        raise ConfigurationError("labels must not be empty")
    for i, name in enumerate(result):
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"label {i} must be a non-empty string")
    if len(set(result)) != len(result):
        raise ConfigurationError("labels must be distinct")
    return result


OBSERVED = "observed"


class PrivateDataset:
    """Private records grouped by label, validated once.

    Args:
        records: the private records.
        labels: the public label set, in display order (default: the keys of ``public_label_counts`` when
            it is a mapping, else the records' labels, sorted). Every record's label must be in it; a label
            may have no records.
        public_label_counts: the size of each label the caller declares public (see the module docstring):
            a mapping ``{label: size}`` over the whole label set, or ``"observed"`` to declare the observed
            counts public. Label-conditioned methods (Tang, PTA, AdaDPSyn, clip-blend) refuse to run
            without it. ``None`` (default): nothing declared.
        public_unit_counts: under a unit-level ledger, the number of units with records of each label the
            caller declares public (the population the label-conditioned methods sample units from): a mapping
            over the whole label set, or ``"observed"``. ``None`` (default): nothing declared.
        records_per_unit: at most this many of one unit's records go into one prompt at one step (a public
            contribution bound; default 1). Used under a unit-level ledger only.
        labels_per_unit: a unit takes part in the generation of at most this many labels (a uniformly random
            choice among its labels, made per run; the run is charged for this many labels). ``None``
            (default): as many as the run generates. Used under a unit-level ledger only.

    Raises:
        ConfigurationError: no records, an empty or non-string text, a label outside ``labels``, a unit that is
            not a string or an integer, a bad declaration or bound. Messages give a record's position, never its
            content.
    """

    def __init__(
        self,
        records: Iterable[PrivateRecord],
        *,
        labels: Sequence[str] | None = None,
        public_label_counts: Mapping[str, int] | str | None = None,
        public_unit_counts: Mapping[str, int] | str | None = None,
        records_per_unit: int = 1,
        labels_per_unit: int | None = None,
    ) -> None:
        items = list(records) if not isinstance(records, (str, bytes)) else None
        if items is None:
            raise ConfigurationError("records must be an iterable of PrivateRecord")
        if not items:
            raise ConfigurationError("a private dataset needs at least one record")
        for i, record in enumerate(items):
            if not isinstance(record, PrivateRecord):
                raise ConfigurationError(f"record {i} is a {type(record).__name__}, not a PrivateRecord")
            if not isinstance(record.text, str) or not record.text.strip():
                raise ConfigurationError(f"record {i} has an empty or non-string text")
            if not isinstance(record.label, str):
                raise ConfigurationError(f"record {i} has a non-string label")
            unit = record.unit
            if unit is not None and (isinstance(unit, bool) or not isinstance(unit, (str, Integral))):
                raise ConfigurationError(f"record {i} has a unit that is neither a string nor an integer")
            if isinstance(unit, str) and not unit.strip():
                raise ConfigurationError(f"record {i} has an empty unit")
        if labels is None and isinstance(public_label_counts, Mapping):
            labels = list(public_label_counts)
        label_set = check_label_set(labels if labels is not None else sorted({r.label for r in items}))
        known = set(label_set)
        for i, record in enumerate(items):
            if record.label not in known:
                raise ConfigurationError(f"record {i} has a label outside the label set {list(label_set)}")
        self._labels = label_set
        self._by_label: dict[str, tuple[PrivateRecord, ...]] = {
            name: tuple(r for r in items if r.label == name) for name in label_set
        }
        self._size = len(items)
        self._public_counts = self._declared(public_label_counts, "public_label_counts", self._observed_sizes)
        self._public_unit_counts = self._declared(public_unit_counts, "public_unit_counts", self._observed_units)
        self._records_per_unit = check.positive_int("records_per_unit", records_per_unit)
        self._labels_per_unit = (
            None if labels_per_unit is None else check.positive_int("labels_per_unit", labels_per_unit)
        )

    @property
    def records_per_unit(self) -> int:
        """k: the most records of one unit in one prompt at one step (public; fixed when the dataset is made)."""
        return self._records_per_unit

    @property
    def labels_per_unit(self) -> int | None:
        """c: the most labels one unit takes part in, or None for every label a run generates (public; fixed)."""
        return self._labels_per_unit

    def _observed_sizes(self) -> dict[str, int]:
        return {y: len(rs) for y, rs in self._by_label.items()}

    def _observed_units(self) -> dict[str, int]:
        self.check_units()
        # keyed as data.units keys units (an integer and its decimal text are one unit)
        return {y: len({str(r.unit) for r in rs}) for y, rs in self._by_label.items()}

    def _declared(
        self, counts: Mapping[str, int] | str | None, name: str, observed: Callable[[], dict[str, int]]
    ) -> dict[str, int] | None:
        if counts is None:
            return None
        if counts == OBSERVED:
            return observed()
        if isinstance(counts, str) or not isinstance(counts, Mapping):
            raise ConfigurationError(f'{name} must be a mapping {{label: size}} or "observed"')
        if set(counts) != set(self._labels):
            raise ConfigurationError(f"{name} must give a size for each label of {list(self._labels)}")
        out: dict[str, int] = {}
        for y in self._labels:
            n = counts[y]
            if isinstance(n, bool) or not isinstance(n, Integral) or int(n) < 0:
                raise ConfigurationError(f"the declared size of label {y!r} in {name} must be a non-negative integer")
            out[y] = int(n)
        return out

    def check_units(self) -> None:
        """Refuse a dataset with a record that names no unit (a unit-level run needs every record's unit).

        Raises:
            ConfigurationError: a record has no unit (its position is given, never its content).
        """
        for i, record in enumerate(r for y in self._labels for r in self._by_label[y]):
            if record.unit is None:
                raise ConfigurationError(
                    f"record {i} (in label order) names no unit: under a unit-level ledger every record needs "
                    "PrivateRecord(..., unit=...) (or a unit column)"
                )

    @property
    def public_unit_counts(self) -> dict[str, int] | None:
        """The declared public number of units of each label, or None when nothing was declared."""
        return None if self._public_unit_counts is None else dict(self._public_unit_counts)

    def public_unit_count(self, label: str) -> int:
        """The declared public number of units with records of ``label``: the population a unit-level method's
        sampling for that label uses.

        Args:
            label: one of the dataset's labels.

        Raises:
            ConfigurationError: no unit counts were declared, or ``label`` is unknown.
        """
        self.check_labels([label])
        if self._public_unit_counts is None:
            raise ConfigurationError(
                "under a unit-level ledger this method samples each label's units, whose number is private unless "
                'declared: build the dataset with public_unit_counts={label: units, ...}, or "observed" to '
                "publish the observed numbers"
            )
        return self._public_unit_counts[label]

    @classmethod
    def from_pairs(
        cls,
        texts: Iterable[str],
        record_labels: Iterable[str],
        *,
        labels: Sequence[str] | None = None,
        public_label_counts: Mapping[str, int] | str | None = None,
        units: Iterable[str | int] | None = None,
        **unit_settings: Any,
    ) -> PrivateDataset:
        """Records from parallel columns of texts and labels (and units).

        Args:
            texts: the records' texts.
            record_labels: each record's label, aligned with ``texts``.
            labels: the public label set (as in the constructor).
            public_label_counts: the declared public sizes (as in the constructor).
            units: each record's privacy unit, aligned with ``texts``, or None.
            **unit_settings: ``public_unit_counts``, ``records_per_unit``, ``labels_per_unit`` (as in the
                constructor).

        Raises:
            ConfigurationError: the columns differ in length, or what the constructor refuses.
        """
        text_list, label_list = list(texts), list(record_labels)
        unit_list: list[Any] = [None] * len(text_list) if units is None else list(units)
        if len(text_list) != len(label_list):
            raise ConfigurationError(f"{len(text_list)} texts but {len(label_list)} labels")
        if len(unit_list) != len(text_list):
            raise ConfigurationError(f"{len(text_list)} texts but {len(unit_list)} units")
        return cls(
            (PrivateRecord(t, y, u) for t, y, u in zip(text_list, label_list, unit_list, strict=True)),
            labels=labels,
            public_label_counts=public_label_counts,
            **unit_settings,
        )

    def with_public_label_counts(self, counts: Mapping[str, int] | str) -> PrivateDataset:
        """The same records and labels with ``counts`` declared public (a mapping or ``"observed"``).

        Args:
            counts: ``{label: size}`` over the whole label set, or ``"observed"``.

        Raises:
            ConfigurationError: a bad declaration.
        """
        return self._with(public_label_counts=counts)

    def with_units(
        self,
        *,
        public_unit_counts: Mapping[str, int] | str | None = None,
        records_per_unit: int | None = None,
        labels_per_unit: int | None = None,
    ) -> PrivateDataset:
        """The same records with unit counts declared or contribution bounds set (the rest kept).

        Args:
            public_unit_counts: the declared public number of units per label, or ``"observed"``.
            records_per_unit: the records one unit may put into a prompt at one step.
            labels_per_unit: the labels one unit may take part in.

        Raises:
            ConfigurationError: a bad declaration or bound.
        """
        changes: dict[str, Any] = {}
        if public_unit_counts is not None:
            changes["public_unit_counts"] = public_unit_counts
        if records_per_unit is not None:
            changes["records_per_unit"] = records_per_unit
        if labels_per_unit is not None:
            changes["labels_per_unit"] = labels_per_unit
        return self._with(**changes)

    def _with(self, **changes: Any) -> PrivateDataset:
        settings: dict[str, Any] = {
            "public_label_counts": self._public_counts,
            "public_unit_counts": self._public_unit_counts,
            "records_per_unit": self.records_per_unit,
            "labels_per_unit": self.labels_per_unit,
        }
        settings.update(changes)
        records = [r for y in self._labels for r in self._by_label[y]]
        return PrivateDataset(records, labels=self._labels, **settings)

    @property
    def public_label_counts(self) -> dict[str, int] | None:
        """The declared public size of each label, or None when nothing was declared."""
        return None if self._public_counts is None else dict(self._public_counts)

    def public_count(self, label: str) -> int:
        """The declared public size n_y of ``label``: the population size its sampling uses.

        Args:
            label: one of the dataset's labels.

        Raises:
            ConfigurationError: no sizes were declared (nothing is read from the data instead).
            ConfigurationError: no sizes were declared (nothing is read from the data instead), or ``label`` is
                unknown.
        """
        self.check_labels([label])
        if self._public_counts is None:
            raise ConfigurationError(
                "this method sets its sampling from each label's size, which is private unless declared: "
                "build the dataset with public_label_counts={label: size, ...} (|D| for every label is always "
                'valid under replace-one), or "observed" to publish the observed counts'
            )
        return self._public_counts[label]

    @property
    def labels(self) -> tuple[str, ...]:
        """The public label set."""
        return self._labels

    def records(self, label: str) -> tuple[PrivateRecord, ...]:
        """The records of one label (a private view: use only inside a DP mechanism).

        Args:
            label: one of the dataset's labels.

        Raises:
            ConfigurationError: ``label`` is unknown.
        """
        self.check_labels([label])
        return self._by_label[label]

    def count(self, label: str) -> int:
        """|D_y| as observed: private (use :meth:`public_count` for a size an analysis may rely on).

        Args:
            label: one of the dataset's labels.

        Raises:
            ConfigurationError: ``label`` is unknown.
        """
        self.check_labels([label])
        return len(self._by_label[label])

    def check_labels(self, labels: Iterable[str]) -> tuple[str, ...]:
        """``labels`` as a tuple, each one of this dataset's label set.

        Args:
            labels: label names.

        Raises:
            ConfigurationError: a malformed label set (:func:`check_label_set`), or a label outside this dataset's.
        """
        result = check_label_set(labels)
        unknown = [name for name in result if name not in self._by_label]
        if unknown:
            raise ConfigurationError(f"unknown label(s) {unknown}; the label set is {list(self._labels)}")
        return result

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        declared = "" if self._public_counts is None else f", public_label_counts={self._public_counts}"
        if self._public_unit_counts is not None:
            declared += f", public_unit_counts={self._public_unit_counts}"
        return f"PrivateDataset(labels={list(self._labels)}{declared})"  # |D| is private under add/remove


@dataclass(frozen=True)
class Demonstration:
    """A DP synthetic demonstration: public, the output of a DP mechanism (or post-processing of one).

    Attributes:
        label: the label it was generated for.
        text: the generated text.
        token_ids: the generated token ids of the backend that produced it.
        input: for methods that answer public inputs (MOZO offline), the public input; else ``None``.
    """

    label: str
    text: str
    token_ids: tuple[int, ...] = ()
    input: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``input`` only when there is one. :meth:`from_dict` inverts it."""
        out: dict[str, Any] = {"label": self.label, "text": self.text, "token_ids": list(self.token_ids)}
        if self.input is not None:
            out["input"] = self.input
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Demonstration:
        """Rebuild a demonstration from :meth:`to_dict` output.

        Args:
            data: the dict.

        Raises:
            ConfigurationError: a missing or mistyped field.
        """
        try:
            label, text = data["label"], data["text"]
            ids = tuple(int(t) for t in data.get("token_ids", ()))
            given = data.get("input")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"not a demonstration record: {type(exc).__name__}") from None
        if not isinstance(label, str) or not isinstance(text, str) or not (given is None or isinstance(given, str)):
            raise ConfigurationError("a demonstration needs string label, text and input")
        return cls(label, text, ids, given)
