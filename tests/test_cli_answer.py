"""``dp-icl answer`` end to end on a tiny model and the offline embedder: each answer charged on the ledger file
before any record is read; a kNN decoder's index kept beside it, so a second run pays no second cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("faiss")

from tests_support import tiny_text_gpt2

from dp_icl_plugin import BudgetManager
from dp_icl_plugin.cli import main
from dp_icl_plugin.errors import WeakReleaseWarning

TICKETS = [("my reset email never arrives", "check spam")] * 6 + [("the csv export is empty", "clear the filter")] * 6
CHOICES = "check spam,clear the filter"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    corpus = [f"{t} {f}" for t, f in TICKETS] * 10
    return str(tiny_text_gpt2(tmp_path_factory.mktemp("model") / "gpt2", corpus, n_positions=256))


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"text": t, "fix": f}) + "\n" for t, f in TICKETS))
    ledger = tmp_path / "ledger.db"
    assert main(["budget", "init", "--ledger", str(ledger), "--epsilon", "10", "--delta", "1e-4"]) == 0
    return data, ledger


def run(capsys, *argv: str) -> tuple[int, dict]:
    status = main(list(argv))
    return status, json.loads(capsys.readouterr().out)


def args(model: str, data: Path, ledger: Path, method: str, *extra: str) -> list[str]:
    return [
        "answer",
        "--method",
        method,
        "--model",
        model,
        "--data",
        str(data),
        "--text-column",
        "text",
        "--label-column",
        "fix",
        "--ledger",
        str(ledger),
        "--epsilon",
        "2",
        "--n-queries",
        "4",
        "--seed",
        "0",
        *extra,
    ]


def kinds(ledger: Path) -> list[str]:
    budget = BudgetManager.open(ledger)
    try:
        return [e.label.split(":")[0] for e in budget.history()]
    finally:
        budget.close()


@pytest.mark.slow  # a model and the embedder load twice: the full suite, not the unit layer
def test_knn_experts_paid_per_token_answers_among_the_choices_and_restarts_without_a_second_cover(
    tiny_model: str, files: tuple[Path, Path], capsys
) -> None:
    data, ledger = files
    argv = args(tiny_model, data, ledger, "knn-experts", "--k", "4", "--min-similarity", "0.3", "--pay-per-token")
    status, first = run(capsys, *argv, "--choices", CHOICES, "--max-tokens", "4", "the csv export is empty")
    assert status == 0 and first["answers"][0]["answer"] in CHOICES.split(",")
    status, second = run(capsys, *argv, "--choices", CHOICES, "--max-tokens", "4", "my reset email never arrives")
    assert status == 0 and second["spent_epsilon"] == first["spent_epsilon"]  # the kept index: no second cover
    assert Path(second["index"]).is_dir() and second["index"] == first["index"]  # where the records now also are
    charged = kinds(ledger)
    assert charged.count("knn-filter") == 1 and charged.count("knn-decode") >= 2


@pytest.mark.slow
def test_a_setting_the_method_does_not_take_or_a_missing_ledger_is_refused_before_any_charge(
    tiny_model: str, files: tuple[Path, Path], capsys
) -> None:
    data, ledger = files
    status, out = run(capsys, *args(tiny_model, data, ledger, "mozo", "--k", "4"), "a query")
    assert status == 2 and out["error"] == "ConfigurationError" and "takes no setting k" in out["message"]
    status, out = run(capsys, *args(tiny_model, data, ledger.with_name("none.db"), "mozo"), "a query")
    assert status == 2 and "no ledger" in out["message"]
    assert kinds(ledger) == []
    with pytest.warns(WeakReleaseWarning):  # 12 records cannot move DPS-MOZO's tokens at this share: said first
        status, out = run(capsys, *args(tiny_model, data, ledger, "mozo", "--max-tokens", "3"), "the csv export")
    assert status == 0 and kinds(ledger) == ["mozo-answer"] and len(out["answers"]) == 1


@pytest.mark.slow
def test_a_share_too_small_for_the_queries_is_refused_before_the_first_charge(
    tiny_model: str, files: tuple[Path, Path], capsys
) -> None:
    """Two queries on a share of one answer: refused whole (exit 3, nothing committed), so the first is not
    charged and then lost with the second's error."""
    data, ledger = files
    argv = args(tiny_model, data, ledger, "mozo", "--max-tokens", "3")
    argv[argv.index("--n-queries") + 1] = "1"
    status, out = run(capsys, *argv, "the csv export", "my reset email")
    assert status == 3 and out["committed"] is False and kinds(ledger) == []
