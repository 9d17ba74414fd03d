"""``dp-icl synthesize`` end to end on the committed GINC model: charge first, then a DemoSet file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from dp_icl_plugin import BudgetManager
from dp_icl_plugin.cli import main
from dp_icl_plugin.ginc import GincConfig, GincLanguage
from dp_icl_plugin.ginc.prompts import pta_split
from dp_icl_plugin.methods import DemoSet

ARGS = ["--method", "pta", "--text-column", "text", "--label-column", "concept", "--model", "ginc",
        "--template", "ginc", "--n-prompts", "5", "--records-per-prompt", "4", "--max-tokens", "10",
        "--shots-per-label", "2", "--top-k", "10", "--alpha", "2", "--seed", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    language = GincLanguage(GincConfig())
    split = pta_split(language, n_train=100, n_test=1, rng=np.random.default_rng(0))
    path = tmp_path_factory.mktemp("data") / "ginc.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "concept"])
        for concept in (0, 1):
            for ex in split[concept][0]:
                writer.writerow([language.render([*ex.tokens, ex.label]), f"c{concept}"])
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    status = main(argv)
    return status, json.loads(capsys.readouterr().out)


def test_synthesize_charges_then_writes_demonstrations(data_file: Path, tmp_path: Path, capsys) -> None:
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    status, result = _run(["synthesize", *ARGS, "--data", str(data_file), "--epsilon", "4", "--ledger", str(ledger),
                           "--budget-epsilon", "5", "--budget-delta", "0.01", "--out", str(out)], capsys)  # fmt: skip
    assert status == 0
    assert result["demonstrations"] == 4 and result["labels"] == ["c0", "c1"]
    assert result["epsilon"] <= 4 and result["spent_epsilon"] == pytest.approx(result["epsilon"])
    demos = DemoSet.load(out)
    assert len(demos) == 4 and all(len(d.token_ids) == 10 for d in demos)
    assert demos.provenance.ledger_entry_id == result["ledger_entry"]
    budget = BudgetManager.open(ledger)
    assert [e.label for e in budget.history()] == ["pta:synthesize"]
    budget.close()
    # the private file's text never reaches the output
    secret = data_file.read_text().splitlines()[1].split(",")[0]
    assert secret not in json.dumps(result)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (["--epsilon", "4"], 2),  # no ledger and no budget to create one
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--text-column", "nope"], 2),
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--method", "tang"], 2),  # --alpha
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--generate-for", "c9"], 2),
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--template", "nope"], 2),
        (["--epsilon", "4", "--budget-epsilon", "1", "--budget-delta", "0.01"], 3),  # cannot afford ε = 4
    ],
)
def test_bad_input_and_refusals_charge_nothing(data_file: Path, tmp_path: Path, capsys, extra: list[str],
                                               status: int) -> None:  # fmt: skip
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    code = main(["synthesize", *ARGS, "--data", str(data_file), "--ledger", str(ledger), "--out", str(out), *extra])
    capsys.readouterr()
    assert code == status and not out.exists()
    if ledger.exists():
        budget = BudgetManager.open(ledger)
        assert budget.history() == []
        budget.close()


def test_unreadable_data_is_bad_input(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "data.txt"
    bad.write_text("hello")
    code = main(["synthesize", *ARGS, "--data", str(bad), "--epsilon", "1", "--ledger", str(tmp_path / "l.db"),
                 "--budget-epsilon", "2", "--budget-delta", "0.01", "--out", str(tmp_path / "o.jsonl")])  # fmt: skip
    assert code == 2 and "csv" in capsys.readouterr().out
