"""Reading private records from CSV or JSONL files into a :class:`PrivateDataset`.

Errors name the file, the line and the column, never a cell's content (it may be private).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["load_dataset", "read_rows"]

MAX_FIELD = 1 << 24  # 16 MiB per cell: larger values are refused, not silently truncated


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    csv.field_size_limit(MAX_FIELD)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise ConfigurationError(f"{path} has no header row")
        try:
            for row in reader:
                yield reader.line_num, row
        except csv.Error as exc:
            raise ConfigurationError(f"{path}, line {reader.line_num}: malformed CSV ({exc})") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigurationError(f"{path}, line {number}: not valid JSON") from None
            if not isinstance(row, dict):
                raise ConfigurationError(f"{path}, line {number}: expected a JSON object")
            yield number, row


def read_rows(path: str | os.PathLike[str], columns: Sequence[str]) -> list[tuple[str, ...]]:
    """The given string columns of every row of a ``.csv`` or ``.jsonl``/``.json`` file (one object per line).

    Args:
        path: the file.
        columns: the columns to read, in order.

    Returns:
        One tuple of the columns' values per row (numbers read as their text).

    Raises:
        ConfigurationError: no such file, another format, malformed rows, a missing or non-text column, text that
            is not UTF-8, or no rows.
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigurationError(f"no such data file: {source}")
    suffix = source.suffix.lower()
    if suffix == ".csv":
        rows: Iterator[tuple[int, dict[str, object]]] = _csv_rows(source)  # type: ignore[assignment]
    elif suffix in (".jsonl", ".json", ".ndjson"):
        rows = _jsonl_rows(source)
    else:
        raise ConfigurationError(f"{source}: expected a .csv or .jsonl file")
    out = []
    try:
        for number, row in rows:
            values = []
            for column in columns:
                if column not in row:
                    raise ConfigurationError(f"{source}, line {number}: no column {column!r}")
                value = row[column]
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    value = str(value)  # numeric labels (e.g. 0/1) read as their text
                if not isinstance(value, str):
                    raise ConfigurationError(f"{source}, line {number}: column {column!r} is not text")
                values.append(value)
            out.append(tuple(values))
    except UnicodeDecodeError:
        raise ConfigurationError(f"{source} is not UTF-8 text") from None
    if not out:
        raise ConfigurationError(f"{source} has no data rows")
    return out


def load_dataset(
    path: str | os.PathLike[str],
    *,
    text_column: str,
    label_column: str,
    labels: Sequence[str] | None = None,
    public_label_counts: Mapping[str, int] | str | None = None,
    unit_column: str | None = None,
    **unit_settings: Any,
) -> PrivateDataset:
    """A :class:`PrivateDataset` from a CSV/JSONL file; ``labels`` is the public label set (default: the
    file's labels, sorted); ``public_label_counts`` the label sizes declared public (see ``PrivateDataset``).

    Args:
        path: a ``.csv`` or ``.jsonl`` file.
        text_column: the column of the records' texts.
        label_column: the column of their labels (stripped of surrounding whitespace).
        labels: the public label set.
        public_label_counts: the declared public label sizes, or ``"observed"``.
        unit_column: the column of each record's privacy unit (stripped; numbers read as their text), or None.
        **unit_settings: ``public_unit_counts``, ``records_per_unit``, ``labels_per_unit`` (see ``PrivateDataset``).

    Raises:
        ConfigurationError: what :func:`read_rows` or :class:`PrivateDataset` refuses.
    """
    columns = [text_column, label_column] + ([unit_column] if unit_column is not None else [])
    rows = read_rows(path, columns)
    records = (
        PrivateRecord(row[0], row[1].strip(), row[2].strip() if unit_column is not None else None) for row in rows
    )
    return PrivateDataset(records, labels=labels, public_label_counts=public_label_counts, **unit_settings)
