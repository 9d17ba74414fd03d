"""Private records and the public demonstrations made from them; the types keep the two apart.

- :class:`PrivateRecord` holds private text (and its label); its ``repr`` and ``str`` never show the text.
- :class:`PrivateDataset` groups records by label and validates them before anything is charged.
- :class:`Demonstration` is a DP output: public by construction, safe to log, store and put in prompts.

Public prompt parts (instructions, label names, templates) are plain strings supplied by the developer;
nothing in this package turns a ``PrivateRecord`` into a string except a method's private prompts, whose
outputs are only released through a DP mechanism after the budget was charged.

Label names are public, and so are the record counts per label: every published method sets its sampling
rate from |D_y| (Tang et al. 2024; PTA; AdaDPSyn) and this library follows them. Under add/remove the
counts change by one; treat them as public side information, as the papers do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["Demonstration", "PrivateDataset", "PrivateRecord", "check_label_set"]


@dataclass(frozen=True, eq=False)
class PrivateRecord:
    """One private record: its text and its (public-vocabulary) label. Compared by identity, never by text."""

    text: str = field(repr=False)
    label: str = field(repr=False)

    def __repr__(self) -> str:
        return "PrivateRecord(<private>)"

    __str__ = __repr__


def check_label_set(labels: object) -> tuple[str, ...]:
    """A non-empty sequence of distinct, non-empty label names (public: they appear in prompts)."""
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


class PrivateDataset:
    """Private records grouped by label, validated once.

    Args:
        records: the private records.
        labels: the public label set, in display order (default: the records' labels, sorted). Every
            record's label must be in it; a label may have no records.

    Raises:
        ConfigurationError: no records, an empty or non-string text, a label outside ``labels``. Messages
            give a record's position, never its content.
    """

    def __init__(self, records: Iterable[PrivateRecord], *, labels: Sequence[str] | None = None) -> None:
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

    @classmethod
    def from_pairs(
        cls, texts: Iterable[str], record_labels: Iterable[str], *, labels: Sequence[str] | None = None
    ) -> PrivateDataset:
        """Records from parallel columns of texts and labels."""
        text_list, label_list = list(texts), list(record_labels)
        if len(text_list) != len(label_list):
            raise ConfigurationError(f"{len(text_list)} texts but {len(label_list)} labels")
        return cls((PrivateRecord(t, y) for t, y in zip(text_list, label_list, strict=True)), labels=labels)

    @property
    def labels(self) -> tuple[str, ...]:
        """The public label set."""
        return self._labels

    def records(self, label: str) -> tuple[PrivateRecord, ...]:
        """The records of one label (a private view: use only inside a DP mechanism)."""
        self.check_labels([label])
        return self._by_label[label]

    def count(self, label: str) -> int:
        """|D_y|, treated as public (see the module docstring)."""
        self.check_labels([label])
        return len(self._by_label[label])

    def check_labels(self, labels: Iterable[str]) -> tuple[str, ...]:
        """``labels`` as a tuple, each one of this dataset's label set."""
        result = check_label_set(labels)
        unknown = [name for name in result if name not in self._by_label]
        if unknown:
            raise ConfigurationError(f"unknown label(s) {unknown}; the label set is {list(self._labels)}")
        return result

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"PrivateDataset(n_records={self._size}, labels={list(self._labels)})"


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
        out: dict[str, Any] = {"label": self.label, "text": self.text, "token_ids": list(self.token_ids)}
        if self.input is not None:
            out["input"] = self.input
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Demonstration:
        try:
            label, text = data["label"], data["text"]
            ids = tuple(int(t) for t in data.get("token_ids", ()))
            given = data.get("input")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"not a demonstration record: {type(exc).__name__}") from None
        if not isinstance(label, str) or not isinstance(text, str) or not (given is None or isinstance(given, str)):
            raise ConfigurationError("a demonstration needs string label, text and input")
        return cls(label, text, ids, given)
