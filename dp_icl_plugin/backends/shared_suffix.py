"""Next-token distributions of prompts that share a part: a common suffix (MOZO) or a common prefix (Tang's family).

DPS-MOZO's prompts at a step are ``zero-shot prompt + answer so far`` and ``record part + query + answer so
far`` for each drawn record: the query and the answer so far are common to every row. On a backend with
``next_token_logprobs_shared_suffix`` (:class:`~dp_icl_plugin.backends.hf.HFBackend`, prefix KV cache) the rows
are cut where they stop differing, the prefixes come from the cache and one forward computes the common suffix
for all rows; on any other backend the full prompts are sent. The distributions are the same either way (up to
float rounding; tests/test_backend_hf.py). Pure plumbing: no randomness, no privacy decision.

The label-conditioned synthesizers (Tang, PTA, AdaDPSyn) build each step's prompts as ``instruction + records
+ query + text so far`` beside the public ``instruction + query + text so far``: the instruction is common to
all of them and public. :func:`prefix_rows_logprobs` computes that public prefix once
(``next_token_logprobs_shared_prefix``, kept in the same cache) and only the rest of each row per step;
clip-blend synthesis opens each demonstration's session the same way (:func:`start_prefix_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin.backends.base import IncrementalSession, NextTokenBackend
from dp_icl_plugin.errors import BackendError

__all__ = [
    "common_prefix_length",
    "common_suffix_length",
    "prefix_members",
    "prefix_rows_logprobs",
    "rows_logprobs",
    "start_prefix_rows",
    "start_rows",
]


def common_suffix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many trailing tokens ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _split(rows: Sequence[list[int]], generated: list[int], capacity: int | None) -> int | None:
    """How many trailing tokens of every row (measured against the first) can be computed as one shared suffix;
    None when the rows should go whole (one row, too long for the model, or nothing shared)."""
    if len(rows) < 2 or (capacity is not None and max(map(len, rows)) + len(generated) > capacity):
        return None
    first = rows[0]
    common = min(common_suffix_length(first, r) for r in rows[1:])
    common = min(common, min(map(len, rows)) - 1)  # every row keeps a non-empty prefix
    return common if common + len(generated) > 0 else None


def start_rows(backend: NextTokenBackend, rows: Sequence[list[int]]) -> IncrementalSession:
    """An incremental session over ``rows``; their distinct prefixes from the backend's prefix KV cache when it
    has one (``start_shared_suffix``), so that a prefix recurring across sessions is computed once."""
    start_shared = getattr(backend, "start_shared_suffix", None)
    common = _split(rows, [], getattr(backend, "max_length", None)) if start_shared is not None else None
    if start_shared is None or common is None:
        return backend.start(list(rows))
    first = rows[0]
    return start_shared([r[: len(r) - common] for r in rows], list(first[len(first) - common :]))


def rows_logprobs(backend: NextTokenBackend, rows: Sequence[list[int]], generated: list[int]) -> np.ndarray:
    """Log-probabilities [len(rows), V] of each ``row + generated``; prompts longer than the model keep their end.

    The first row is the reference the common suffix is measured against (MOZO: the zero-shot prompt).
    """
    shared = getattr(backend, "next_token_logprobs_shared_suffix", None)
    capacity: int | None = getattr(backend, "max_length", None)
    common = _split(rows, generated, capacity) if shared is not None else None
    if shared is not None and common is not None:
        first = rows[0]
        suffix = list(first[len(first) - common :]) + generated
        return np.asarray(shared([r[: len(r) - common] for r in rows], suffix))

    def fit(ids: list[int]) -> list[int]:
        return ids if capacity is None or len(ids) <= capacity else ids[-capacity:]

    return backend.next_token_logprobs([fit(r + generated) for r in rows])


def prefix_members(rows: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[int]:
    """Indices of the rows that start with ``prefix`` and go on past it (none when ``prefix`` is empty)."""
    head = [int(t) for t in prefix]
    n = len(head)
    return [i for i, r in enumerate(rows) if len(r) > n and [int(t) for t in r[:n]] == head] if n else []


def prefix_rows_logprobs(backend: NextTokenBackend, rows: Sequence[list[int]], prefix: Sequence[int]) -> np.ndarray:
    """Log-probabilities [len(rows), V] of ``rows`` (token ids), ``prefix`` computed once for the rows that start
    with it (``next_token_logprobs_shared_prefix``); the other rows (PTA's base prompt, a prompt cut to the
    model's length) computed whole in the same forward. Same distributions as ``next_token_logprobs(rows)``.

    ``prefix`` must be public and fixed by the caller (the template's instruction), never read from the rows:
    it is kept in the backend's prefix cache, and a cut found from private prompts would tell the cache (and
    the timing) what the sampled records have in common. For the same reason the prefix goes through the cache
    whenever the backend has one, even when no row starts with it (a prompt cut to the model's length): what
    the cache holds and when it was used never depend on the private rows.
    """
    shared = getattr(backend, "next_token_logprobs_shared_prefix", None)
    if shared is None or len(prefix) == 0:  # decided on public inputs only, never on which rows share the prefix
        return backend.next_token_logprobs(list(rows))
    result = np.asarray(shared(list(prefix), list(rows)))
    if result.shape != (len(rows), backend.vocab_size):
        raise BackendError(f"the backend returned shape {result.shape}; expected ({len(rows)}, {backend.vocab_size})")
    return result


def start_prefix_rows(
    backend: NextTokenBackend, rows: Sequence[list[int]], prefix: Sequence[int]
) -> IncrementalSession:
    """An incremental session over ``rows`` (token ids), started as :func:`prefix_rows_logprobs` computes them
    (``start_shared_prefix``); ``backend.start(rows)`` on a backend without it. ``prefix`` as there: public."""
    start_shared = getattr(backend, "start_shared_prefix", None)
    if start_shared is None or len(prefix) == 0:  # decided on public inputs only, as there
        return backend.start(list(rows))
    session: IncrementalSession = start_shared(list(prefix), list(rows))
    return session
