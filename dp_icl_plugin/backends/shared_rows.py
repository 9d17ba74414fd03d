"""Next-token distributions of prompts that share a public part: a common suffix (MOZO, clip-blend decoding) or a
common prefix (Tang's family, clip-blend synthesis).

DPS-MOZO's prompts at a step are ``zero-shot prompt + answer so far`` and ``record part + query + answer so
far`` for each drawn record: the query and the answer so far are public and common to every row. On a backend
with prefix caching (:class:`SharedSuffixBackend`, e.g. :class:`~dp_icl_plugin.backends.hf.HFBackend`) each row
that ends with that public suffix takes its part before it from the cache and computes only the suffix; on any
other backend the full prompts are sent. The distributions are the same either way (up to float rounding;
tests/test_backend_hf.py).

**The cut is public.** The suffix is fixed from public inputs only (:func:`public_suffix`: the zero-shot
prompt against a one-shot prompt of a public probe record), never read from the private rows, and each row
decides for itself, from its own tokens, whether it ends with it (:func:`suffix_members`). A cut found from
the rows (their longest common suffix) would make every row's computation depend on which records were drawn.

The label-conditioned synthesizers (Tang, PTA, AdaDPSyn) build each step's prompts as ``instruction + records
+ query + text so far`` beside the public ``instruction + query + text so far``: the instruction is common to
all of them and public. :func:`prefix_rows_logprobs` computes that public prefix once
(``next_token_logprobs_shared_prefix``, kept in the same cache) and only the rest of each row per step;
clip-blend synthesis opens each demonstration's session the same way (:func:`start_prefix_rows`).
Pure plumbing: no randomness, no privacy decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin.backends.base import (
    IncrementalSession,
    NextTokenBackend,
    SharedPrefixBackend,
    SharedSuffixBackend,
    context_limit,
)
from dp_icl_plugin.backends.public_rows import public_apart, start_apart
from dp_icl_plugin.errors import BackendError

__all__ = [
    "common_prefix_length",
    "common_suffix_length",
    "prefix_members",
    "prefix_rows_logprobs",
    "public_suffix",
    "rows_logprobs",
    "start_prefix_rows",
    "start_rows",
    "suffix_members",
]


def common_suffix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many trailing tokens ``a`` and ``b`` share.

    Args:
        a: token ids.
        b: token ids.
    """
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    Args:
        a: token ids.
        b: token ids.
    """
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def public_suffix(zero_shot: Sequence[int], probe: Sequence[int]) -> list[int]:
    """The suffix a step's rows may share: what the (public) zero-shot prompt shares at its end with a one-shot
    prompt of a public probe record, leaving each of the two at least one token before it.

    Both arguments must be public (the query in the template, and a record that is not private data).

    Args:
        zero_shot: the zero-shot prompt's token ids.
        probe: the token ids of a one-shot prompt of a public probe record.

    Returns:
        The shared suffix's token ids (empty when there is none).
    """
    n = min(common_suffix_length(zero_shot, probe), len(zero_shot) - 1, len(probe) - 1)
    return [int(t) for t in zero_shot[len(zero_shot) - n :]] if n > 0 else []


def suffix_members(rows: Sequence[Sequence[int]], suffix: Sequence[int]) -> list[int]:
    """Indices of the rows that end with ``suffix`` and have tokens before it (none when it is empty): each
    row's membership is read from that row alone.

    Args:
        rows: the prompts, as token ids.
        suffix: the public suffix.
    """
    tail = [int(t) for t in suffix]
    n = len(tail)
    return [i for i, r in enumerate(rows) if len(r) > n and [int(t) for t in r[len(r) - n :]] == tail] if n else []


def prefix_members(rows: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[int]:
    """Indices of the rows that start with ``prefix`` and go on past it (none when ``prefix`` is empty).

    Args:
        rows: the prompts, as token ids.
        prefix: the public prefix.
    """
    head = [int(t) for t in prefix]
    n = len(head)
    return [i for i, r in enumerate(rows) if len(r) > n and [int(t) for t in r[:n]] == head] if n else []


def _fit(ids: list[int], capacity: int | None) -> list[int]:
    """A prompt cut to the model's positions, keeping its end (the query and the answer so far)."""
    return ids if capacity is None or len(ids) <= capacity else ids[-capacity:]


