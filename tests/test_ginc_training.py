"""GINC pretraining (tiny runs), resumption, evaluation, reports and the ``dp-icl bench`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dp_icl_plugin.backends.hf import HFBackend  # noqa: E402
from dp_icl_plugin.cli import main  # noqa: E402
from dp_icl_plugin.errors import ConfigurationError  # noqa: E402
from dp_icl_plugin.ginc import default_model_path, load_model, read_metadata  # noqa: E402
from dp_icl_plugin.ginc.evaluation import AccuracyCell, evaluate_icl, to_markdown, write_report  # noqa: E402
from dp_icl_plugin.ginc.language import GincConfig, GincLanguage  # noqa: E402
from dp_icl_plugin.ginc.prompts import sample_icl_prompts  # noqa: E402
from dp_icl_plugin.ginc.training import TrainingConfig, train  # noqa: E402

TINY_RUN = TrainingConfig(
    n_layer=1,
    n_embd=16,
    n_head=2,
    seq_len=32,
    batch_size=2,
    steps=6,
    warmup_steps=1,
    n_documents=4,
    document_length=300,
    validation_documents=1,
    eval_every=2,
)
LANG = GincConfig(n_symbols=50, seed=0)


def _weights(directory: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(directory / "model.safetensors")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ginc-tiny")
    result = train(out, TINY_RUN, language=LANG, progress=False, command="test")
    assert result.finished and result.step == 6
    return out


def test_training_writes_a_loadable_model(tiny_model: Path):
    names = {p.name for p in tiny_model.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "ginc.json", "training_log.jsonl"} <= names
    assert "checkpoint" not in names  # removed once finished
    meta = read_metadata(tiny_model)
    assert meta["language"] == LANG.to_dict() and meta["training"]["steps"] == 6 and meta["command"] == "test"
    log = [json.loads(line) for line in (tiny_model / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4, 6] and all(np.isfinite(r["validation_loss"]) for r in log)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    assert model.config.n_layer == 1 and model.config.vocab_size == 50 and len(tokenizer) == 50
    assert tokenizer("a b /")["input_ids"] == [1, 2, 0] and tokenizer.eos_token_id == 0


def test_training_reduces_the_loss(tmp_path: Path):
    run = TrainingConfig(
        n_layer=1,
        n_embd=32,
        n_head=2,
        seq_len=64,
        batch_size=4,
        steps=80,
        warmup_steps=5,
        learning_rate=1e-2,
        n_documents=8,
        document_length=1000,
        validation_documents=1,
        eval_every=20,
    )
    train(tmp_path, run, language=LANG, progress=False)
    log = [json.loads(line)["validation_loss"] for line in (tmp_path / "training_log.jsonl").read_text().splitlines()]
    # an untrained model predicts near-uniformly (loss ln 50 ≈ 3.91); measured here: 3.42 → 3.26
    assert log[-1] < log[0] and log[-1] < np.log(50) - 0.5


def test_an_interrupted_run_resumes_to_identical_weights(tmp_path: Path, tiny_model: Path):
    class Stop(Exception):
        pass

    def stop_at_4(record: dict) -> None:
        if record["step"] == 4:
            raise Stop

    with pytest.raises(Stop):
        train(tmp_path, TINY_RUN, language=LANG, progress=False, on_eval=stop_at_4)
    assert (tmp_path / "checkpoint" / "state.pt").exists() and not (tmp_path / "model.safetensors").exists()
    result = train(tmp_path, TINY_RUN, language=LANG, progress=False)
    assert result.finished
    resumed, straight = _weights(tmp_path), _weights(tiny_model)
    assert resumed.keys() == straight.keys()
    assert all(np.array_equal(resumed[k], straight[k]) for k in straight)


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path):
    train(tmp_path, TINY_RUN, language=LANG, progress=False, max_minutes=1e-9)
    assert (tmp_path / "checkpoint" / "state.pt").exists()
    with pytest.raises(ConfigurationError, match="different run"):
        train(tmp_path, TrainingConfig(**{**TINY_RUN.__dict__, "n_embd": 32}), language=LANG, progress=False)


@pytest.mark.parametrize(
    "kwargs",
    [{"n_embd": 30, "n_head": 4}, {"steps": 0}, {"warmup_steps": 10}, {"seq_len": 400}, {"final_lr_fraction": 0}],
)
def test_bad_training_configs_are_refused(kwargs):
    with pytest.raises(ConfigurationError):
        TrainingConfig(**{**TINY_RUN.__dict__, **kwargs})


def test_learning_rate_schedule():
    run = TrainingConfig(steps=1000, warmup_steps=100, learning_rate=1e-3, final_lr_fraction=0.1)
    assert run.learning_rate_at(0) == pytest.approx(1e-5) and run.learning_rate_at(99) == pytest.approx(1e-3)
    assert run.learning_rate_at(550) == pytest.approx(0.55e-3) and run.learning_rate_at(1000) == pytest.approx(1e-4)


class _OracleBackend:
    """Predicts the label of every prompt evaluate_icl will draw (or that label + shift)."""

    def __init__(self, language: GincLanguage, shift: int) -> None:
        self.language, self.shift, self.vocab_size = language, shift, language.config.n_symbols
        self.answers: dict[tuple[int, ...], int] = {}
        for k in (3, 5):
            for n in (0, 2):
                p = sample_icl_prompts(language, n_prompts=30, n_shots=n, k=k, rng=np.random.default_rng([9, k, n]))
                self.answers.update({tuple(ids): int(y) for ids, y in zip(p.token_ids, p.labels, strict=True)})

    def encode(self, text: str) -> list[int]:
        return self.language.parse(text)

    def next_token_logprobs(self, prompts) -> np.ndarray:
        out = np.full((len(prompts), self.vocab_size), -10.0, dtype=np.float32)
        for row, ids in zip(out, prompts, strict=True):
            row[(self.answers[tuple(int(t) for t in ids)] + self.shift) % self.vocab_size] = 0.0
        return out


@pytest.mark.parametrize(("shift", "expected"), [(0, 1.0), (1, 0.0)])
def test_evaluation_compares_predictions_with_bayes_labels(shift, expected):
    language = GincLanguage(GincConfig(n_symbols=150, seed=0))
    cells = evaluate_icl(_OracleBackend(language, shift), language, shots=[0, 2], ks=[3, 5], n_prompts=30, seed=9)
    assert [(c.k, c.shots) for c in cells] == [(3, 0), (3, 2), (5, 0), (5, 2)]
    assert all(c.accuracy == expected and c.n_prompts == 30 for c in cells)


def test_evaluation_refuses_a_model_of_another_vocabulary(tiny_model: Path):
    backend = HFBackend.from_pretrained(tiny_model, device="cpu")
    with pytest.raises(ConfigurationError, match="150"):
        evaluate_icl(backend, GincLanguage(GincConfig(n_symbols=150)), n_prompts=5)


def test_wilson_interval_and_report(tmp_path: Path):
    cells = [AccuracyCell(10, 0, 200, 180), AccuracyCell(10, 4, 200, 190), AccuracyCell(5, 0, 200, 150)]
    low, high = cells[0].interval
    assert low < 0.9 < high and high - low == pytest.approx(0.083, abs=0.003)
    table = to_markdown(cells)
    assert "| 10 | 90.0 | 95.0 |" in table and "| 5 | 75.0 |  |" in table
    paths = write_report(cells, tmp_path, meta={"model": "m"})
    assert Path(paths["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(Path(paths["json"]).read_text())["results"][1]["accuracy"] == 0.95


def test_cli_eval_on_a_given_model(tiny_model: Path, tmp_path: Path, capsys):
    status = main(
        [
            "bench",
            "ginc-eval",
            "--model",
            str(tiny_model),
            "--shots",
            "0,1",
            "--k",
            "3",
            "--prompts",
            "20",
            "--report",
            str(tmp_path),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and set(out["accuracy"]["3"]) == {"0", "1"}
    assert all(0 <= v <= 1 for v in out["accuracy"]["3"].values())
    assert {Path(p).name for p in out["report"].values()} == {"ginc_eval.json", "ginc_eval.md", "ginc_eval.png"}


@pytest.mark.parametrize(
    "argv",
    [["--shots", "zero"], ["--shots", ""], ["--prompts", "0"], ["--model", "/nonexistent/ginc"], ["--k", "1"]],
)
def test_cli_eval_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(["bench", "ginc-eval", "--shots", "0", "--k", "3", "--prompts", "5", *argv]))
    assert exc.value.code == 2


def test_load_model_rejects_a_directory_without_metadata(tmp_path: Path):
    with pytest.raises(ConfigurationError, match=r"ginc\.json"):
        load_model(tmp_path)


def test_cli_train_then_resume(tmp_path: Path, capsys):
    args = [
        "bench",
        "ginc-train",
        "--out",
        str(tmp_path),
        "--steps",
        "4",
        "--n-layer",
        "1",
        "--n-embd",
        "16",
        "--n-head",
        "2",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--warmup-steps",
        "1",
        "--n-documents",
        "3",
        "--eval-every",
        "2",
        "--no-progress",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finished"] and out["step"] == 4 and out["tokens"] == 4 * 2 * 32
    log = (tmp_path / "training_log.jsonl").read_text()
    weights = (tmp_path / "model.safetensors").read_bytes()
    assert main(args) == 0  # the same command after it finished: nothing to train, nothing rewritten
    again = json.loads(capsys.readouterr().out)
    assert again["finished"] and again["step"] == 4 and again["validation_loss"] == out["validation_loss"]
    assert (tmp_path / "training_log.jsonl").read_text() == log
    assert (tmp_path / "model.safetensors").read_bytes() == weights


# ---------------------------------------------------------------------------- the committed model


def _ginc_eval(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "dp_icl_plugin.cli", "bench", "ginc-eval", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(proc.stdout)["accuracy"]


def test_the_committed_model_meets_the_contract():
    """The contract command: 4-shot accuracy at k = 10 well above 85% (200 prompts, seed 0), in a small file."""
    assert (default_model_path() / "model.safetensors").stat().st_size < 20 * 2**20
    accuracy = _ginc_eval("--shots", "0,4", "--k", "10", "--prompts", "200", "--seed", "0")["10"]
    assert accuracy["4"] >= 0.85


def test_the_committed_model_learns_in_context():
    """Demonstrations help: 4-shot beats 0-shot at k = 5 by ≥ 3 points and at k = 10, on 1,000 prompts per cell.

    At k = 10 the query alone nearly reveals the concept (0-shot ≈ 93%), so 200 prompts (±3.5 points) cannot
    resolve the gap there; the measured figures (README.md) are 83.6 → 90.4 at k = 5 and 92.6 → 95.4 at k = 10.
    """
    accuracy = _ginc_eval("--shots", "0,4", "--k", "5,10", "--prompts", "1000", "--seed", "0")
    assert accuracy["5"]["4"] - accuracy["5"]["0"] >= 0.03
    assert accuracy["10"]["4"] > accuracy["10"]["0"]
