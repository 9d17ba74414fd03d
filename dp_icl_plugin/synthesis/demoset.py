"""A set of DP synthetic demonstrations with its provenance, stored as JSONL.

Synthesizing charges the budget once; everything after that is post-processing: a :class:`DemoSet` can be
saved, loaded, filtered and put into any number of prompts for free. Loading never touches private data and
never charges anything.

File format: the first line is a header ``{"format": "dp-icl-demoset", "version": 1, "provenance": {...}}``,
then one demonstration per line (``label``, ``text``, ``token_ids``, optional ``input``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from dp_icl_plugin.data.records import Demonstration
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["FORMAT", "DemoSet", "Provenance"]

FORMAT = "dp-icl-demoset"
VERSION = 1


@dataclass(frozen=True)
class Provenance:
    """Where a demonstration set came from.

    Attributes:
        method: the method's name (``"pta"``, ``"tang"``, ``"adadpsyn"``, ``"clip_blend"``, ``"mozo_offline"``).
        config: the method's configuration (JSON-ready; no private data).
        epsilon: the privacy cost ε of this synthesis on its own (tightest valid accounting).
        delta: the δ that ε holds at.
        event: the charged privacy event (``DPEvent.to_dict()``).
        ledger_entry_id: the id of the budget ledger's entry for the charge (None: not charged).
        ledger_label: that entry's label.
        model_id: the backend's model.
        created_at: ISO-8601 UTC time of the synthesis.
        extra: method-specific figures (e.g. the calibrated noise, the paper's ε next to the guarantee).
    """

    method: str
    config: dict[str, Any]
    epsilon: float
    delta: float
    event: dict[str, Any]
    ledger_entry_id: int | None
    ledger_label: str
    model_id: str
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict; :meth:`from_dict` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Rebuild a provenance from :meth:`to_dict` output (unknown keys are ignored).

        Args:
            data: the dict.

        Raises:
            ConfigurationError: a required field is missing.
        """
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except ConfigurationError:
            raise
        except TypeError as exc:
            raise ConfigurationError(f"bad demonstration-set provenance: {exc}") from None


class DemoSet(Sequence[Demonstration]):
    """DP synthetic demonstrations (public) with their :class:`Provenance`.

    Args:
        demonstrations: the demonstrations.
        provenance: where they came from.

    Raises:
        ConfigurationError: an item is not a :class:`~dp_icl_plugin.data.records.Demonstration`, or
            ``provenance`` is not a :class:`Provenance`.
    """

    def __init__(self, demonstrations: Sequence[Demonstration], provenance: Provenance) -> None:
        demos = tuple(demonstrations)
        if not all(isinstance(d, Demonstration) for d in demos):
            raise ConfigurationError("a DemoSet holds Demonstration objects")
        if not isinstance(provenance, Provenance):
            raise ConfigurationTypeError("provenance must be a Provenance")
        self._demos = demos
        self.provenance = provenance

    @overload
    def __getitem__(self, index: int) -> Demonstration: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Demonstration]: ...
    def __getitem__(self, index: int | slice) -> Demonstration | Sequence[Demonstration]:
        return self._demos[index]

    def __len__(self) -> int:
        return len(self._demos)

    def __iter__(self) -> Iterator[Demonstration]:
        return iter(self._demos)

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels present, in first-seen order."""
        return tuple(dict.fromkeys(d.label for d in self._demos))

    def for_label(self, label: str) -> list[Demonstration]:
        """The demonstrations of ``label``, in order.

        Args:
            label: a label.
        """
        return [d for d in self._demos if d.label == label]

    def as_examples(
        self, *, text_key: str = "text", label_key: str = "label", input_key: str = "input"
    ) -> list[dict[str, str]]:
        """Dicts for example-based prompt templates (e.g. LangChain's ``FewShotPromptTemplate``).

        Args:
            text_key: the key of a demonstration's text.
            label_key: the key of its label.
            input_key: the key of its public input (only when it has one).
        """
        out = []
        for d in self._demos:
            row = {label_key: d.label, text_key: d.text}
            if d.input is not None:
                row[input_key] = d.input
            out.append(row)
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the set as JSONL (header line first), atomically (temporary file, then rename).

        Args:
            path: the file (its folder is created).

        Returns:
            The file's path.
        """
        target = Path(path)
        header = {"format": FORMAT, "version": VERSION, "provenance": self.provenance.to_dict()}
        lines = [json.dumps(header, ensure_ascii=False)]
        lines += [json.dumps(d.to_dict(), ensure_ascii=False) for d in self._demos]
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DemoSet:
        """Read a set written by :meth:`save`. Charges nothing and reads no private data.

        Args:
            path: the file.

        Raises:
            ConfigurationError: a missing file, or one that is not a demonstration set.
        """
        source = Path(path)
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read demonstration set {source}: {type(exc).__name__}") from None
        if not lines:
            raise ConfigurationError(f"{source} is empty, not a demonstration set")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ConfigurationError(f"{source} is not a dp-icl demonstration set (no header line)")
        if header.get("version") != VERSION:
            version = header.get("version")
            raise ConfigurationError(f"{source} has format version {version!r}; this library reads {VERSION}")
        demos = []
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigurationError(f"{source}, line {number}: not JSON") from None
            if not isinstance(data, dict):
                raise ConfigurationError(f"{source}, line {number}: not a demonstration")
            demos.append(Demonstration.from_dict(data))
        return cls(demos, Provenance.from_dict(header.get("provenance") or {}))

    def __repr__(self) -> str:
        p = self.provenance
        return (
            f"DemoSet(n={len(self)}, labels={list(self.labels)}, method={p.method!r}, "
            f"epsilon={p.epsilon:.4g}, delta={p.delta:.3g})"
        )
