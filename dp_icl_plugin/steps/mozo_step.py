"""The DPS-MOZO token step (Flemings et al., Algorithm 1), one implementation for the offline synthesizer
(:mod:`~dp_icl_plugin.synthesis.mozo_offline`) and the online decoder
(:class:`~dp_icl_plugin.decoding.decoders.MozoDecoder`).

Per token: ``n_shots`` records drawn uniformly without replacement from the whole dataset (fresh per token: the
sampling of Wang, Balle & Kasiviswanathan 2019, Thm 9, that the accounting amplifies by, q = n_shots/|D|); each
gives a one-shot prompt ``record + query + answer so far``; the zero-shot prompt ``query + answer so far`` is
public and computed in a backend call of its own. The rows that end with the public query suffix take their
record part from the backend's prefix cache (:func:`~dp_icl_plugin.backends.shared_rows.rows_logprobs`). The
release is the projected mechanism (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.mozo_token`, ``variant="projected"``):
(α, 4βα)-RDP per token under replace-one neighbours, whatever the records
(:func:`~dp_icl_plugin.accounting.method_events.mozo_event` composes it). ``beta=None`` is the ε = ∞ few-shot
ensemble (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.nonprivate_token`): not private, for baselines only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.backends.shared_rows import rows_logprobs
from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.mechanisms.mozo_mixing import mozo_token, nonprivate_token
from dp_icl_plugin.steps.token_step import TokenStep, public_checked

__all__ = ["MozoStep"]


class MozoStep(TokenStep):
    """DPS-MOZO's token step for one query; see the module docstring.

    Args:
        backend: the language model.
        records: the whole private dataset, in a fixed order (records are drawn by position).
        n_shots: records per token.
        zero_shot: the public prompt's ids (the query, no record).
        one_shot: a record's one-shot prompt ids for this query (computed once per record drawn).
        suffix: the public query tokens every row may end with
            (:func:`~dp_icl_plugin.backends.shared_rows.public_suffix`), or ``()``.
        beta: the target leakage β of each token, or None for the noiseless ε = ∞ ensemble.
        order: the Rényi order α the mixing is fitted at.
        top_k: the public top-k support of the zero-shot row.
        lambda_max: the upper limit of each λ_i.
    """

    def __init__(
        self,
        backend: NextTokenBackend,
        records: Sequence[PrivateRecord],
        *,
        n_shots: int,
        zero_shot: list[int],
        one_shot: Callable[[PrivateRecord], list[int]],
        suffix: Sequence[int],
        beta: float | None,
        order: float,
        top_k: int,
        lambda_max: float,
    ) -> None:
        self.backend = backend
        self.records = records
        self.n_shots = n_shots
        self.zero_shot = zero_shot
        self.one_shot = one_shot
        self.suffix = list(suffix)
        self.beta = beta
        self.order = order
        self.top_k = top_k
        self.lambda_max = lambda_max
        self._prompts: dict[int, list[int]] = {}  # record position -> one-shot prompt ids, for this query

    def rows(self, generated: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """The zero-shot row, then one row per record drawn for this token (``n_shots`` without replacement).

        Args:
            generated: the tokens released so far.
            rng: the randomness of the draw.

        Raises:
            BackendError: the zero-shot row is bad.
        """
        picked = [int(i) for i in rng.choice(len(self.records), size=self.n_shots, replace=False)]
        for i in picked:
            if i not in self._prompts:
                self._prompts[i] = self.one_shot(self.records[i])
        rows = [self.zero_shot, *(self._prompts[i] for i in picked)]
        # the zero-shot row is public: computed in a call of its own, never beside the records' rows
        return public_checked(rows_logprobs(self.backend, rows, list(generated), suffix=self.suffix, public=1))

    def release(self, rows: np.ndarray, rng: np.random.Generator) -> int:
        """The token of the projected mechanism on ``rows`` (or of the noiseless ensemble when ``beta`` is None).

        Args:
            rows: what :meth:`rows` returned.
            rng: the noise source.
        """
        if self.beta is None:
            return nonprivate_token(rows[1:], rows[0], top_k=self.top_k, rng=rng).token_id
        token = mozo_token(
            rows[1:],
            rows[0],
            beta=self.beta,
            order=self.order,
            top_k=self.top_k,
            rng=rng,
            lambda_max=self.lambda_max,
            variant="projected",
        )
        return token.token_id
