"""PRV results are checked against exact compositions computed independently.

prv-accountant 0.2.0 sizes its truncation domain with an RDP bound for pure DP that is too small, which
made it report ε ≈ 13 for 64 × 5-DP (truth > 250). The k-fold composition of ε0-DP has the exact privacy
profile of k-fold randomized response (Kairouz, Oh & Viswanath 2015), a binomial sum computed here.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import get_accountant, prv


def rr_delta(k: int, eps0: float, eps: float) -> float:
    p = 1.0 / (1.0 + math.exp(-eps0))
    q = 1.0 / (1.0 + math.exp(eps0))
    total = 0.0
    for b in range(k + 1):
        if (2 * b - k) * eps0 > eps:
            log_y = math.log(math.comb(k, b)) + b * math.log(p) + (k - b) * math.log(q)
            log_x = math.log(math.comb(k, b)) + b * math.log(q) + (k - b) * math.log(p)
            total += math.exp(log_y) - math.exp(eps + log_x)
    return max(total, 0.0)


def rr_epsilon(k: int, eps0: float, delta: float) -> float:
    lo, hi = 0.0, k * eps0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if rr_delta(k, eps0, mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize(("eps0", "k"), [(0.25, 17), (1.0, 17), (1.0, 64), (5.0, 17), (5.0, 64), (10.0, 17)])
def test_prv_pure_dp_composition_is_never_below_the_exact_value(eps0: float, k: int) -> None:
    delta = 1e-5
    exact = rr_epsilon(k, eps0, delta)
    lower, upper = prv.prv_bounds(Counter({ev.PureDPEvent(eps0, neighbouring="add_remove"): k}), delta)
    assert upper >= exact - 1e-9, f"PRV certified {upper} below the exact {exact}"
    if math.isfinite(upper):
        assert upper - exact <= 0.03  # eps_error 0.01 plus discretisation
        assert lower <= exact + 1e-9


@pytest.mark.parametrize(("eps0", "k"), [(5.0, 64), (10.0, 64), (40.0, 64)])
def test_the_tightest_answer_stays_valid_where_prv_gives_up(eps0: float, k: int) -> None:
    event = ev.SelfComposedEvent(ev.ExponentialMechanismEvent(eps0, neighbouring="add_remove"), k)
    pure = ev.SelfComposedEvent(ev.PureDPEvent(eps0, neighbouring="add_remove"), k)
    auto = get_accountant("auto")
    assert auto.epsilon(pure, delta=1e-5) >= rr_epsilon(k, eps0, 1e-5) - 1e-9
    # Beyond PRV's domain the answer comes from PLD, basic composition or RDP: never above the last two.
    fallback = min(get_accountant(name).epsilon(event, delta=1e-5) for name in ("basic", "rdp"))
    assert auto.epsilon(event, delta=1e-5) <= fallback
    assert auto.epsilon(event, delta=1e-5) <= auto.epsilon(pure, delta=1e-5)
