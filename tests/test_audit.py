"""The statistical privacy audit: its statistics, and ``dp-icl audit --quick`` (every shipped mechanism
consistent with its claim, every broken one caught)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dp_icl_plugin.audit import cases, clopper_pearson, epsilon_lower_bound
from dp_icl_plugin.cli import main


def test_clopper_pearson_bounds() -> None:
    lo, hi = clopper_pearson(0, 100, confidence=0.95)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.05 ** (1 / 100))
    lo, hi = clopper_pearson(100, 100, confidence=0.95)
    assert hi == 1.0 and lo == pytest.approx(0.05 ** (1 / 100))
    lo, hi = clopper_pearson(50, 100, confidence=0.95)
    assert 0.41 < lo < 0.5 < hi < 0.59


def test_randomized_response_bound_is_valid_and_tight() -> None:
    # ε-randomized response: the best test proves just under ε, never more (seeded; 95 % statement).
    eps, n = 1.0, 200_000
    p = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(3)
    on_d = (rng.random(n) < p).astype(int)
    on_d_prime = (rng.random(n) < 1 - p).astype(int)
    bound, event = epsilon_lower_bound(on_d, on_d_prime, delta=0.0)
    assert 0.9 < bound <= eps and "output" in event
    same, _ = epsilon_lower_bound(on_d, (rng.random(n) < p).astype(int), delta=0.0)
    assert same < 0.05  # identical mechanisms prove (almost) nothing


def test_filter_case_halts_the_target_and_adadpsyn_case_draws_tokens() -> None:
    # The transcript audit's real row rests on the shipped filter stopping the target after its uses.
    _, cost = cases._filter_release()
    assert cases._admissions(cost) == [True] * cases._USES + [False] * (cases._RELEASES - cases._USES)
    # The AdaDPSyn sampler calls the real release_token and returns its token ids (K = 2 candidates).
    (sampler,) = cases._adadpsyn_pairs(False)
    out = sampler(False, 20, np.random.default_rng(0))
    assert out.shape == (20,) and set(out.tolist()) <= {0, 1}


@pytest.mark.slow
def test_audit_quick_passes_the_shipped_mechanisms_and_catches_the_broken_ones(capsys, tmp_path) -> None:
    status = main(["audit", "--quick", "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out)
    verdicts = {(r["mechanism"], r["variant"]): r["verdict"] for r in result["rows"]}
    assert status == 0, verdicts
    assert result["shipped_mechanisms_consistent"] and result["broken_mechanisms_caught"]
    assert len(verdicts) == 22 and (tmp_path / "audit.md").exists()
