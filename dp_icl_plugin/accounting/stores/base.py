"""The ledger store interface: what the budget manager needs from durable storage.

A store keeps the budget it was created with and an append-only list of charges. The one operation that
matters for safety is :meth:`LedgerStore.transaction`: an exclusive section, across threads *and*
processes (and hosts, for a server store), in which the manager reads the grouped spend, decides, and
appends; it commits on normal exit and rolls back on an exception. Inside it the manager can also look up
a committed entry (:meth:`LedgerTransaction.entry`: the cover a filtered release names). A server database
(PostgreSQL with a row lock or a serializable transaction) implements the same methods and needs no change
to the manager.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from dp_icl_plugin.accounting.privacy import PrivacyBudget
from dp_icl_plugin.errors import BudgetMismatchError, LedgerCorruptError, LedgerError

__all__ = ["OLD_SCHEMA_HINT", "LedgerRow", "LedgerStore", "LedgerTransaction", "stored_budget"]

OLD_SCHEMA_HINT = (
    " (schema 1 predates neighbouring relations: its charges mixed add/remove and replace-one analyses and "
    "cannot be re-analysed under one; start a new ledger and carry the old spend over as a declared event)"
)
"""Why a schema-1 ledger (before neighbouring relations) is refused, for the error message."""


def stored_budget(
    epsilon: object, delta: object, neighbouring: object, *, given: PrivacyBudget | None, where: str
) -> PrivacyBudget:
    """The budget a ledger holds (``epsilon``, ``delta``, ``neighbouring`` as read back), checked against ``given``.

    Args:
        epsilon: the stored ε.
        delta: the stored δ.
        neighbouring: the stored relation (with its privacy unit: :attr:`PrivacyBudget.stored_relation`).
        given: the budget the caller expects, or None.
        where: the ledger, for messages.

    Raises:
        LedgerCorruptError: the stored values are not a valid budget.
        BudgetMismatchError: ``given`` is not the stored budget (a ledger keeps the budget it was made with).
    """
    try:
        stored = PrivacyBudget.from_stored(float(epsilon), float(delta), neighbouring)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # ConfigurationError is a ValueError: an invalid stored budget
        raise LedgerCorruptError(f"{where} has no valid budget record") from None
    if given is not None and given != stored:
        raise BudgetMismatchError(
            f"{where} was created with epsilon={stored.epsilon}, delta={stored.delta} under "
            f"{stored.describe()}; refusing to use it with epsilon={given.epsilon}, delta={given.delta} "
            f"under {given.describe()}"
        )
    return stored


@dataclass(frozen=True)
class LedgerRow:
    """One committed charge as stored: the event in canonical JSON (``events.event_key``).

    Attributes:
        id: the entry's id (increasing in commit order).
        timestamp: commit time, seconds since the epoch (UTC).
        label: which component and call it was for.
        event_key: the event's canonical JSON.
        certified_epsilon: the ε bound on the whole ledger that admitted it.
    """

    id: int
    timestamp: float
    label: str
    event_key: str
    certified_epsilon: float


class LedgerTransaction(ABC):
    """Inside :meth:`LedgerStore.transaction`: read the grouped spend and committed entries, append one charge."""

    @abstractmethod
    def event_counts(self) -> Counter[str]:
        """Number of committed charges per distinct event key."""

    def entry(self, entry_id: int) -> LedgerRow | None:
        """The committed entry ``entry_id`` of this ledger, or None (e.g. the cover a filtered release names).

        Stores written before filtered releases existed may not override it: such a store cannot hold them.

        Args:
            entry_id: an entry's id.

        Raises:
            LedgerError: this store cannot look up entries.
        """
        raise LedgerError(
            f"{type(self).__name__} cannot look up an entry, so it cannot check a filtered release's cover"
        )

    @abstractmethod
    def append(self, *, timestamp: float, label: str, event_key: str, certified_epsilon: float) -> int:
        """Record a charge; returns its id. Durable once the transaction commits.

        Args:
            timestamp: commit time, seconds since the epoch.
            label: which component and call it is for.
            event_key: the event's canonical JSON.
            certified_epsilon: the ε bound on the whole ledger after it.
        """


class LedgerStore(ABC):
    """Durable, exclusive-access storage of one budget and its charges."""

    @abstractmethod
    def initialize(self, budget: PrivacyBudget | None) -> PrivacyBudget:
        """Create the ledger with ``budget`` or open the existing one and check that ``budget`` matches.

        Args:
            budget: the budget, or None to open an existing ledger.

        Returns:
            The ledger's budget.

        Raises:
            BudgetMismatchError: the ledger exists with another budget.
            LedgerError: no ledger exists and no budget was given, or the storage is unusable.
        """

    @abstractmethod
    def transaction(self) -> AbstractContextManager[LedgerTransaction]:
        """An exclusive check-and-commit section (commit on exit, roll back on exception)."""

    @abstractmethod
    def rows(self) -> Iterator[LedgerRow]:
        """All committed charges in commit order."""

    @abstractmethod
    def event_counts(self) -> Counter[str]:
        """Committed charges per distinct event key (a consistent snapshot)."""

    @property
    def name(self) -> str | None:
        """The ledger's name within its store, where one store holds several (PostgreSQL); else None."""
        return None

    @property
    def location(self) -> str | os.PathLike[str] | None:
        """Where the ledger lives, for state kept beside it (a file's path, a ``postgresql://`` URL); None when
        it has no place another process could reopen (memory, or a store that does not say)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook; stores without resources need not override it
        """Release resources (idempotent)."""
