"""A filtered release is free only when ``covered_by`` names an earlier cover of the same filter in this ledger.

Issue 27, defect 2: 1,000 ``FilteredReleaseEvent`` s of ε ≈ 990 each were admitted at ε 0 spent, ``covered_by``
naming no entry. The ledger now checks, in the transaction of the charge, that the entry exists in this ledger,
is a filter cover (a ``<component>-filter:<owner>`` charge of the filter's (ε, δ)) for the release's component
and owner, and that one release's per-unit cost fits in it; otherwise it refuses and commits nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dp_icl_plugin import BudgetManager, ConfigurationError, PrivacyBudget, PureDPEvent
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.accountants import get_accountant
from dp_icl_plugin.accounting.individual_filter import IndividualBudget

FILTER = IndividualBudget(epsilon=2.0, delta=1e-5)
COVER = FILTER.as_event()  # what PrivateKNN charges once per index: (ε, δ) under add/remove
UNIT = ev.GaussianEvent(8.0, sensitivity=math.sqrt(2), neighbouring=ev.ADD_REMOVE)  # one use of a filtered release
HUGE = ev.GaussianEvent(0.03, neighbouring=ev.ADD_REMOVE)  # ε ≈ 700 at δ = 1e-5 for one record


def release(covered_by: int, per_unit: ev.DPEvent = UNIT) -> ev.FilteredReleaseEvent:
    return ev.FilteredReleaseEvent(per_unit, covered_by=covered_by, neighbouring=ev.ADD_REMOVE)


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> BudgetManager:
    manager = BudgetManager(PrivacyBudget(50.0, 1e-2), ledger=None if request.param == "memory" else tmp_path / "l.db")
    yield manager
    manager.close()


def refused(ledger: BudgetManager, event: ev.DPEvent, label: str, match: str) -> None:
    """``event`` is refused with a ConfigurationError, by spend and by the dry run, and nothing is committed."""
    before = ledger.history()
    with pytest.raises(ConfigurationError, match=match):
        ledger.spend(event, label=label)
    with pytest.raises(ConfigurationError, match=match):
        ledger.would_fit(event, label=label)
    assert ledger.history() == before


def test_the_issues_releases_naming_no_entry_are_refused(ledger: BudgetManager) -> None:
    huge = release(1, HUGE)
    assert get_accountant("rdp").epsilon(huge.per_unit, delta=1e-5) > 500
    refused(ledger, huge, "knn-vote:index-a", "no entry 1")
    cover = ledger.spend(COVER, label="knn-filter:index-a")
    refused(ledger, release(cover.id + 1), "knn-vote:index-a", "no entry")
    assert ledger.label_counts() == {"knn-filter:index-a": 1}


def test_a_release_naming_an_entry_of_another_kind_is_refused(ledger: BudgetManager) -> None:
    plain = ledger.spend(COVER, label="pta:synthesize")  # the same (ε, δ), but not a filter's cover
    refused(ledger, release(plain.id), "knn-vote:index-a", "not a filter cover")
    pure = ledger.spend(PureDPEvent(0.5, neighbouring="replace_one"), label="knn-filter:index-a")
    cover = ledger.spend(COVER, label="knn-filter:index-b")
    first = ledger.spend(release(cover.id), label="knn-vote:index-b")
    refused(ledger, release(first.id), "knn-vote:index-b", "not a filter cover")  # a release covers nothing
    refused(ledger, release(pure.id), "knn-vote:index-a", "not a filter cover")  # pure ε, but replace-one
    ledger.spend(release(cover.id), label="knn-vote:index-b")


def test_a_release_naming_another_filters_cover_is_refused(ledger: BudgetManager) -> None:
    cover_a = ledger.spend(COVER, label="knn-filter:index-a")
    cover_b = ledger.spend(COVER, label="knn-filter:index-b")
    refused(ledger, release(cover_a.id), "knn-vote:index-b", "another filter")
    refused(ledger, release(cover_a.id), "other-vote:index-a", "another filter")  # another component's
    refused(ledger, release(cover_a.id), "vote", "another filter")  # a label that names no owner
    refused(ledger, release(cover_a.id), "knn-filter:index-a", "another filter")  # a second cover label
    assert ledger.spend(release(cover_b.id), label="knn-classify:index-b").event.covered_by == cover_b.id


def test_a_release_costing_more_than_its_cover_is_refused(ledger: BudgetManager) -> None:
    """One release's cost per unit past the filter's whole (ε, δ): no unit could join it, or the filter was
    bypassed; either way it is not covered."""
    cover = ledger.spend(COVER, label="knn-filter:index-a")
    refused(ledger, release(cover.id, HUGE), "knn-answer:index-a", r"epsilon=\d+.* more than its cover")
    approx = ev.ApproxDPEvent(0.5, 1e-3, neighbouring=ev.ADD_REMOVE)  # its δ alone is past the cover's
    refused(ledger, release(cover.id, approx), "knn-answer:index-a", "more than its cover")
    replace = ev.GaussianEvent(8.0, neighbouring=ev.REPLACE_ONE)  # not the filter's add/remove relation
    refused(ledger, release(cover.id, replace), "knn-answer:index-a", "cannot be analysed under add_remove")
    # What a filter with this budget admits for one use fits: a unit at the cap of its best order.
    from dp_icl_plugin.retrieval.retriever import noise_for_uses

    sigma = noise_for_uses(FILTER, uses=1, sensitivity=math.sqrt(2))
    at_cap = ev.GaussianEvent(sigma / math.sqrt(2), sensitivity=math.sqrt(2), neighbouring=ev.ADD_REMOVE)
    ledger.spend(release(cover.id, at_cap), label="knn-vote:index-a")


def test_a_composition_holding_a_bad_release_commits_nothing(ledger: BudgetManager) -> None:
    cover = ledger.spend(COVER, label="knn-filter:index-a")
    paid = PureDPEvent(0.1, neighbouring=ev.ADD_REMOVE)
    refused(ledger, ev.compose(paid, release(99)), "knn-vote:index-a", "no entry 99")
    ledger.spend(ev.compose(paid, release(cover.id)), label="knn-vote:index-a")


def test_legitimate_releases_are_free_and_recorded(ledger: BudgetManager) -> None:
    cover = ledger.spend(COVER, label="knn-filter:index-a")
    spent = ledger.spent().epsilon
    for kind in ("vote", "classify", "answer") * 5:
        ledger.spend(release(cover.id), label=f"knn-{kind}:index-a")
    assert ledger.would_fit(release(cover.id))
    assert ledger.spent().epsilon == spent
    assert all(e.event.covered_by == cover.id for e in ledger.history()[1:])


def test_a_reopened_sqlite_ledger_keeps_its_covers(tmp_path: Path) -> None:
    first = BudgetManager(PrivacyBudget(10.0, 1e-4), ledger=tmp_path / "l.db")
    cover = first.spend(COVER, label="knn-filter:index-a")
    first.close()
    again = BudgetManager.open(tmp_path / "l.db")
    again.spend(release(cover.id), label="knn-vote:index-a")
    with pytest.raises(ConfigurationError, match="another filter"):
        again.spend(release(cover.id), label="knn-vote:index-b")
