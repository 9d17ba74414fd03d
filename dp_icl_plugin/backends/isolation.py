"""The row-isolation check: is a row the same bits whatever shares its batch and whatever the cache holds?

Every DP analysis here treats a prompt's next-token distribution as a function of that prompt alone (a record's
one-shot row, a shard's answer) or as public (the zero-shot row). :func:`check_row_isolation` computes target rows in
many company: alone, beside a short and a long row, in either order, among more rows than a micro-batch holds,
at a bucket edge among a full batch of its own length, a 48-token row repeated (a server's prefix cache keeps
whole blocks), inside incremental sessions step after step (also crossing bucket edges), and through the
backend's prefix cache (cold, warm, and filled beside other prefixes), and compares the bits. Any difference
is a failure: a neighbouring dataset changes a batch-mate, so it would change the row.

Only public, made-up token ids are used (random ids from a seeded generator), so the check is safe to run on a
production backend; it never clears a cache it did not fill (the prefixes are fresh random ids). Run it on
every device and dtype a deployment uses (``dp-icl isolation``): kernels are chosen per device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin.backends.base import (
    IncrementalSession,
    NextTokenBackend,
    SharedPrefixBackend,
    SharedSuffixBackend,
    context_limit,
)

__all__ = ["IsolationCase", "IsolationReport", "check_row_isolation"]


@dataclass(frozen=True)
class IsolationCase:
    """One comparison: the target row computed two ways (``reference`` and ``variant``).

    Attributes:
        name: what the second way changes.
        max_abs_diff: the largest absolute difference between the two rows (0: the same bits).
    """

    name: str
    max_abs_diff: float

    @property
    def identical(self) -> bool:
        """Whether the two rows had the same bits."""
        return self.max_abs_diff == 0.0


@dataclass(frozen=True)
class IsolationReport:
    """Every case of one run of :func:`check_row_isolation`.

    Attributes:
        backend: the backend checked (its repr).
        cases: the comparisons.
    """

    backend: str
    cases: tuple[IsolationCase, ...]

    @property
    def isolated(self) -> bool:
        """True when every case gave the same bits."""
        return all(c.identical for c in self.cases)

    def __str__(self) -> str:
        lines = [f"row isolation of {self.backend}: {'isolated' if self.isolated else 'NOT ISOLATED'}"]
        lines += [f"  {'ok  ' if c.identical else 'FAIL'} {c.name}: max |Δ| = {c.max_abs_diff:.3g}" for c in self.cases]
        return "\n".join(lines)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    same = (a == b) | (np.isneginf(a) & np.isneginf(b))
    return 0.0 if same.all() else float(np.max(np.abs(np.where(same, 0.0, a - b))))


def check_row_isolation(
    backend: NextTokenBackend, *, seed: int = 0, steps: int = 3, target_length: int = 11, long_length: int = 60
) -> IsolationReport:
    """Compute a target row in different company and cache histories and compare the bits.

    Args:
        backend: any backend; the prefix-cache cases run where it has the capability.
        seed: the generator of the (public, random) token ids.
        steps: tokens appended in the session cases.
        target_length: the target row's length (capped at the model's positions).
        long_length: the length of its long batch-mate (capped likewise).

    Returns:
        The report; ``report.isolated`` is the verdict.
    """
    rng = np.random.default_rng(seed)
    vocab = backend.vocab_size
    capacity = context_limit(backend)
    room = (capacity - steps - 2) if capacity is not None else long_length + 40
    long_length = max(2, min(long_length, room))
    target_length = max(2, min(target_length, long_length - 1))

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(1, vocab, size=n)]

    target, short, long = ids(target_length), ids(2), ids(long_length)
    crowd = [ids(int(n)) for n in rng.integers(1, long_length, size=19)]  # more rows than a micro-batch holds
    cases: list[IsolationCase] = []

    def row(prompts: Sequence[list[int]], at: int) -> np.ndarray:
        return np.asarray(backend.next_token_logprobs(list(prompts)))[at]

    alone = row([target], 0)
    cases.append(IsolationCase("beside a short and a long row", _diff(alone, row([short, target, long], 1))))
    edge = ids(16)  # a row at a bucket edge, among 31 of its length (full micro-batches with no padding at all,
    # if widths were not strictly above the rows: then the kernels would drop the mask for those batches only)
    peers = [ids(16) for _ in range(31)]
    among = row([*peers[:15], edge, *peers[15:]], 15)
    cases.append(IsolationCase("a 16-token row alone and among 31 of its length", _diff(row([edge], 0), among)))
    longer = ids(min(48, room))  # three 16-token blocks: a server's prefix cache keeps whole blocks
    first = row([longer], 0)
    again = max(_diff(first, row([longer], 0)), _diff(first, row([short, longer, target], 1)))
    cases.append(IsolationCase("a 48-token row, again (a server's cache) and beside short rows", again))
    cases.append(IsolationCase("the same, in the other order", _diff(alone, row([long, target, short], 1))))
    cases.append(IsolationCase("among 19 rows of many lengths", _diff(alone, row([*crowd[:9], target, *crowd[9:]], 9))))
    cases.append(IsolationCase("beside copies of itself", _diff(alone, row([target, target, target], 2))))

    def session_rows(start: Callable[[list[list[int]]], IncrementalSession], prompts: list[list[int]], at: int):
        appended = [int(t) for t in np.random.default_rng(seed + 1).integers(1, vocab, size=steps)]
        with start(prompts) as session:
            out = [session.logprobs[at]]
            for token in appended:
                out.append(session.append(token)[at])
        return np.stack(out)

    session_alone = session_rows(backend.start, [target], 0)
    for name, prompts, at in (
        ("a session beside a short and a long row", [short, target, long], 1),
        ("a session among 19 rows", [*crowd[:9], target, *crowd[9:]], 9),
    ):
        cases.append(IsolationCase(name, _diff(session_alone, session_rows(backend.start, prompts, at))))
    crossing, mate = ids(15), ids(31)  # both cross a bucket edge (16, 32) as they grow
    cases.append(
        IsolationCase(
            "a session crossing a bucket edge, beside a mate crossing another",
            _diff(session_rows(backend.start, [crossing], 0), session_rows(backend.start, [mate, crossing], 1)),
        )
    )

    if isinstance(backend, SharedSuffixBackend):
        suffix = ids(5)
        head = ids(target_length)  # fresh random ids: never in the cache before this call
        cold = np.asarray(backend.next_token_logprobs_shared_suffix([head + suffix], suffix))[0]
        warm = np.asarray(backend.next_token_logprobs_shared_suffix([long + suffix, head + suffix], suffix))[1]
        cases.append(IsolationCase("cached prefix: a miss, then a hit beside another", _diff(cold, warm)))
        head2 = ids(target_length)  # its prefix computed beside missing ones of many lengths, then alone-cached
        crowded = [c + suffix for c in crowd[:9]] + [head2 + suffix] + [c + suffix for c in crowd[9:]]
        first = np.asarray(backend.next_token_logprobs_shared_suffix(crowded, suffix))[9]
        again = np.asarray(backend.next_token_logprobs_shared_suffix([head2 + suffix], suffix))[0]
        cases.append(IsolationCase("cached prefix filled among 19 others, then a hit alone", _diff(first, again)))
        head3 = ids(target_length)
        start_suffix = backend.start_shared_suffix
        fresh = session_rows(lambda p: start_suffix(p, suffix), [head3 + suffix], 0)
        company = session_rows(lambda p: start_suffix(p, suffix), [short + suffix, head3 + suffix, long + suffix], 1)
        cases.append(IsolationCase("a session from cached prefixes, alone and beside others", _diff(fresh, company)))
    if isinstance(backend, SharedPrefixBackend):
        prefix = ids(7)
        own = prefix + target
        first = np.asarray(backend.next_token_logprobs_shared_prefix(prefix, [own]))[0]
        among = np.asarray(backend.next_token_logprobs_shared_prefix(prefix, [prefix + short, long, own, prefix]))[2]
        cases.append(IsolationCase("a public prefix shared with other rows", _diff(first, among)))
    return IsolationReport(backend.model_id, tuple(cases))
