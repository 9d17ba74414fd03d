"""Amounts of privacy: a budget to stay within, and what has been spent of it."""

from __future__ import annotations

from dataclasses import dataclass

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.neighbouring import DEFAULT_NEIGHBOURING, check_relation

__all__ = ["PrivacyBudget", "PrivacySpend"]


@dataclass(frozen=True)
class PrivacyBudget:
    """A total (ε, δ) that all charges together may not exceed, under one neighbouring relation.

    Attributes:
        epsilon: the guarantee's ε (positive, finite).
        delta: the guarantee's δ, in (0, 1).
        neighbouring: the pairs of datasets it compares: ``"replace_one"`` (default; see
            :mod:`~dp_icl_plugin.accounting.neighbouring` for why) or ``"add_remove"``.

    Raises:
        ConfigurationError: a value out of range, or an unknown relation.
    """

    epsilon: float
    delta: float
    neighbouring: str = DEFAULT_NEIGHBOURING

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check.probability_open("delta", self.delta))
        check_relation(self.neighbouring)


@dataclass(frozen=True)
class PrivacySpend:
    """An amount of privacy: ε at the budget's δ.

    Attributes:
        epsilon: the ε.
        delta: the δ it holds at.
    """

    epsilon: float
    delta: float
