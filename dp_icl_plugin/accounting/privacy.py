"""Amounts of privacy: a budget to stay within, and what has been spent of it."""

from __future__ import annotations

from dataclasses import dataclass

from dp_icl_plugin import _validation as check

__all__ = ["PrivacyBudget", "PrivacySpend"]


@dataclass(frozen=True)
class PrivacyBudget:
    """A total (ε, δ) that all charges together may not exceed."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check.probability_open("delta", self.delta))


@dataclass(frozen=True)
class PrivacySpend:
    """An amount of privacy: ε at the budget's δ."""

    epsilon: float
    delta: float
