"""One private token at a time: the step every DP synthesizer and decoder runs, and the loop around it.

A token step has two halves, the shape of Opacus' ``DPOptimizer`` (per-sample work, then the noise):

- :meth:`TokenStep.rows`: the step's next-token log-probabilities, public rows first. The records are drawn
  here, exactly as the method's accounting samples them (Poisson, without replacement, a fixed group), and
  the public rows go to the backend apart from the private ones
  (:func:`~dp_icl_plugin.backends.public_rows.public_apart`).
- :meth:`TokenStep.release`: the mechanism. The only place the records' influence leaves the step, with the
  noise its accounting charges for.

:func:`decode_tokens` runs one demonstration of a synthesizer on a step: at most ``max_tokens`` tokens (all of
them charged), ended by EOS (not kept) or by the stop text (post-processing of released tokens), with one
progress tick per charged token. The decoders drive the same steps one token at a time from their answer
streams (:mod:`~dp_icl_plugin.decoding.decoders`).

A record's row the model got wrong (NaN, +inf, nothing finite) must not fail the release after the charge, or
whether it fails would depend on that record: :func:`public_checked` refuses a bad *public* row (the model's
fault whatever the records) and puts the public row in a bad private row's place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from dp_icl_plugin._progress import ProgressBar
from dp_icl_plugin.backends.base import check_logprobs

__all__ = ["LOGPROB_TOLERANCE", "TokenStep", "decode_tokens", "public_checked"]

#: how far above 0 a record's log-probability may lie (float rounding of a log-softmax) before its row is bad
LOGPROB_TOLERANCE = 1e-4


def public_checked(logprobs: np.ndarray, *, public: int = 1, stand_in: bool = True) -> np.ndarray:
    """A step's rows with the public rows (the first ``public``) checked and, with ``stand_in``, every record's
    row made usable (without it, the caller judges records' rows itself, as expert decoding does: a bad row sits
    idle).

    A bad public row (NaN, +inf, nothing finite) is the model's fault whatever the records: refused. A record's row
    is bad also where an entry exceeds 0 (beyond float rounding, ``LOGPROB_TOLERANCE``): not a log-probability, and
    a large finite one overflows ``exp`` after the charge. A record's
    bad row must not fail the release, or whether it fails would depend on that record: it is replaced by the
    first public row (the records' part of each mechanism then sees a row it could have seen: for Tang's family
    and AdaDPSyn a probability vector like any other, for DPS-MOZO a record that adds nothing, as with λ = 0).
    The replacement is a fixed map of the row and the public row, so every mechanism's per-row bound holds as
    before.

    Args:
        logprobs: ``[rows, V]``, public rows first.
        public: how many leading rows are public (the method's structure: 1, or 2 with PTA's base prompt).
        stand_in: replace a record's bad row by the public row (else leave it to the caller).

    Returns:
        The rows, a copy where a row was replaced.

    Raises:
        BackendError: a public row is bad (public: nothing private is read).
    """
    check_logprobs(logprobs[:public])
    rows = np.asarray(logprobs)
    if not stand_in:
        return rows
    private = rows[public:]
    bad = np.isnan(private).any(axis=-1) | np.isposinf(private).any(axis=-1) | ~np.isfinite(private).any(axis=-1)
    # a log-probability above 0 is no log-probability: a finite 800 overflows exp() into inf and NaN downstream
    bad |= (private > LOGPROB_TOLERANCE).any(axis=-1)
    if not bad.any():
        return rows
    out = np.array(rows, copy=True)
    out[public:][bad] = rows[0]
    return out


class TokenStep(ABC):
    """One method's private token step; see the module docstring."""

    @abstractmethod
    def rows(self, generated: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """The step's log-probabilities ``[rows, V]`` after ``generated`` (public rows first, records drawn from
        ``rng`` as accounted), each private row usable (:func:`public_checked`).

        Args:
            generated: the tokens released so far.
            rng: the randomness of the records' draw.
        """

    @abstractmethod
    def release(self, rows: np.ndarray, rng: np.random.Generator) -> int:
        """The released token: the method's mechanism on ``rows`` (its noise from ``rng``), or the noiseless
        computation for ε = ∞ baselines.

        Args:
            rows: what :meth:`rows` returned.
            rng: the noise source.
        """

    def token(self, generated: Sequence[int], rng: np.random.Generator) -> int:
        """One released token after ``generated``: :meth:`rows`, then :meth:`release`.

        Args:
            generated: the tokens released so far.
            rng: the randomness of the draw and of the noise.
        """
        return int(self.release(self.rows(generated, rng), rng))


def decode_tokens(
    step: TokenStep,
    *,
    max_tokens: int,
    rng: np.random.Generator,
    eos_token_id: int | None,
    stop: Callable[[list[int]], bool] | None,
    progress: ProgressBar,
) -> list[int]:
    """One demonstration: at most ``max_tokens`` released tokens of ``step``.

    Args:
        step: the method's token step.
        max_tokens: T, what the run is charged per demonstration.
        rng: the randomness of the records' draws and of the noise.
        eos_token_id: a released EOS ends the demonstration and is not kept (None: EOS is a token like others).
        stop: ``stop(generated)`` true ends the demonstration after that token (post-processing of released
            tokens), or None.
        progress: ticked once per token, and for the tokens a stop left unused (charged all the same).

    Returns:
        The released token ids (without the EOS).
    """
    generated: list[int] = []
    steps = 0
    for _ in range(max_tokens):
        token = step.token(generated, rng)
        steps += 1
        progress.update(1)
        if eos_token_id is not None and token == eos_token_id:
            break
        generated.append(token)
        if stop is not None and stop(generated):
            break
    progress.update(max_tokens - steps)
    return generated
