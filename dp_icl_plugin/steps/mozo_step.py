"""The DPS-MOZO token step (Flemings et al., Algorithm 1), one implementation for the offline synthesizer
(:mod:`~dp_icl_plugin.synthesis.mozo_offline`) and the online decoder
(:class:`~dp_icl_plugin.decoding.decoders.MozoDecoder`).

Per token: ``n_shots`` records drawn uniformly without replacement from the whole dataset (fresh per token: the
sampling of Wang, Balle & Kasiviswanathan 2019, Thm 9, that the accounting amplifies by, q = n_shots/|D|); each
gives a one-shot prompt ``record + query + answer so far``. Under a unit-level ledger units are drawn instead
(q = n_shots/|U|, the number of units, which unit replace-one keeps fixed), and a drawn unit's prompt shows at
most ``records_per_unit`` of its records (:mod:`~dp_icl_plugin.data.units`): one unit still moves one row. The
zero-shot prompt ``query + answer so far`` is public and computed in backend calls of its own: an incremental
session that grows one released token a step (one new position a token, not the whole query again), started in
the backend's public-rows scope. The rows that end with the public query suffix take their record part from
the backend's prefix cache (:func:`~dp_icl_plugin.backends.shared_rows.rows_logprobs`). The release is the
projected mechanism (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.mozo_token`, ``variant="projected"``):
(α, 4βα)-RDP per token under replace-one neighbours, whatever the records
(:func:`~dp_icl_plugin.accounting.method_events.mozo_event` composes it). ``beta=None`` is the ε = ∞ few-shot
ensemble (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.nonprivate_token`): not private, for baselines only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dp_icl_plugin.backends.base import IncrementalSession, NextTokenBackend, context_limit
from dp_icl_plugin.backends.public_rows import public_scope
from dp_icl_plugin.backends.shared_rows import rows_logprobs, start_rows
from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.data.units import Element, records_of
from dp_icl_plugin.mechanisms.mozo_mixing import mozo_token, nonprivate_token
from dp_icl_plugin.steps.token_step import TokenStep, public_checked

__all__ = ["MozoStep"]


class MozoStep(TokenStep):
    """DPS-MOZO's token step for one query; see the module docstring.

    Args:
        backend: the language model.
        elements: the whole private dataset's elements in a fixed order (drawn by position): each record alone,
            or under a unit-level ledger each unit's records (:mod:`~dp_icl_plugin.data.units`).
        n_shots: elements per token.
        zero_shot: the public prompt's ids (the query, no record).
        one_shot: the one-shot prompt ids of an element's records for this query (computed once per draw seen).
        suffix: the public query tokens every row may end with
            (:func:`~dp_icl_plugin.backends.shared_rows.public_suffix`), or ``()``.
        beta: the target leakage β of each token, or None for the noiseless ε = ∞ ensemble.
        order: the Rényi order α the mixing is fitted at.
        top_k: the public top-k support of the zero-shot row.
        lambda_max: the upper limit of each λ_i.
        records_per_element: k, the most records a drawn element puts into its one prompt (a unit's uniformly
            random k, drawn afresh per token: :func:`~dp_icl_plugin.data.units.records_of`).
    """

    def __init__(
        self,
        backend: NextTokenBackend,
        elements: Sequence[Element],
        *,
        n_shots: int,
        zero_shot: list[int],
        one_shot: Callable[[list[PrivateRecord]], list[int]],
        suffix: Sequence[int],
        beta: float | None,
        order: float,
        top_k: int,
        lambda_max: float,
        records_per_element: int = 1,
    ) -> None:
        self.backend = backend
        self.elements = elements
        self.n_shots = n_shots
        self.zero_shot = zero_shot
        self.one_shot = one_shot
        self.suffix = list(suffix)
        self.beta = beta
        self.order = order
        self.top_k = top_k
        self.lambda_max = lambda_max
        self.records_per_element = records_per_element
        self._prompts: dict[tuple[int, ...], list[int]] = {}  # the records drawn -> their prompt ids, for this query
        self._public: IncrementalSession | None = None  # the zero-shot row's session (public tokens only)
        self._held: list[int] = []  # the released tokens that session holds

    def rows(self, generated: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """The zero-shot row, then one row per element drawn for this token (``n_shots`` without replacement).

        Args:
            generated: the tokens released so far.
            rng: the randomness of the draw.

        Raises:
            BackendError: the zero-shot row is bad.
        """
        picked = [int(i) for i in rng.choice(len(self.elements), size=self.n_shots, replace=False)]
        prompts = []
        for i in picked:
            records = records_of(self.elements[i], self.records_per_element, rng)
            key = (i, *(id(r) for r in records))
            if key not in self._prompts:
                self._prompts[key] = self.one_shot(records)
            prompts.append(self._prompts[key])
        # the zero-shot row is public: computed in calls of its own, never beside the records' rows
        public = self._zero_shot_row([int(t) for t in generated])
        private = rows_logprobs(self.backend, prompts, list(generated), suffix=self.suffix)
        return public_checked(np.vstack([public, private]))

    def _zero_shot_row(self, generated: list[int]) -> np.ndarray:
        """The zero-shot row after ``generated`` (``[1, V]``), from its session grown by the tokens released since
        the last step. Every decision here reads public values only: the released tokens and the prompt's
        length. A prompt past the model's positions is cut to its end and computed whole, as
        :func:`~dp_icl_plugin.backends.shared_rows.rows_logprobs` cuts it."""
        capacity = context_limit(self.backend)
        if capacity is not None and len(self.zero_shot) + len(generated) > capacity:
            self.close()
            return rows_logprobs(self.backend, [self.zero_shot], generated, suffix=self.suffix, public=1)
        if self._public is None or generated[: len(self._held)] != self._held:
            self.close()
            with public_scope(self.backend):
                tail = [*self.suffix, *generated] if self.suffix else []  # the record-free part before it cached
                self._public = start_rows(self.backend, [[*self.zero_shot, *generated]], suffix=tail)
            self._held = list(generated)
            return np.asarray(self._public.logprobs)
        out = np.asarray(self._public.logprobs)
        for token in generated[len(self._held) :]:
            out = np.asarray(self._public.append([token]))
        self._held = list(generated)
        return out

    def close(self) -> None:
        """Drop the zero-shot row's session (its cache); the next step starts one again."""
        if self._public is not None:
            self._public.close()
        self._public, self._held = None, []

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