def rows_logprobs(
    backend: NextTokenBackend,
    rows: Sequence[list[int]],
    generated: list[int],
    *,
    suffix: Sequence[int] = (),
    public: int = 0,
) -> np.ndarray:
    """Log-probabilities ``[len(rows), V]`` of each ``row + generated``, a row longer than the model cut to its
    end (each row on its own). ``suffix``: public tokens that rows may end with (:func:`public_suffix`); with
    ``generated`` appended, the rows that end with it take their part before it from the backend's prefix cache
    (same distributions). ``public``: how many leading rows are public; they go to the backend in a call of
    their own (:func:`~dp_icl_plugin.backends.public_rows.public_apart`).

    Args:
        backend: the model.
        rows: the prompts, as token ids.
        generated: the tokens generated so far, appended to every row.
        suffix: public tokens that rows may end with.
        public: how many leading rows are public.
    """
    capacity = context_limit(backend)
    prompts = [_fit([*r, *generated], capacity) for r in rows]
    tail = [*suffix, *generated]

    def compute(part: list[list[int]]) -> np.ndarray:
        if isinstance(backend, SharedSuffixBackend) and tail:
            return np.asarray(backend.next_token_logprobs_shared_suffix(part, tail))
        return np.asarray(backend.next_token_logprobs(part))

    return public_apart(backend, prompts, public, compute)


def start_rows(
    backend: NextTokenBackend, rows: Sequence[list[int]], *, suffix: Sequence[int] = (), public: int = 0
) -> IncrementalSession:
    """An incremental session over ``rows``; the rows that end with the public ``suffix`` take their part before
    it from the backend's prefix cache (``start_shared_suffix``), so a record's part recurring across sessions
    is computed once. The first ``public`` rows run in a session of their own
    (:func:`~dp_icl_plugin.backends.public_rows.start_apart`).

    Args:
        backend: the model.
        rows: the prompts, as token ids.
        suffix: public tokens that rows may end with.
        public: how many leading rows are public.
    """

    def start(part: list[list[int]]) -> IncrementalSession:
        if isinstance(backend, SharedSuffixBackend) and suffix:
            return backend.start_shared_suffix(part, list(suffix))
        return backend.start(part)

    return start_apart(backend, list(rows), public, start)


def prefix_rows_logprobs(
    backend: NextTokenBackend, rows: Sequence[list[int]], prefix: Sequence[int], *, public: int = 0
) -> np.ndarray:
    """Log-probabilities [len(rows), V] of ``rows`` (token ids), ``prefix`` computed once for the rows that start
    with it (``next_token_logprobs_shared_prefix``); the other rows (PTA's base prompt, a prompt cut to the
    model's length) computed whole. Same distributions as ``next_token_logprobs(rows)``. ``public``: how many
    leading rows are public; they go to the backend in a call of their own
    (:func:`~dp_icl_plugin.backends.public_rows.public_apart`).

    ``prefix`` must be public and fixed by the caller (the template's instruction), never read from the rows:
    it is kept in the backend's prefix cache, and a cut found from private prompts would tell the cache (and
    the timing) what the sampled records have in common. For the same reason the prefix goes through the cache
    whenever the backend has one, even when no row starts with it (a prompt cut to the model's length): what
    the cache holds and when it was used never depend on the private rows.

    Args:
        backend: the model.
        rows: the prompts, as token ids.
        prefix: the public prefix, fixed by the caller.
        public: how many leading rows are public.

    Raises:
        BackendError: the backend returned rows of the wrong shape.
    """

    def compute(part: list[list[int]]) -> np.ndarray:
        if not isinstance(backend, SharedPrefixBackend) or len(prefix) == 0:  # decided on public inputs only
            return np.asarray(backend.next_token_logprobs(part))
        result = np.asarray(backend.next_token_logprobs_shared_prefix(list(prefix), part))
        if result.shape != (len(part), backend.vocab_size):
            raise BackendError(
                f"the backend returned shape {result.shape}; expected ({len(part)}, {backend.vocab_size})"
            )
        return result

    return public_apart(backend, list(rows), public, compute)


def start_prefix_rows(
    backend: NextTokenBackend, rows: Sequence[list[int]], prefix: Sequence[int], *, public: int = 0
) -> IncrementalSession:
    """An incremental session over ``rows`` (token ids), started as :func:`prefix_rows_logprobs` computes them
    (``start_shared_prefix``); ``backend.start(rows)`` on a backend without it. ``prefix`` and ``public`` as
    there.

    Args:
        backend: the model.
        rows: the prompts, as token ids.
        prefix: the public prefix, fixed by the caller.
        public: how many leading rows are public.
    """

    def start(part: list[list[int]]) -> IncrementalSession:
        if not isinstance(backend, SharedPrefixBackend) or len(prefix) == 0:  # decided on public inputs only
            return backend.start(part)
        return backend.start_shared_prefix(list(prefix), part)

    return start_apart(backend, list(rows), public, start)
