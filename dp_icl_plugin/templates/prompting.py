"""Shared pieces of the synthesis loops: prompt token ids, record sampling, decoding a demonstration.

Sampling here is exactly what the accountant assumes:

- :func:`poisson_prompts`: each record joins the token's sample independently with probability q (a fixed
  rate from a declared size) and is assigned to one of the M prompts uniformly and independently, in an
  order set by independent uniform keys. Adding a record therefore changes at most one prompt and leaves
  the others exactly as they were (the coupling behind the √2 sensitivity); replacing one keeps its coin,
  prompt and place.
- :func:`slot_placement` and :func:`fixed_size_subsets`: the records of a label are placed uniformly at
  random into n_y slots (n_y its declared size; slots left over stay empty), and M·N slots are drawn
  uniformly without replacement and cut into M prompts of N (an empty slot leaves its prompt one example
  short). A replacement, within a label or across two, changes one slot of each run it touches, and the
  population n_y never depends on the data (sampling without replacement, replace-one; AdaDPSyn). With
  n_y = |D_y| every slot holds a record and this is a uniform draw of M·N records.

Both sample *elements* (:mod:`~dp_icl_plugin.data.units`): a record alone, or under a unit-level ledger one
unit's records, which go into one prompt together (at most ``records_per_element`` of them); the arguments above
then hold for a unit in place of a record, with the units' declared count as n_y.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.base import NextTokenBackend, context_limit
from dp_icl_plugin.backends.shared_rows import common_prefix_length
from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.data.units import Element, records_of
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.templates.answer import AnswerTemplate
from dp_icl_plugin.templates.demonstration import PromptTemplate

__all__ = [
    "AnswerPromptIds",
    "PromptIds",
    "check_records_encode",
    "demonstration_text",
    "fixed_size_subsets",
    "poisson_prompts",
    "slot_placement",
]


def poisson_prompts(
    elements: Sequence[Element],
    *,
    sampling_rate: float,
    n_prompts: int,
    rng: np.random.Generator,
    records_per_element: int = 1,
) -> list[list[PrivateRecord]]:
    """Poisson-sample ``elements`` at ``sampling_rate`` and deal the sample to ``n_prompts`` prompts, each
    drawn element putting its records (at most ``records_per_element``, :func:`~dp_icl_plugin.data.units.records_of`)
    into one prompt.

    Prompt sizes vary (a prompt may be empty); the expected number of elements is ``sampling_rate · len(elements)``.

    Args:
        elements: the elements to sample from (records alone, or units' records: :mod:`~dp_icl_plugin.data.units`).
        sampling_rate: q, each element's probability of joining the sample.
        n_prompts: M, the prompts the sample is dealt to.
        rng: the randomness.
        records_per_element: k, the most records one element puts into its prompt.

    Returns:
        The records of each prompt, in their prompt order.
    """
    n = len(elements)
    chosen = np.flatnonzero(rng.random(n) < sampling_rate)
    slots = rng.integers(0, n_prompts, size=chosen.size)
    keys = rng.random(chosen.size)
    prompts: list[list[PrivateRecord]] = [[] for _ in range(n_prompts)]
    for position in np.lexsort((keys, slots)):  # by prompt, then by key
        element = elements[int(chosen[position])]
        prompts[int(slots[position])].extend(records_of(element, records_per_element, rng))
    return prompts


def slot_placement(n_records: int, n_slots: int, rng: np.random.Generator) -> np.ndarray:
    """The record in each of ``n_slots`` slots (−1 for an empty one): a uniformly random arrangement.

    When the records fit, every record gets a slot. When there are more (the declared size was too small), a
    uniformly random ``n_slots`` of them get one and the rest take no part. Either way a uniform arrangement
    admits the coupling the analysis needs, and which case holds is never revealed or branched on outside the
    mechanism: a replaced record takes the other's slot; an added record takes a uniform slot with probability
    min(1, n_slots/|D_y ∪ {x}|), moving its occupant (if any) out; a removed record's slot is emptied or taken
    by a uniformly random record that had none. One slot changes in each case.

    Args:
        n_records: the records of the label.
        n_slots: n_y, the label's declared size.
        rng: the randomness.

    Returns:
        Shape (n_slots,): a record's index, or −1.

    Raises:
        ConfigurationError: ``n_slots`` is not a positive integer.
    """
    n_slots = check.positive_int("n_slots", n_slots)
    placement = np.full(n_slots, -1, dtype=np.int64)
    if n_records <= n_slots:
        placement[rng.permutation(n_slots)[:n_records]] = np.arange(n_records)
    else:
        placement[:] = rng.permutation(n_records)[:n_slots]
    return placement


def fixed_size_subsets(
    elements: Sequence[Element],
    *,
    placement: np.ndarray,
    n_prompts: int,
    per_prompt: int,
    rng: np.random.Generator,
    records_per_element: int = 1,
) -> list[list[PrivateRecord]]:
    """``n_prompts · per_prompt`` slots of ``placement`` drawn uniformly without replacement, ``per_prompt``
    per prompt; each prompt gets the records of the elements in its slots (empty slots are skipped; at most
    ``records_per_element`` records each, :func:`~dp_icl_plugin.data.units.records_of`).

    Args:
        elements: the elements that ``placement`` indexes (records alone, or units' records).
        placement: the slots, from :func:`slot_placement`.
        n_prompts: M, the prompts.
        per_prompt: N, the slots per prompt (M·N at most ``len(placement)``).
        rng: the randomness.
        records_per_element: k, the most records one element puts into its prompt.
    """
    picked = placement[rng.choice(len(placement), size=n_prompts * per_prompt, replace=False)]
    prompts: list[list[PrivateRecord]] = []
    for j in range(n_prompts):
        prompt: list[PrivateRecord] = []
        for i in picked[j * per_prompt : (j + 1) * per_prompt]:
            if i >= 0:
                prompt.extend(records_of(elements[int(i)], records_per_element, rng))
        prompts.append(prompt)
    return prompts


class PromptIds:
    """Token ids of prompts as the backend tokenises a prompt (special tokens included), plus continuations.

    Prompts longer than the model's context (``backend.max_length`` when it has one) keep their last
    tokens: the generated continuation and the query are never cut, the oldest examples are.

    Args:
        backend: the model whose tokenizer is used.
        template: the prompt layout.
    """

    def __init__(self, backend: NextTokenBackend, template: PromptTemplate) -> None:
        self.backend = backend
        self.template = template
        self.max_length = context_limit(backend)
        self._cache: dict[tuple[str, str], list[int]] = {}

    def _prefix(self, kind: str, label: str) -> list[int]:
        key = (kind, label)
        if key not in self._cache:
            text = self.template.public_prompt(label) if kind == "public" else self.template.base_prompt(label)
            self._cache[key] = self.backend.encode(text, add_special_tokens=True)
        return self._cache[key]

    def instruction(self, label: str) -> list[int]:
        """The public start every prompt of ``label`` shares: the instruction's tokens, less the last one (which
        may merge with what follows it), as the public prompt spells them; from the template only.

        Args:
            label: the label whose prompts are meant.
        """
        key = ("instruction", label)
        if key not in self._cache:
            public = self._prefix("public", label)
            header = self.backend.encode(self.template.header.format(label=label), add_special_tokens=True)
            self._cache[key] = public[: max(0, common_prefix_length(public, header) - 1)]
        return self._cache[key]

    def fit(self, ids: list[int]) -> list[int]:
        """``ids`` cut to the model's context, keeping their end.

        Args:
            ids: a prompt's token ids.
        """
        if self.max_length is not None and len(ids) > self.max_length:
            return ids[-self.max_length :]
        return ids

    def public(self, label: str, generated: Sequence[int]) -> list[int]:
        """Token ids of the public prompt S_pub of ``label`` followed by ``generated``.

        Args:
            label: the demonstration's label.
            generated: the tokens generated so far.
        """
        return self.fit(self._prefix("public", label) + list(generated))

    def base(self, label: str, generated: Sequence[int]) -> list[int]:
        """Token ids of PTA's base prompt of ``label`` followed by ``generated``.

        Args:
            label: the demonstration's label.
            generated: the tokens generated so far.
        """
        return self.fit(self._prefix("base", label) + list(generated))

    def private(self, label: str, records: Sequence[PrivateRecord], generated: Sequence[int]) -> list[int]:
        """Token ids of the private prompt S_priv of ``label`` with ``records`` followed by ``generated``.

        Args:
            label: the demonstration's label.
            records: the records shown as examples.
            generated: the tokens generated so far.
        """
        text = self.template.private_prompt(label, records)
        return self.fit(self.backend.encode(text, add_special_tokens=True) + list(generated))


class AnswerPromptIds(PromptIds):
    """:class:`PromptIds` for input→output prompts (:class:`~dp_icl_plugin.templates.answer.AnswerTemplate`): where
    a label-conditioned prompt names its label, these name the public input they answer.

    The public prompt is the zero-shot prompt (header, then the input); a private prompt shows its records as
    examples before the input (none drawn: the zero-shot prompt). Cut to the model's context like
    :class:`PromptIds`. There is no base prompt.

    Args:
        backend: the model whose tokenizer is used.
        template: the prompt layout.
    """

    def __init__(self, backend: NextTokenBackend, template: AnswerTemplate) -> None:
        super().__init__(backend, PromptTemplate())
        self.answer_template = template

    def _zero_shot(self, public_input: str) -> list[int]:
        key = ("zero-shot", public_input)
        if key not in self._cache:
            text = self.answer_template.zero_shot_prompt(public_input)
            self._cache[key] = self.backend.encode(text, add_special_tokens=True)
        return self._cache[key]

    def instruction(self, label: str) -> list[int]:
        """The header's tokens every prompt for the input ``label`` starts with, less the last (which may merge with
        what follows it), as the zero-shot prompt spells them; from public text only.

        Args:
            label: the public input the prompts answer.
        """
        key = ("answer-instruction", label)
        if key not in self._cache:
            public = self._zero_shot(label)
            header = self.backend.encode(self.answer_template.header, add_special_tokens=True)
            self._cache[key] = public[: max(0, common_prefix_length(public, header) - 1)]
        return self._cache[key]

    def public(self, label: str, generated: Sequence[int]) -> list[int]:
        """Token ids of the zero-shot prompt for the input ``label`` followed by ``generated``.

        Args:
            label: the public input.
            generated: the tokens generated so far.
        """
        return self.fit(self._zero_shot(label) + list(generated))

    def base(self, label: str, generated: Sequence[int]) -> list[int]:
        """Not defined for input→output prompts.

        Raises:
            ConfigurationError: always.
        """
        raise ConfigurationError("input→output prompts have no base prompt")

    def private(self, label: str, records: Sequence[PrivateRecord], generated: Sequence[int]) -> list[int]:
        """Token ids of the prompt with ``records`` as examples before the input ``label``, then ``generated``.

        Args:
            label: the public input.
            records: the records shown as examples (input and output each).
            generated: the tokens generated so far.
        """
        text = self.answer_template.one_shot_prompt(list(records), label)
        return self.fit(self.backend.encode(text, add_special_tokens=True) + list(generated))


def check_records_encode(
    backend: NextTokenBackend, records: Sequence[PrivateRecord], *, with_labels: bool = False
) -> None:
    """Refuse a record the backend's tokenizer cannot encode, before anything is charged.

    A record that fails only when it is drawn would fail after a charge, with a probability that depends on it
    (an unbounded privacy loss). Each record's text (and its label, with ``with_labels``, for prompts that put
    a record's label in, as the decoders' do) is encoded once here, when a decoder or a synthesis is set up;
    prompts put them between public template text, which the caller checks on its own.

    Args:
        backend: the model whose tokenizer will encode the prompts.
        records: the private records.
        with_labels: check each record's label too.

    Raises:
        ConfigurationError: naming the record's label and position within it, never its text.
    """
    seen: dict[str, int] = {}
    for record in records:
        k = seen[record.label] = seen.get(record.label, -1) + 1
        for part in (record.text, record.label) if with_labels else (record.text,):
            try:
                backend.encode(part)
            except Exception as exc:  # tokenizers raise plain Exception for what they cannot encode
                raise ConfigurationError(
                    f"record {k} of label {record.label!r} cannot be encoded by the tokenizer of {backend.model_id} "
                    f"({type(exc).__name__}): fix or remove it (a record that fails when drawn would fail after "
                    "its charge)"
                ) from None


def demonstration_text(backend: NextTokenBackend, token_ids: Sequence[int], stop: str | None) -> str:
    """The released text: decoded, cut at the template's stop string, stripped (post-processing).

    Args:
        backend: the model whose tokenizer decodes.
        token_ids: the generated tokens.
        stop: the template's stop string, or None.
    """
    text = backend.decode(list(token_ids))
    if stop is not None and stop in text:
        text = text[: text.index(stop)]
    return text.strip()
