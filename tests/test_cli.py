"""The dp-icl command: JSON contract, --human, exit statuses 0 / 2 / 3, nothing charged on bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_icl_plugin import BudgetManager
from dp_icl_plugin.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_calibrate_subsampled_gaussian_matches_pta_table4(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys,
        "calibrate",
        "subsampled-gaussian",
        "--epsilon",
        "1",
        "--delta",
        str(1 / 1600),
        "--sampling-rate",
        "0.0125",
        "--steps",
        "36",
        "--neighbouring",
        "add_remove",
        "--accountant",
        "prv",
    )
    assert code == 0
    assert out["noise_multiplier"] == pytest.approx(0.70, abs=1e-9)
    assert out["epsilon"] <= 1.0
    assert out["accountant"] == "prv" and out["neighbouring"] == "add_remove"
    # The default: replace-one, the tightest accountant (what a default ledger admits)
    code, out = run(
        capsys,
        "calibrate",
        "subsampled-gaussian",
        "--epsilon",
        "1",
        "--delta",
        str(1 / 1600),
        "--sampling-rate",
        "0.0125",
        "--steps",
        "36",
    )
    assert code == 0 and out["neighbouring"] == "replace_one" and out["accountant"] == "auto"
    assert out["noise_multiplier"] == pytest.approx(0.72, abs=1e-9)


def test_calibrate_adadpsyn_and_mozo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys,
        "calibrate",
        "adadpsyn",
        "--epsilon",
        "1",
        "--delta",
        str(1 / 120000),
        "--sampling-rate",
        str(20 / 30000),
        "--steps",
        "100",
        "--t-hat",
        "1",
        "--sigma0",
        "10",
        "--sigma2",
        "3",
    )
    assert code == 0 and out["sigma1"] == pytest.approx(1.23, abs=1e-9)
    code, out = run(
        capsys,
        "calibrate",
        "mozo",
        "--epsilon",
        "4",
        "--delta",
        str(1 / 14732),
        "--sampling-rate",
        str(4 / 14732),
        "--steps",
        "5000",
        "--order",
        "5",
    )
    assert code == 0
    assert out["rdp_target"] == pytest.approx(2.226, abs=1e-3)
    assert out["beta"] == pytest.approx(0.342, abs=1e-3)


def test_epsilon_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys,
        "epsilon",
        "clip-blend",
        "--clip",
        "10",
        "--subset-size",
        "255",
        "--temperature",
        "0.131",
        "--steps",
        "100",
        "--delta",
        "1e-5",
    )
    assert code == 0
    assert out["epsilon"] == min(out["bounds"].values())
    assert out["epsilon"] < out["epsilon_full_advanced_composition"]
    code, out = run(
        capsys,
        "epsilon",
        "subsampled-gaussian",
        "--noise-multiplier",
        "0.51",
        "--sampling-rate",
        str(20 / 30000),
        "--steps",
        "100",
        "--delta",
        str(1 / 30000),
        "--neighbouring",
        "add_remove",
    )
    assert code == 0 and 0.9 < out["epsilon"] <= 1.0
    code, replace = run(
        capsys,
        "epsilon",
        "subsampled-gaussian",
        "--noise-multiplier",
        "0.51",
        "--sampling-rate",
        str(20 / 30000),
        "--steps",
        "100",
        "--delta",
        str(1 / 30000),
    )
    assert code == 0 and out["epsilon"] < replace["epsilon"] < 1.1 and replace["neighbouring"] == "replace_one"


def test_budget_lifecycle_and_exit_codes(capsys: pytest.CaptureFixture[str], ledger_path: Path) -> None:
    led = str(ledger_path)
    assert run(capsys, "budget", "init", "--ledger", led, "--epsilon", "1", "--delta", "1e-6")[0] == 0
    code, out = run(capsys, "budget", "spend", "--ledger", led, "--pure-epsilon", "0.6", "--label", "a")
    assert code == 0 and out["committed"] is True
    code, out = run(capsys, "budget", "spend", "--ledger", led, "--pure-epsilon", "0.6", "--label", "b")
    assert code == 3 and out["error"] == "BudgetExhaustedError" and out["committed"] is False
    code, out = run(
        capsys, "budget", "spend", "--ledger", led, "--pure-epsilon", "0.1", "--delta", "1e-7", "--label", "c"
    )
    assert code == 0
    code, out = run(capsys, "budget", "show", "--ledger", led)
    assert code == 0
    assert out["events"] == 2 and out["events_per_label"] == {"a": 1, "c": 1}
    assert out["spent"]["epsilon"] == pytest.approx(0.7, rel=1e-4)
    assert out["remaining"]["epsilon"] == pytest.approx(0.3, rel=1e-3)
    assert out["neighbouring"] == "replace_one" and out["spent"]["at_delta"] == out["remaining"]["at_delta"] == 1e-6
    # --human: epsilon at the ledger's delta, to 4 digits rounded against the user (spent up, remaining down)
    assert main(["--human", "budget", "show", "--ledger", led]) == 0
    text = capsys.readouterr().out
    assert f"spent: epsilon {math.ceil(out['spent']['epsilon'] * 1e4) / 1e4:g} at delta 1e-06" in text
    assert f"remaining: epsilon {math.floor(out['remaining']['epsilon'] * 1e4) / 1e4:g} at delta 1e-06" in text
    code, out = run(capsys, "budget", "spend", "--ledger", led, "--epsilon", "0.01", "--label", "e")  # --pure-epsilon
    assert code == 0
    # an event declared under add/remove is converted (group privacy: 2ε) by the replace-one ledger
    code, out = run(
        capsys,
        "budget",
        "spend",
        "--ledger",
        led,
        "--pure-epsilon",
        "0.1",
        "--neighbouring",
        "add_remove",
        "--label",
        "d",
    )
    assert code == 0
    assert run(capsys, "budget", "show", "--ledger", led)[1]["spent"]["epsilon"] == pytest.approx(0.91, rel=1e-3)


@pytest.mark.parametrize(
    "argv",
    [
        ["budget", "spend", "--pure-epsilon", "-1", "--label", "x"],
        ["budget", "spend", "--pure-epsilon", "nan", "--label", "x"],
        ["budget", "spend", "--pure-epsilon", "inf", "--label", "x"],
        ["budget", "spend", "--pure-epsilon", "0.1", "--delta", "1.5", "--label", "x"],
        ["budget", "spend", "--pure-epsilon", "0.1", "--label", ""],
        ["budget", "init", "--epsilon", "2", "--delta", "1e-6"],  # budget changed under the ledger
    ],
)
def test_bad_input_exits_2_and_charges_nothing(
    capsys: pytest.CaptureFixture[str], ledger_path: Path, argv: list[str]
) -> None:
    BudgetManager(__import__("dp_icl_plugin").PrivacyBudget(1.0, 1e-6), ledger=ledger_path).close()
    code, out = run(capsys, *argv[:2], "--ledger", str(ledger_path), *argv[2:])
    assert code == 2 and "error" in out
    assert BudgetManager.open(ledger_path).history() == []


@pytest.mark.parametrize(
    "argv",
    [
        [
            "calibrate",
            "subsampled-gaussian",
            "--epsilon",
            "0",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.1",
            "--steps",
            "1",
        ],
        [
            "calibrate",
            "subsampled-gaussian",
            "--epsilon",
            "1",
            "--delta",
            "1",
            "--sampling-rate",
            "0.1",
            "--steps",
            "1",
        ],
        [
            "calibrate",
            "subsampled-gaussian",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "1.5",
            "--steps",
            "1",
        ],
        [
            "calibrate",
            "subsampled-gaussian",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.1",
            "--steps",
            "0",
        ],
        [
            "calibrate",
            "subsampled-gaussian",
            "--epsilon",
            "0.001",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "1",
            "--steps",
            "9",
        ],
        [
            "epsilon",
            "subsampled-gaussian",
            "--noise-multiplier",
            "-1",
            "--sampling-rate",
            "0.1",
            "--steps",
            "1",
            "--delta",
            "1e-5",
        ],
        [
            "calibrate",
            "mozo",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--sampling-rate",
            "0.1",
            "--steps",
            "5",
            "--order",
            "1",
        ],
    ],
)
def test_bad_privacy_parameters_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out = run(capsys, *argv)
    assert code == 2
    assert out["error"] in {"ConfigurationError", "CalibrationError"}


def test_corrupt_and_foreign_ledgers_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a ledger")
    code, out = run(capsys, "budget", "show", "--ledger", str(foreign))
    assert code == 2 and out["error"] == "LedgerFormatError"
    code, out = run(capsys, "budget", "show", "--ledger", str(tmp_path / "missing.db"))
    assert code == 2 and out["error"] == "LedgerError"


def test_malformed_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "subsampled-gaussian", "--epsilon", "one"])
    assert info.value.code == 2
    capsys.readouterr()


def test_human_output_before_or_after_the_subcommand(capsys: pytest.CaptureFixture[str], ledger_path: Path) -> None:
    main(["budget", "init", "--ledger", str(ledger_path), "--epsilon", "1", "--delta", "1e-6"])
    capsys.readouterr()
    for argv in (
        ["--human", "budget", "show", "--ledger", str(ledger_path)],
        ["budget", "show", "--ledger", str(ledger_path), "--human"],
    ):
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert "remaining:" in text and not text.lstrip().startswith("{")


def test_console_script_runs_as_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "dp_icl_plugin.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "calibrate" in done.stdout


_VOCAB = [
    "budget",
    "init",
    "spend",
    "show",
    "--ledger",
    "LEDGER",
    "--epsilon",
    "--delta",
    "--pure-epsilon",
    "--label",
    "--human",
    "1",
    "0.5",
    "1e-6",
    "-1",
    "0",
    "nan",
    "inf",
    "1e400",
    "x",
    "",
    "é\u0000",
    "--",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_VOCAB) | st.text(max_size=6), max_size=9))
def test_fuzzed_budget_arguments_end_in_a_status_never_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    ledger = str(tmp_path / "fuzz.db")
    argv = [ledger if a == "LEDGER" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        code = exc.code
    assert code in (0, 2, 3)
    capsys.readouterr()


def test_isolation_checks_a_local_model_and_refuses_local_options_for_a_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from tests_support import tiny_text_gpt2

    model = tiny_text_gpt2(tmp_path / "tiny", ["the cat sat on the mat", "a dog ran in the park"] * 10)
    code, out = run(
        capsys, "isolation", "--model", str(model), "--device", "cpu", "--dtype", "bfloat16", "--micro-batch-size", "4"
    )
    assert code == 0 and out["isolated"] is True and out["dtype"] == "torch.bfloat16"
    assert len(out["cases"]) == 13 and all(c["identical"] for c in out["cases"])
    code, out = run(capsys, "isolation", "--model", "http://127.0.0.1:9", "--dtype", "float32")
    assert code == 2 and "local models only" in out["message"]
