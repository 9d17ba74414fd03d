"""The instrumentation event every DP release of these integrations emits (a charge to the shared ledger)."""

from __future__ import annotations

from llama_index.core.instrumentation.events import BaseEvent

__all__ = ["DPSpendEvent"]


class DPSpendEvent(BaseEvent):
    """A release charged to the shared ledger (and, for private kNN, to each record's own filter).

    Attributes:
        ledger_entry: the ledger's id of the charge.
        release: what was released (the ledger label, e.g. ``mozo-answer``, ``knn-answer``).
        ledger_epsilon: the ε bound on the whole ledger after this charge (LLM answers).
        per_record_epsilon, per_record_delta: each record's own budget (private kNN releases).
    """

    ledger_entry: int
    release: str
    ledger_epsilon: float | None = None
    per_record_epsilon: float | None = None
    per_record_delta: float | None = None

    @classmethod
    def class_name(cls) -> str:
        return "DPSpendEvent"
