"""Next-token distributions of prompts that differ only before a common suffix (MOZO's one-shot prompts).

DPS-MOZO's prompts at a step are ``zero-shot prompt + answer so far`` and ``record part + query + answer so
far`` for each drawn record: the query and the answer so far are common to every row. On a backend with
``next_token_logprobs_shared_suffix`` (:class:`~dp_icl_plugin.backends.hf.HFBackend`, prefix KV cache) the rows
are cut where they stop differing, the prefixes come from the cache and one forward computes the common suffix
for all rows; on any other backend the full prompts are sent. The distributions are the same either way (up to
float rounding; tests/test_backend_hf.py). Pure plumbing: no randomness, no privacy decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend

__all__ = ["common_suffix_length", "rows_logprobs"]


def common_suffix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many trailing tokens ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def rows_logprobs(backend: NextTokenBackend, rows: Sequence[list[int]], generated: list[int]) -> np.ndarray:
    """Log-probabilities [len(rows), V] of each ``row + generated``; prompts longer than the model keep their end.

    The first row is the reference the common suffix is measured against (MOZO: the zero-shot prompt).
    """
    shared = getattr(backend, "next_token_logprobs_shared_suffix", None)
    capacity: int | None = getattr(backend, "max_length", None)
    if shared is not None and len(rows) > 1 and (capacity is None or max(map(len, rows)) + len(generated) <= capacity):
        first = rows[0]
        common = min(common_suffix_length(first, r) for r in rows[1:])
        common = min(common, min(map(len, rows)) - 1)  # every row keeps a non-empty prefix
        if common + len(generated) > 0:
            suffix = list(first[len(first) - common :]) + generated
            return np.asarray(shared([r[: len(r) - common] for r in rows], suffix))

    def fit(ids: list[int]) -> list[int]:
        return ids if capacity is None or len(ids) <= capacity else ids[-capacity:]

    return backend.next_token_logprobs([fit(r + generated) for r in rows])
