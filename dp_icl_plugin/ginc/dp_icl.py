"""DP-ICL on GINC (PTA, App. F): private datasets from the PTA split, and 4-shot accuracy with given demonstrations.

A GINC concept plays the role of a label: its 1,600 training examples are the private records D_y (each the
k − 1 query tokens followed by their Bayes-optimal next token), synthetic demonstrations are generated per
concept, and a test query of concept y is answered with the demonstrations of y followed by the query,
exactly the layout of :attr:`~dp_icl_plugin.ginc.prompts.IclPrompts.token_ids` (``demo / demo / … / query``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend, check_logprobs
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.evaluation import AccuracyCell
from dp_icl_plugin.ginc.language import GincLanguage
from dp_icl_plugin.ginc.prompts import GincExample

__all__ = ["accuracy_with_demonstrations", "concept_label", "private_dataset", "query_answer_dataset"]


def concept_label(concept: int) -> str:
    """The public label name of a GINC concept (``"concept-3"``)."""
    return f"concept-{int(concept)}"


def private_dataset(language: GincLanguage, split: Mapping[int, Sequence[GincExample]]) -> PrivateDataset:
    """One record per training example (query tokens then the label token), labelled by its concept.

    The split's size per concept is a public design parameter of the benchmark (PTA: 1,600), declared as
    the label sizes the methods sample by.
    """
    records = [
        PrivateRecord(language.render([*ex.tokens, ex.label]), concept_label(c))
        for c, examples in split.items()
        for ex in examples
    ]
    return PrivateDataset(records, labels=[concept_label(c) for c in split], public_label_counts="observed")


def query_answer_dataset(language: GincLanguage, examples: Sequence[GincExample]) -> PrivateDataset:
    """Input→output records for methods that answer inputs (MOZO): text = the query, label = its next token.

    The label set is the whole GINC vocabulary (public).
    """
    records = [PrivateRecord(language.render(ex.tokens), language.vocab[ex.label]) for ex in examples]
    return PrivateDataset(records, labels=language.vocab)


def accuracy_with_demonstrations(
    backend: NextTokenBackend,
    examples: Sequence[GincExample],
    demonstrations: Mapping[int, Sequence[Sequence[int]]] | None,
    *,
    batch: int = 512,
) -> AccuracyCell:
    """Greedy next-token accuracy of ``demo_1 / … / demo_n / query`` prompts over the full vocabulary.

    Args:
        examples: labelled test queries (all of one query length).
        demonstrations: token ids of the demonstrations of each concept (``None`` or empty: 0-shot).
    """
    if not examples:
        raise ConfigurationError("no test examples")
    lengths = {len(ex.tokens) for ex in examples}
    if len(lengths) != 1:
        raise ConfigurationError("test queries must all have the same length")
    prefixes: dict[int, list[int]] = {}
    prompts: list[list[int]] = []
    for ex in examples:
        if ex.concept not in prefixes:
            demos = (demonstrations or {}).get(ex.concept, ())
            prefixes[ex.concept] = [t for demo in demos for t in (*demo, 0)]
        prompts.append(prefixes[ex.concept] + list(ex.tokens))
    labels = np.array([ex.label for ex in examples])
    correct = 0
    for start in range(0, len(prompts), batch):
        predicted = check_logprobs(backend.next_token_logprobs(prompts[start : start + batch])).argmax(axis=1)
        correct += int((predicted == labels[start : start + batch]).sum())
    return AccuracyCell(
        k=len(examples[0].tokens) + 1,
        shots=max((len(v) for v in (demonstrations or {}).values()), default=0),
        n_prompts=len(examples),
        correct=correct,
    )
