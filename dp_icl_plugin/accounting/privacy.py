"""Amounts of privacy: a budget to stay within, and what has been spent of it."""

from __future__ import annotations

from dataclasses import dataclass

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.neighbouring import DEFAULT_NEIGHBOURING, PER_RECORD, check_privacy_unit, check_relation
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["PrivacyBudget", "PrivacySpend"]


@dataclass(frozen=True)
class PrivacyBudget:
    """A total (ε, δ) that all charges together may not exceed, under one neighbouring relation.

    Attributes:
        epsilon: the guarantee's ε (positive, finite).
        delta: the guarantee's δ, in (0, 1).
        neighbouring: the pairs of datasets it compares: ``"replace_one"`` (default; see
            :mod:`~dp_icl_plugin.accounting.neighbouring` for why) or ``"add_remove"``.
        privacy_unit: what those datasets differ in: one ``"record"`` (default) or all records of one
            ``"unit"`` (a person: ``PrivateRecord(..., unit=...)``); a ledger holds charges of its unit only.

    Raises:
        ConfigurationError: a value out of range, or an unknown relation or unit.
    """

    epsilon: float
    delta: float
    neighbouring: str = DEFAULT_NEIGHBOURING
    privacy_unit: str = PER_RECORD

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check.probability_open("delta", self.delta))
        check_relation(self.neighbouring)
        check_privacy_unit(self.privacy_unit)

    @property
    def stored_relation(self) -> str:
        """The relation as a ledger store writes it: ``neighbouring``, with ``"/unit"`` appended for a unit-level
        ledger (record-level ledgers keep the form they were always stored in). :meth:`from_stored` inverts it."""
        return self.neighbouring if self.privacy_unit == PER_RECORD else f"{self.neighbouring}/{self.privacy_unit}"

    @classmethod
    def from_stored(cls, epsilon: float, delta: float, stored_relation: str) -> PrivacyBudget:
        """The budget a ledger store wrote (see :attr:`stored_relation`).

        Args:
            epsilon: the stored ε.
            delta: the stored δ.
            stored_relation: the stored relation, with its unit.

        Raises:
            ConfigurationError: the values are no valid budget.
        """
        relation, slash, unit = str(stored_relation).partition("/")
        if slash and unit == PER_RECORD:  # a record-level ledger is stored without its unit: anything else is foreign
            raise ConfigurationError(f"not a stored relation: {stored_relation!r}")
        return cls(epsilon, delta, relation, unit if slash else PER_RECORD)

    def describe(self) -> str:
        """The relation in words, for messages: ``replace_one`` or ``replace_one per unit``."""
        return self.neighbouring if self.privacy_unit == PER_RECORD else f"{self.neighbouring} per {self.privacy_unit}"


@dataclass(frozen=True)
class PrivacySpend:
    """An amount of privacy: ε at the budget's δ.

    Attributes:
        epsilon: the ε.
        delta: the δ it holds at.
    """

    epsilon: float
    delta: float
