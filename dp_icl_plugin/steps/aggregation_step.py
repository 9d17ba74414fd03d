"""The token step of the synthesizers that aggregate many prompts' distributions: Tang et al.'s family (Tang, PTA)
and AdaDPSyn.

Per token, for label y: the method draws the records of the step's M prompts (``draw``: Poisson sampling for
Tang's family, slots without replacement for AdaDPSyn, each as its accounting samples them); the rows are the
public prompt (instruction, label, text so far), PTA's base prompt when it has one (no instruction), then one
prompt per drawn subset. The public instruction every row starts with is computed once (prefix KV cache), and
the public rows go to the backend in a call of their own, never beside the records' rows. The public row fixes
V_pub (top-k, ∩ top-p); the method's ``aggregate`` releases an index into V_pub from the private rows (Gaussian
noisy argmax for Tang's family, AdaDPSyn's noisy projected means): the noise and the sensitivity are the
method's, stated in its module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.backends.shared_rows import prefix_rows_logprobs
from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.mechanisms.vocabulary import limit_vocabulary
from dp_icl_plugin.steps.token_step import TokenStep, public_checked
from dp_icl_plugin.templates.prompting import PromptIds

__all__ = ["AggregationStep"]


class AggregationStep(TokenStep):
    """One label's token step for the aggregation synthesizers; see the module docstring.

    Args:
        backend: the language model.
        ids: the prompts' token ids (the template, cut to the model's length).
        label: the label the demonstration is generated for.
        draw: the records of each of the step's prompts, drawn from ``rng`` as accounted.
        base: whether PTA's base prompt is the second (public) row.
        top_k: V_pub's static limit k.
        top_p: V_pub's adaptive limit p, or None.
        aggregate: ``(rows, V_pub, rng) -> index into V_pub``: the mechanism (rows: public first).
    """

    def __init__(
        self,
        backend: NextTokenBackend,
        ids: PromptIds,
        label: str,
        *,
        draw: Callable[[np.random.Generator], list[list[PrivateRecord]]],
        base: bool,
        top_k: int,
        top_p: float | None,
        aggregate: Callable[[np.ndarray, np.ndarray, np.random.Generator], int],
    ) -> None:
        self.backend = backend
        self.ids = ids
        self.label = label
        self.draw = draw
        self.public = 2 if base else 1
        self.top_k = top_k
        self.top_p = top_p
        self.aggregate = aggregate

    def rows(self, generated: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """The public row (and PTA's base row), then one row per prompt of the records drawn for this token.

        Args:
            generated: the tokens released so far.
            rng: the randomness of the draw.

        Raises:
            BackendError: a public row is bad.
        """
        subsets = self.draw(rng)
        prompts = [self.ids.public(self.label, generated)]
        if self.public == 2:
            prompts.append(self.ids.base(self.label, generated))
        prompts += [self.ids.private(self.label, subset, generated) for subset in subsets]
        # the public instruction the prompts start with is computed once (prefix KV cache); the public prompt
        # (and PTA's base prompt) in a call of their own, never beside the records' prompts
        logprobs = prefix_rows_logprobs(self.backend, prompts, self.ids.instruction(self.label), public=self.public)
        return public_checked(logprobs, public=self.public)

    def release(self, rows: np.ndarray, rng: np.random.Generator) -> int:
        """The token the mechanism picks from V_pub (the public row's top-k / top-p tokens).

        Args:
            rows: what :meth:`rows` returned.
            rng: the noise source.
        """
        vocabulary = limit_vocabulary(np.exp(rows[0].astype(np.float64)), top_k=self.top_k, top_p=self.top_p)
        return int(vocabulary[self.aggregate(rows, vocabulary, rng)])
