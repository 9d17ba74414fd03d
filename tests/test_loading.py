"""Reading private records from CSV/JSONL: clear errors that name the line and column, never the content."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin.data.files import load_dataset
from dp_icl_plugin.errors import ConfigurationError

SECRET = "patient 4411 has condition X"


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_csv_and_jsonl_give_the_same_dataset(tmp_path: Path) -> None:
    rows = [("first text", "a"), ("second, with a comma", "b"), ('third "quoted"', "a")]
    csv_path = _write(
        tmp_path / "d.csv", "text,label\n" + "".join(f'"{t.replace(chr(34), chr(34) * 2)}",{y}\n' for t, y in rows)
    )
    jsonl_path = _write(tmp_path / "d.jsonl", "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    for path in (csv_path, jsonl_path):
        data = load_dataset(path, text_column="text", label_column="label")
        assert data.labels == ("a", "b") and data.count("a") == 2
        assert [r.text for r in data.records("b")] == ["second, with a comma"]


def test_numeric_labels_read_as_text(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", '{"t": "x", "y": 1}\n{"t": "z", "y": 0}\n')
    assert load_dataset(path, text_column="t", label_column="y").labels == ("0", "1")


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("d.csv", f"text,label\n{SECRET},a\n", "no column 'body'"),
        ("d.jsonl", f'{{"body": "{SECRET}", "label": "a"}}\n{{"body": {SECRET!r}\n', "line 2: not valid JSON"),
        ("d.jsonl", f'["{SECRET}", "a"]\n', "line 1: expected a JSON object"),
        ("d.jsonl", f'{{"body": ["{SECRET}"], "label": "a"}}\n', "line 1: column 'body' is not text"),
        ("d.csv", "body,label\n", "no data rows"),
        ("d.csv", "", "no header row"),
        ("d.txt", SECRET, "expected a .csv or .jsonl"),
        ("d.csv", b"body,label\n\xff\xfe,a\n", "not UTF-8"),
        ("d.csv", f"body,label\n{SECRET},\n", "label"),
    ],
)
def test_bad_files_name_the_place_not_the_content(tmp_path: Path, name: str, content: str | bytes, match: str) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(ConfigurationError, match=match) as info:
        load_dataset(path, text_column="body", label_column="label")
    assert SECRET not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such data file"):
        load_dataset(tmp_path / "nope.csv", text_column="t", label_column="y")


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_end_in_a_dataset_or_a_configuration_error(
    tmp_path_factory: pytest.TempPathFactory, blob: bytes
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")
    for name in ("d.csv", "d.jsonl"):
        path = _write(directory / name, blob)
        with contextlib.suppress(ConfigurationError):
            load_dataset(path, text_column="t", label_column="y")


def test_small_refusals_are_typed_errors_not_crashes_or_silence() -> None:
    """Found by the review of issue 30: each was a KeyError, an IndexError, an endless loop or a setting ignored."""
    import numpy as np

    from dp_icl_plugin import ConfigurationError, ModelFileError
    from dp_icl_plugin.backends.gguf import named_model_file
    from dp_icl_plugin.backends.loading import load_backend
    from dp_icl_plugin.backends.public_rows import public_apart
    from dp_icl_plugin.mechanisms.mozo_mixing import project_output

    with pytest.raises(ModelFileError, match="no named model"):
        named_model_file("no-such-model")
    with pytest.raises(ConfigurationError, match="at least one row"):
        public_apart(None, [], 0, lambda part: np.zeros((len(part), 3)))
    uniform = np.log(np.full(3, 1 / 3))
    with pytest.raises(ConfigurationError, match="tolerance"):
        project_output(uniform, uniform, beta=0.5, order=8.0, tolerance=0.0)
    with pytest.raises(ConfigurationError, match="local model only"):
        load_backend("http://127.0.0.1:8000/v1", tokenizer="smollm2-135m-instruct", device="cpu")
