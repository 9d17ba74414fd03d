"""What the LlamaIndex distributions' tests share: a handler that keeps the DP spend events, and one DP LLM over the
tiny model with its ledger (built once per process)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from adapter_fixtures import backend, dataset
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.llms.dp_icl import DPICL, DPSpendEvent

from dp_icl_plugin import BudgetManager, MozoDecoder, PrivacyBudget


class Spends(BaseEventHandler):
    events: list[Any] = []  # noqa: RUF012  (a pydantic field: copied per instance)

    @classmethod
    def class_name(cls) -> str:
        return "Spends"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, DPSpendEvent):
            self.events.append(event)


@functools.cache
def llm_and_ledger() -> tuple[DPICL, BudgetManager]:
    ledger = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = MozoDecoder(dataset(), backend=backend(), budget=ledger, n_queries=100, max_tokens=6, beta=0.5, top_k=20)
    return DPICL(decoder, rng=np.random.default_rng(0)), ledger
