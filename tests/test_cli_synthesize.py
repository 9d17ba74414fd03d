"""``dp-icl synthesize`` end to end on the committed GINC model: charge first, then a DemoSet file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests_support import write_ginc_csv

from dp_icl_plugin import BudgetManager, DemoSet
from dp_icl_plugin.cli import main
from dp_icl_plugin.ginc import GincConfig, GincLanguage

ARGS = [
    "--method",
    "pta",
    "--text-column",
    "text",
    "--label-column",
    "concept",
    "--model",
    "ginc",
    "--template",
    "ginc",
    "--n-prompts",
    "5",
    "--records-per-prompt",
    "4",
    "--max-tokens",
    "10",
    "--shots-per-label",
    "2",
    "--top-k",
    "10",
    "--alpha",
    "2",
    "--seed",
    "0",
    "--public-label-counts",
    "observed",
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ginc_csv(tmp_path_factory.mktemp("data") / "ginc.csv", label_column="concept")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    status = main(argv)
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_synthesize_charges_then_writes_demonstrations(data_file: Path, tmp_path: Path, capsys) -> None:
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    status, result = _run(
        [
            "synthesize",
            *ARGS,
            "--data",
            str(data_file),
            "--epsilon",
            "4",
            "--ledger",
            str(ledger),
            "--budget-epsilon",
            "5",
            "--budget-delta",
            "0.01",
            "--out",
            str(out),
        ],
        capsys,
    )
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


def test_synthesize_needs_declared_label_sizes_and_an_add_remove_ledger_for_adadpsyn_refuses(
    data_file: Path, tmp_path: Path, capsys
) -> None:
    argv = [a for a in ARGS if a not in ("--public-label-counts", "observed")]
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    code = main(
        [
            "synthesize",
            *argv,
            "--data",
            str(data_file),
            "--epsilon",
            "4",
            "--ledger",
            str(ledger),
            "--budget-epsilon",
            "5",
            "--budget-delta",
            "0.01",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    # the command line's flag, not the Python argument (public_label_counts=) the library's message names
    assert code == 2 and "--public-label-counts" in captured.out and not out.exists()
    assert "public_label_counts" not in captured.out + captured.err
    code = main(
        [
            "synthesize",
            *argv,
            "--data",
            str(data_file),
            "--epsilon",
            "4",
            "--ledger",
            str(ledger),
            "--budget-epsilon",
            "5",
            "--budget-delta",
            "0.01",
            "--public-label-counts",
            "c0=3,c1=500",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 2 and "label 'c0' has declared size 3" in captured.err  # which label, by its (public) name
    assert "--n-prompts × --records-per-prompt = 20" in captured.err
    code = main(
        [
            "synthesize",
            "--method",
            "adadpsyn",
            "--text-column",
            "text",
            "--label-column",
            "concept",
            "--model",
            "ginc",
            "--template",
            "ginc",
            "--public-label-counts",
            "observed",
            "--data",
            str(data_file),
            "--epsilon",
            "4",
            "--ledger",
            str(tmp_path / "ar.db"),
            "--budget-epsilon",
            "5",
            "--budget-delta",
            "0.01",
            "--neighbouring",
            "add_remove",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and "replace-one" in capsys.readouterr().out and not out.exists()
    assert not (tmp_path / "ar.db").exists()  # refused while planning, before the ledger is even created


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (["--epsilon", "4"], 2),  # no ledger and no budget to create one
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--text-column", "nope"], 2),
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--method", "tang"], 2),  # --alpha
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--generate-for", "c9"], 2),
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--template", "nope"], 2),
        (["--epsilon", "4", "--budget-epsilon", "1", "--budget-delta", "0.01"], 3),  # cannot afford ε = 4
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--public-label-counts", "c0=9"], 2),
        (["--epsilon", "4", "--budget-epsilon", "5", "--budget-delta", "0.01", "--public-label-counts", "c0=x"], 2),
    ],
)
def test_bad_input_and_refusals_charge_nothing(
    data_file: Path, tmp_path: Path, capsys, extra: list[str], status: int
) -> None:
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
    code = main(
        [
            "synthesize",
            *ARGS,
            "--data",
            str(bad),
            "--epsilon",
            "1",
            "--ledger",
            str(tmp_path / "l.db"),
            "--budget-epsilon",
            "2",
            "--budget-delta",
            "0.01",
            "--out",
            str(tmp_path / "o.jsonl"),
        ]
    )
    assert code == 2 and "csv" in capsys.readouterr().out


@pytest.mark.parametrize(
    "method_args",
    [
        [
            "--method",
            "adadpsyn",
            "--template",
            "ginc",
            "--n-prompts",
            "5",
            "--records-per-prompt",
            "4",
            "--max-tokens",
            "3",
            "--top-k",
            "10",
            "--lam",
            "0.2",
        ],
        ["--method", "clip-blend", "--template", "ginc", "--max-tokens", "3", "--clip", "10"],
    ],
    ids=["adadpsyn", "clip-blend"],
)
def test_other_synthesis_methods(data_file: Path, tmp_path: Path, capsys, method_args: list[str]) -> None:
    out = tmp_path / "demos.jsonl"
    common = [
        "--text-column",
        "text",
        "--label-column",
        "concept",
        "--model",
        "ginc",
        "--seed",
        "1",
        "--public-label-counts",
        "observed",
    ]
    status, result = _run(
        [
            "synthesize",
            *common,
            *method_args,
            "--data",
            str(data_file),
            "--epsilon",
            "8",
            "--ledger",
            str(tmp_path / "l.db"),
            "--budget-epsilon",
            "8",
            "--budget-delta",
            "0.01",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert status == 0, result
    assert result["method"] == method_args[1].replace("-", "_") and result["demonstrations"] == 2
    assert 0 < result["epsilon"] <= 8 and DemoSet.load(out).provenance.ledger_entry_id == 1


@pytest.mark.parametrize(
    "method_args",
    [["mozo-offline", "--order", "8"], ["tang-answers", "--n-prompts", "4", "--population", "100"]],
)
def test_methods_that_answer_public_inputs(data_file: Path, tmp_path: Path, capsys, method_args: list[str]) -> None:
    language = GincLanguage(GincConfig())
    queries = tmp_path / "inputs.txt"
    queries.write_text("\n".join(language.render(range(1, 10)) for _ in range(2)) + "\n")
    rows = [line.split(",") for line in data_file.read_text().splitlines()[1:]]
    qa = tmp_path / "qa.csv"
    with qa.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["input", "output"])
        for text, _ in rows:
            words = text.split()
            writer.writerow([" ".join(words[:-1]), words[-1]])
    out = tmp_path / "demos.jsonl"
    status, result = _run(
        [
            "synthesize",
            "--method",
            method_args[0],
            "--data",
            str(qa),
            "--text-column",
            "input",
            "--label-column",
            "output",
            "--labels",
            ",".join(language.vocab),
            "--public-inputs",
            str(queries),
            "--model",
            "ginc",
            "--template",
            "ginc",
            "--max-tokens",
            "1",
            "--top-k",
            "10",
            *method_args[1:],
            "--epsilon",
            "2",
            "--ledger",
            str(tmp_path / "l.db"),
            "--budget-epsilon",
            "2",
            "--budget-delta",
            "0.001",
            "--out",
            str(out),
            "--seed",
            "0",
        ],
        capsys,
    )
    assert status == 0, result
    demos = DemoSet.load(out)
    assert [d.input for d in demos] == [language.render(range(1, 10))] * 2
    assert all(len(d.token_ids) == 1 for d in demos) and result["epsilon"] <= 2
    assert demos.provenance.method == method_args[0].replace("-", "_")
    code = main(
        [
            "synthesize",
            "--method",
            "pta",
            "--data",
            str(qa),
            "--text-column",
            "input",
            "--label-column",
            "output",
            "--public-inputs",
            str(queries),
            "--model",
            "ginc",
            "--epsilon",
            "1",
            "--ledger",
            str(tmp_path / "l.db"),
            "--out",
            str(tmp_path / "x.jsonl"),
        ]
    )
    assert code == 2 and "mozo-offline" in capsys.readouterr().out


@pytest.mark.parametrize(
    "where",
    [
        ["--server", "http://127.0.0.1:9"],  # no --tokenizer
        ["--model", "ginc", "--tokenizer", "x"],  # --tokenizer is for --server
        ["--server", "http://10.1.2.3:8000", "--tokenizer", "x"],  # plain http off-host
        ["--server", "http://127.0.0.1:9", "--tokenizer", "ginc-missing"],
    ],
)
def test_server_options_are_checked_before_anything_is_charged(
    data_file: Path, tmp_path: Path, capsys, where: list[str]
) -> None:
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    at = ARGS.index("--model")
    args = ARGS[:at] + ARGS[at + 2 :]
    code = main(
        [
            "synthesize",
            *args,
            *where,
            "--data",
            str(data_file),
            "--ledger",
            str(ledger),
            "--out",
            str(out),
            "--epsilon",
            "4",
            "--budget-epsilon",
            "5",
            "--budget-delta",
            "0.01",
        ]
    )
    capsys.readouterr()
    assert code != 0 and not out.exists()
    if ledger.exists():
        budget = BudgetManager.open(ledger)
        assert budget.history() == []
        budget.close()


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_progress_off_a_terminal_and_an_interrupt_after_the_charge_are_reported(
    data_file: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dp-icl synthesize ran 15 minutes silent off a terminal, and Ctrl-C lost the charge without a word
    ledger, out = tmp_path / "l.db", tmp_path / "demos.jsonl"
    argv = [
        "synthesize",
        *ARGS,
        "--data",
        str(data_file),
        "--epsilon",
        "4",
        "--ledger",
        str(ledger),
        "--budget-epsilon",
        "9",
        "--budget-delta",
        "0.01",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "pta synthesis: 0/40 tokens (0 %), 0 s started" in err and "pta synthesis: 40/40 tokens (100 %)" in err
    assert main([*argv, "--no-progress"]) == 0 and "synthesis" not in capsys.readouterr().err
    from dp_icl_plugin import PTASynthesizer

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(PTASynthesizer, "_generate", interrupted)
    out.unlink()
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    budget = BudgetManager.open(ledger)
    history = budget.history()
    budget.close()
    entry = history[-1]
    assert len(history) == 3 and entry.label == "pta:synthesize"  # charged before _generate ran
    err = capsys.readouterr().err
    assert f"interrupted after the charge: ledger entry {entry.id} (pta:synthesize) stands, never refunded" in err
    assert not out.exists()


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_a_unit_column_makes_a_unit_level_ledger_and_run(data_file: Path, tmp_path: Path, capsys) -> None:
    rows = data_file.read_text().splitlines()
    with_units = tmp_path / "units.csv"
    # 200 records, 40 units of 5 (each unit's records in one concept)
    with_units.write_text("\n".join([rows[0] + ",person"] + [f"{r},p{i // 5}" for i, r in enumerate(rows[1:])]) + "\n")
    ledger, out = tmp_path / "u.db", tmp_path / "demos.jsonl"
    common = ["synthesize", *ARGS, "--data", str(with_units), "--epsilon", "4", "--ledger", str(ledger), "--out"]
    budget = ["--budget-epsilon", "5", "--budget-delta", "0.01"]
    code = main([*common, str(out), *budget, "--unit-column", "person"])  # a unit-level run needs unit counts
    assert code != 0 and "--public-unit-counts" in capsys.readouterr().err and not ledger.exists()
    units = ["--unit-column", "person", "--public-unit-counts", "observed", "--labels-per-unit", "1"]
    status, result = _run([*common, str(out), *budget, *units], capsys)
    assert status == 0 and result["parameters"]["privacy_unit"] == "unit"
    assert result["parameters"]["labels_charged"] == 1
    opened = BudgetManager.open(ledger)
    assert opened.privacy_unit == "unit" and opened.history()[0].event.privacy_unit == "unit"
    opened.close()
    code = main([*common, str(tmp_path / "again.jsonl")])  # the unit-level ledger refuses a run without units
    assert code != 0 and "--unit-column" in capsys.readouterr().err
