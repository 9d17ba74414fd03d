"""Clip-blend's token step (Bhusal et al., Algorithm 1) and its one-time assignment of records to groups, shared by
the synthesizer (:mod:`~dp_icl_plugin.synthesis.clip_blend`) and the online decoder
(:class:`~dp_icl_plugin.decoding.decoders.ClipBlendDecoder`); the privacy argument is in the synthesizer's module.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.base import IncrementalSession
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.mechanisms.clip_blend_sampling import clip_blend_token
from dp_icl_plugin.steps.token_step import TokenStep, public_checked

__all__ = ["ClipBlendStep", "assign_groups"]


def assign_groups(
    n_records: int, *, population: int, n_groups: int, subset_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Deal record positions 0..n_records−1 to ``n_groups`` disjoint groups of expected size ``subset_size``.

    Each record independently draws a uniform integer v in [0, N), N = ``population`` (a public, declared
    size, not ``n_records``): it joins group ⌊v/s⌋ when v < K·s (each group with probability s/N exactly),
    no group otherwise. With n_records = N = K·s every record joins one group. A record's group depends on
    its own draw only (see the module docstring).

    Args:
        n_records: the records to deal (may be 0).
        population: N, the declared public population size.
        n_groups: K, the number of groups.
        subset_size: s, each group's expected size.
        rng: the randomness of the draws.

    Returns:
        One sorted array of positions per group.

    Raises:
        ConfigurationError: a parameter out of range, or K·s above N.
    """
    n = check.positive_int("n_records + 1", n_records + 1) - 1  # a label may have no records
    big_n = check.positive_int("population", population)
    k = check.positive_int("n_groups", n_groups)
    s = check.positive_int("subset_size", subset_size)
    if k * s > big_n:
        raise ConfigurationError(f"{k} groups of expected size {s} need a population of at least {k * s}, got {big_n}")
    slot = rng.integers(0, big_n, size=n) // s
    return [np.flatnonzero(slot == g) for g in range(k)]


class ClipBlendStep(TokenStep):
    """Clip-blend's token step on an open session (row 0 public, rows 1.. one record each), for the synthesizer and
    the online decoder (:class:`~dp_icl_plugin.decoding.decoders.ClipBlendDecoder`).

    Each token is :func:`~dp_icl_plugin.mechanisms.clip_blend_sampling.clip_blend_token`: ε0-DP and
    ε0-bounded-range, with ε0 = c/(sτ) (add/remove) or 2c/(sτ) (replace-one); the caller charges every token an
    answer or a demonstration may have. The prompts stay fixed, so a step after the first appends the token
    released last to every prompt (one forward per released token, none after the last). ``temperature=None`` is
    the noiseless argmax (ε = ∞).

    Args:
        session: the demonstration's or the answer's prompts, public first.
        clip: the clipping bound c.
        subset_size: the fixed divisor s (public).
        temperature: τ, or None for the argmax.
    """

    def __init__(
        self, session: IncrementalSession, *, clip: float, subset_size: int, temperature: float | None
    ) -> None:
        self.session = session
        self.clip = clip
        self.subset_size = subset_size
        self.temperature = temperature
        self._appended = -1  # tokens appended to the session; -1 before its first rows are read
        self._logprobs: np.ndarray | None = None

    def rows(self, generated: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """The session's rows after ``generated`` (appending the token released last, when there is one).

        Args:
            generated: the tokens released so far.
            rng: unused (no records are drawn per token).

        Raises:
            ConfigurationError: more than one token was released since the last call.
            BackendError: the public row is bad.
        """
        if self._appended < 0:
            self._logprobs, self._appended = public_checked(self.session.logprobs), 0
        elif len(generated) > self._appended:
            if len(generated) != self._appended + 1:
                raise ConfigurationError("a clip-blend session appends one released token per step")
            self._logprobs = public_checked(self.session.append(int(generated[-1])))
            self._appended += 1
        assert self._logprobs is not None
        return self._logprobs

    def release(self, rows: np.ndarray, rng: np.random.Generator) -> int:
        """The clip-blend token on ``rows``.

        Args:
            rows: what :meth:`rows` returned.
            rng: the noise source.
        """
        return clip_blend_token(
            rows[1:], rows[0], clip=self.clip, subset_size=self.subset_size, temperature=self.temperature, rng=rng
        )


# -- measuring what the KV cache buys -----------------------------------------------------------------------
