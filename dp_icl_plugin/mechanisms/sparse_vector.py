"""The sparse vector technique (AboveThreshold) that lets sparse expert decoding emit public tokens for free.

**The mechanism** (Dwork, Naor, Reingold, Rothblum & Vadhan 2009; Dwork & Roth 2014, Algorithm 1 *AboveThreshold*,
Theorem 3.23; the restart after each positive is their Algorithm 2 *Sparse*, Theorem 3.25, composed here in RDP).
A run holds a noisy threshold T + ρ, ρ ~ Lap(2b), and answers a stream of adaptively chosen queries f_1, f_2, ...
of sensitivity at most Δ: query t is *above* when f_t(D) + ν_t ≥ T + ρ, ν_t ~ Lap(4b) drawn afresh per query.
Only the answers (⊥ … ⊥ ⊤) leave the mechanism, never a noisy value. After a ⊤ the threshold noise is drawn
afresh (a new run); after ``positives`` of them no query is asked again.

**Privacy.** With b = Δ/ε_s, one run (every query up to and including its first ⊤, or up to the end of the
stream) is ε_s-DP for any sensitivity-Δ queries, monotone or not (Dwork & Roth, Thm. 3.23): a unit whose change
moves every query by at most j·Δ sees j·ε_s (the noise is the same, the sensitivity j times larger). A stream with
at most ``positives`` ⊤ holds at most ``positives`` runs (the run left open when the stream ends is one of them,
since a stream that spent its positives asks no more), composed adaptively: ``positives`` ×
``PureDPEvent(j·ε_s)``, at each Rényi order the pure-DP curve (:func:`~dp_icl_plugin.accounting.rdp.pure_dp_rdp`).
Zhu & Wang (NeurIPS 2020) give tighter RDP bounds for SVT with Gaussian noise; this module keeps to the
textbook Laplace version, whose bound holds as stated. The Laplace draws are numpy's double-precision
sampler: "pure" holds up to its rounding, as for every sampler in this library.

The threshold T is public (a setting, never read from the data); a threshold from private data, or a test
without noise, is what the audit's broken variant of this mechanism does
(:mod:`dp_icl_plugin.audit.expert_case`).
"""

from __future__ import annotations

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["AboveThreshold"]


class AboveThreshold:
    """One answer's sparse-vector state: a noisy threshold, at most ``positives`` ⊤ answers (see the module).

    Args:
        threshold: T, public.
        scale: b = Δ/ε_s: the threshold noise is Lap(2b), each query's Lap(4b).
        positives: the most ⊤ answers (runs) this stream may give.
        rng: the noise source.

    Raises:
        ConfigurationError: a non-finite threshold, a non-positive scale or count, or a bad ``rng``.
    """

    def __init__(self, *, threshold: float, scale: float, positives: int, rng: np.random.Generator) -> None:
        self.threshold = check.real("threshold", threshold)
        if not np.isfinite(self.threshold):
            raise ConfigurationError(f"threshold must be finite, got {threshold!r}")
        self.scale = check.positive_finite("scale", scale)
        self.positives = check.positive_int("positives", positives)
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationTypeError("rng must be a numpy.random.Generator")
        self._rng = rng
        self.given = 0  # ⊤ answers so far (public: they are the output)
        self._noisy_threshold = self._fresh_threshold()

    def _fresh_threshold(self) -> float:
        return self.threshold + float(self._rng.laplace(0.0, 2.0 * self.scale))

    @property
    def spent(self) -> bool:
        """Whether every ⊤ answer was given: no query may be asked again."""
        return self.given >= self.positives

    def above(self, value: float) -> bool:
        """Answer one query: whether its value, with fresh noise, reaches the noisy threshold.

        Args:
            value: f_t(D), the query's value on the private data (finite).

        Returns:
            True (⊤: a run ends, the threshold is drawn afresh) or False (⊥).

        Raises:
            ConfigurationError: the stream's positives are spent, or ``value`` is not finite.
        """
        if self.spent:
            raise ConfigurationError("every positive answer of this sparse-vector stream was given")
        v = float(value)
        if not np.isfinite(v):
            raise ConfigurationError(f"a sparse-vector query must be finite, got {value!r}")
        if v + float(self._rng.laplace(0.0, 4.0 * self.scale)) < self._noisy_threshold:
            return False
        self.given += 1
        if not self.spent:
            self._noisy_threshold = self._fresh_threshold()
        return True
