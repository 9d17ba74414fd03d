"""Run the audit cases: empirical ε lower bounds next to the claimed ε, for the real and the broken mechanisms."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._progress import progress_bar
from dp_icl_plugin.audit.cases import CASES, AuditCase
from dp_icl_plugin.audit.statistics import epsilon_lower_bound

__all__ = ["AuditRow", "available_cpus", "run_audit", "to_markdown"]


@dataclass(frozen=True)
class AuditRow:
    """One mechanism, real or broken: the claim, the best empirical lower bound, and the verdict.

    ``skipped``: why the case did not run here (empty when it ran); a skipped row proves nothing either way.

    Attributes:
        mechanism: the case's name.
        broken: whether this is the broken variant.
        variant: ``"as shipped"`` or what the broken variant changes.
        delta: the δ the bound is computed at.
        claimed_epsilon: the ε the variant is judged against.
        lower_bound: the largest ε the samples prove.
        event: the test that proves it.
        samples: outputs drawn per input and pair.
        seconds: the case's run time.
        skipped: why the case did not run (empty when it ran).
    """

    mechanism: str
    broken: bool
    variant: str
    delta: float
    claimed_epsilon: float
    lower_bound: float
    event: str
    samples: int
    seconds: float
    skipped: str = ""

    @property
    def consistent(self) -> bool:
        """The lower bound does not contradict the claim."""
        return self.lower_bound <= self.claimed_epsilon

    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"FAIL: claim violated"`` as shipped, ``"caught"`` or ``"MISSED"`` when broken, or why
        the case was skipped."""
        if self.skipped:
            return f"skipped: {self.skipped}"
        if not self.broken:
            return "pass" if self.consistent else "FAIL: claim violated"
        return "caught" if not self.consistent else "MISSED"


def audit_case(case: AuditCase, *, broken: bool, samples: int, seed: int, confidence: float = 0.95) -> AuditRow:
    """Sample the case's pairs and keep the largest lower bound (Bonferroni over the pairs).

    Args:
        case: the case.
        broken: run the broken variant.
        samples: outputs per input and pair (scaled by the case's ``sample_share``, at least 4).
        seed: the seed of every pair's randomness.
        confidence: the level of the whole bound.
    """
    variant = case.broken_as if broken else "as shipped"
    reason = case.requires() if case.requires is not None else None
    if broken and not reason and case.broken_shows is not None:  # measured here: a defect these kernels hide
        reason = case.broken_shows()
    if reason:
        return AuditRow(case.name, broken, variant, case.delta, case.claim(broken), 0.0, "not run", 0, 0.0, reason)
    started = time.perf_counter()
    samples = max(4, round(samples * case.sample_share))
    samplers = case.pairs(broken)
    level = 1 - (1 - confidence) / len(samplers)
    best, best_event = 0.0, "none"
    for i, sample in enumerate(samplers):
        rng = np.random.default_rng([seed, i, int(broken)])
        on_d, on_d_prime = sample(False, samples, rng), sample(True, samples, rng)
        bound, event = epsilon_lower_bound(on_d, on_d_prime, delta=case.delta, confidence=level)
        if bound > best:
            best, best_event = bound, f"pair {i}: {event}"
    return AuditRow(
        case.name,
        broken,
        variant,
        case.delta,
        case.claim(broken),
        best,
        best_event,
        samples,
        time.perf_counter() - started,
    )


def run_audit(
    *,
    samples: int,
    seed: int = 0,
    cases: tuple[AuditCase, ...] = CASES,
    jobs: int = 1,
    progress: bool | None = None,
) -> list[AuditRow]:
    """Every case, real and broken (half the noise), at ``samples`` outputs per input and pair; a case whose
    requirements are missing gives two skipped rows.

    Args:
        samples: outputs per input and pair.
        seed: the audit's seed; a row's randomness is seeded by (seed, pair, broken) alone.
        cases: the cases to run (default: every shipped mechanism's).
        jobs: worker processes (spawned) that share the rows; the rows, in order, are the same for any
            ``jobs`` (only their ``seconds`` differ). Each worker's numerical libraries get an equal share of
            the CPUs. Spawned workers import the calling script: a script that calls this with ``jobs`` > 1
            needs the ``if __name__ == "__main__":`` guard (the ``dp-icl audit`` command has it). A case that
            cannot be pickled (a lambda in it) runs in this process.
        progress: a bar of the rows done on stderr (True), none (False), or one on a terminal only (None).

    Returns:
        The rows, case by case, as shipped then broken.

    Raises:
        ConfigurationError: ``samples`` or ``jobs`` not a positive int.
    """
    samples = check.positive_int("samples", samples)
    jobs = check.positive_int("jobs", jobs)
    tasks = [(c, b) for c in cases for b in (False, True)]
    bar = progress_bar(len(tasks), desc="dp-icl audit", unit="row", enabled=progress)
    try:
        if jobs == 1 or len(tasks) < 2:
            rows = []
            for c, b in tasks:
                rows.append(audit_case(c, broken=b, samples=samples, seed=seed))
                bar.update(1)
            return rows
        return _pooled(tasks, samples=samples, seed=seed, jobs=jobs, done=bar.update)
    finally:
        bar.close()


def _pooled(
    tasks: list[tuple[AuditCase, bool]], *, samples: int, seed: int, jobs: int, done: Callable[[int], object]
) -> list[AuditRow]:
    """``tasks`` shared by ``jobs`` spawned workers; ``done(1)`` as each row finishes (in any order)."""
    # a shipped case travels as its position in CASES, another pickled; one that cannot be (a lambda in it) runs
    # here while the workers run the rest
    keys: list[int | AuditCase | None] = [
        CASES.index(c) if c in CASES else c if _picklable(c) else None for c, _ in tasks
    ]
    workers = min(jobs, len(tasks))
    threads = max(1, available_cpus() // workers)
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold model threads
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_share_cpus, initargs=(threads,)) as pool:
        futures = [
            None if key is None else pool.submit(_audit_row, key, b, samples, seed)
            for key, (_, b) in zip(keys, tasks, strict=True)
        ]
        here: dict[int, AuditRow] = {}
        for i, (f, (c, b)) in enumerate(zip(futures, tasks, strict=True)):
            if f is None:
                here[i] = audit_case(c, broken=b, samples=samples, seed=seed)
                done(1)
        for _ in as_completed([f for f in futures if f is not None]):
            done(1)
        return [here[i] if f is None else f.result() for i, f in enumerate(futures)]


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _picklable(case: AuditCase) -> bool:
    try:
        pickle.dumps(case)
    except Exception:  # pickle raises PicklingError, AttributeError or TypeError for a lambda or a local
        return False
    return True


def _share_cpus(threads: int) -> None:
    """A worker's numerical libraries use ``threads`` threads (set before torch is imported there)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)


def _audit_row(key: int | AuditCase, broken: bool, samples: int, seed: int) -> AuditRow:
    case = CASES[key] if isinstance(key, int) else key
    return audit_case(case, broken=broken, samples=samples, seed=seed)


def to_markdown(rows: list[AuditRow]) -> str:
    """The rows as a Markdown table.

    Args:
        rows: the audit's rows.
    """
    lines = [
        "| mechanism | variant | δ | claimed ε | empirical ε lower bound (95 %) | verdict | strongest test |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        bound = "—" if r.skipped else f"{r.lower_bound:.3f}"
        lines.append(
            f"| {r.mechanism} | {r.variant} | {r.delta:.3g} | {r.claimed_epsilon:.3f} | {bound} "
            f"| {r.verdict} | {r.event} |"
        )
    return "\n".join(lines)
