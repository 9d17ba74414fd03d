"""Keyword hints: the records nearest to a query vote keywords, each paying through its own filter, and the public
model answers with the released keywords in its prompt.

Keyword-space aggregation (Wu et al., ICLR 2024, §3.2 "KSA") with the records as voters instead of shards of
LLM answers, and the kNN paper's individual accounting (Feldman & Zrnic 2021, Thm. 4.5):

1. **Selection.** As in expert decoding (:mod:`~dp_icl_plugin.decoding.knn_experts`): every *candidate* (an active
   record whose cosine similarity to the public query reaches the public ``min_similarity``) is charged through
   its unit's Rényi filter before anything is read; a unit's charge depends on its own records and the query.
2. **Votes.** Every admitted candidate votes the first ``keywords_per_record`` = m distinct words of its answer
   (else its label, else its text) that the tokenizer writes as one keyword token
   (:func:`~dp_icl_plugin.mechanisms.keyword_threshold.record_keywords`): a set of at most m token ids, a function
   of that record alone. The votes form a histogram h over the public vocabulary.
3. **Release.** Gaussian noise N(0, σ²) on every count of h, zero counts included; the tokens whose noisy count
   passes the public threshold T (set so that 0.01 unsaid tokens pass per release on average), highest first,
   at most ``keywords`` of them (:func:`~dp_icl_plugin.mechanisms.keyword_threshold.threshold_keywords`).
4. **Answer.** The public model's greedy answer to the query with the released words in an instruction before it
   (:class:`~dp_icl_plugin.retrieval.prompts.KeywordAnswerPrompt`), or the zero-shot answer when none passed:
   post-processing, free.

**Neighbouring relation and sensitivity.** Add/remove one unit (a record, or all of one person's records with
``group_by_user``). No record takes another's place (every candidate votes), so removing a unit with c candidate
records removes c sets of at most m tokens: ‖Δh‖₂ ≤ c·√m (``PrivateKNN._event("answer", c)``;
:func:`~dp_icl_plugin.mechanisms.keyword_threshold.record_vote_sensitivity`).

**Accounting.** The noisy histogram is a Gaussian mechanism, (α, α·c²·m/(2σ²))-RDP (Mironov 2017, Prop. 7); the
threshold, ranking, cut and the answer are post-processing, and no δ is spent on the release itself. σ is the
least with which a one-candidate unit affords ``uses`` answers (:func:`~dp_icl_plugin.retrieval.retriever
.noise_for_uses`). Each answer is one release whatever its length, charged before anything is read; the ledger
holds the filter's total once (:meth:`~dp_icl_plugin.retrieval.PrivateKNN.cover_event`) and records each answer
as a :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent`.

**What it can carry.** A keyword passes half the time when about T records among the candidates share it
(:meth:`KNNKeywordDecoder.records_to_agree`); ``dp-icl plan`` gives T for a dataset size and ε before anything
is paid.
"""

from __future__ import annotations

import math
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.budget import BudgetManager, LedgerEntry
from dp_icl_plugin.backends.base import NextTokenBackend, context_limit
from dp_icl_plugin.data.records import PrivateDataset
from dp_icl_plugin.decoding.choices import AnswerChoices
from dp_icl_plugin.decoding.contract import AnswerState
from dp_icl_plugin.decoding.decoders import chat_ids, query_text
from dp_icl_plugin.decoding.knn_experts import KNNDecoder, check_dataset_settings, knn_for_dataset
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.retrieval.index import Candidates
from dp_icl_plugin.retrieval.retriever import PrivateKNN, Retrieval
from dp_icl_plugin.templates.answer import AnswerTemplate
from dp_icl_plugin.timing import FixedLatency, as_fixed_latency

__all__ = ["DEFAULT_KEYWORD_INDEX", "KNNKeywordDecoder", "build_keyword_decoder"]

DEFAULT_KEYWORD_INDEX = "knn-keywords"


class KNNKeywordDecoder(KNNDecoder):
    """DP answers from keyword hints: the query's candidate records vote keywords, released by a Gaussian threshold,
    and the public model answers with them; see the module.

    Implements the :class:`~dp_icl_plugin.decoding.contract.Decoder` contract, so it serves the LangChain chat
    model / LLM and the LlamaIndex LLM like the other decoders.

    Args:
        knn: the private index, ledger, backend and settings, built for ``"answer"`` releases (records voting:
            ``KNNConfig(keyword_source="records")``; shards of LLM answers work too).
        template: how a completion query forms a prompt (default: ``AnswerTemplate(stop=None)``).
        fixed_latency: hide timing: every answer returns this many seconds after it starts; default the
            PrivateKNN's.
        choices: public answers every answer is restricted to (the hints only steer among them).
        keywords: how many keywords an answer's release publishes (default ``knn.config.keywords``).

    Raises:
        ConfigurationError: the retriever has no backend or cannot make ``"answer"`` releases.

    Warns:
        WeakReleaseWarning: records voting need more of them to share a word than ``config.k`` (said before the
            filter's cover when the retriever was built with ``releases=("answer",)``).
    """

    kind = "knn-keywords"
    release = "answer"

    def __init__(
        self,
        knn: PrivateKNN,
        *,
        template: AnswerTemplate | None = None,
        fixed_latency: float | FixedLatency | None = None,
        choices: Sequence[str] | AnswerChoices | None = None,
        keywords: int | None = None,
    ) -> None:
        if not isinstance(knn, PrivateKNN):
            raise ConfigurationTypeError("knn must be a PrivateKNN")
        if knn.backend is None:
            raise ConfigurationError("keyword hints need the PrivateKNN's backend (a language model)")
        knn._require("answer")
        super().__init__(
            backend=knn.backend,
            budget=knn.budget,
            template=template,
            max_tokens=knn.config.max_answer_tokens if choices is None else None,
            fixed_latency=knn.fixed_latency if fixed_latency is None else fixed_latency,
            choices=choices,
        )
        if self.max_tokens > knn.config.max_answer_tokens:
            raise ConfigurationError(
                f"the choices need {self.max_tokens} tokens, more than config.max_answer_tokens "
                f"({knn.config.max_answer_tokens})"
            )
        self.knn = knn
        self.keywords = knn.config.keywords if keywords is None else check.positive_int("keywords", keywords)
        if "answer" not in knn.asked_releases and knn.config.records_vote:  # a retriever for answers warned already
            knn.warn_if_weak_hints()

    def records_to_agree(self) -> int:
        """About how many candidate records must share a keyword for it to pass half the time: ⌈T⌉ (public)."""
        threshold, _ = self.knn.keyword_outlook()
        return math.ceil(threshold)

    def answer_event(self, max_tokens: int | None = None, *, schema: object | None = None) -> ev.DPEvent:
        """What one answer costs a record that is a candidate (its own filter pays it): one keyword release,
        whatever the answer's length, choices or schema (the tokens are the public model's).

        Args:
            max_tokens: the answer's limit (default: the decoder's).
            schema: a public JSON schema the answer follows, or None.

        Raises:
            ConfigurationError: ``max_tokens`` is not a positive integer, or a schema that does not compile.
        """
        return super().answer_event(max_tokens, schema=schema)

    def _prepare(self, query, max_tokens, stop, schema=None):
        limit, stops, prompt, rules = super()._prepare(query, max_tokens, stop, schema)
        # public: the prompt with the most keywords a release can give must fit beside the answer, or the hint
        # line would be cut from its front after the charge (placeholders stand for the words)
        capacity = context_limit(self.backend)
        full = self.hinted(prompt, ["x"] * self.keywords)
        hinted = (
            self.backend.encode(self.template.zero_shot_prompt(full), add_special_tokens=True)
            if isinstance(full, str)
            else chat_ids(self.backend, list(full))
        )
        if capacity is not None and len(hinted) + limit > capacity:
            raise ConfigurationError(
                f"the query is too long: with {self.keywords} keywords its prompt takes {len(hinted)} of the "
                f"model's {capacity} positions and the answer {limit} more"
            )
        return limit, stops, prompt, rules

    def _steps_event(self, steps: int) -> ev.DPEvent:
        return self.knn._event("answer", 1, self.knn.config.k)

    def _charge(self, prompt, steps: int) -> tuple[LedgerEntry, Any]:
        query = query_text(prompt)
        admitted, entry, k = self.knn._charge_release(query, "answer", None, None, answer_prompt_checked=True)
        return entry, _Charged(query, admitted, k, entry.id)  # the records are read in _tokens, after the charge

    def _pieces(self, prompt, limit, stops, rng, state: AnswerState, paid: Any) -> Iterator[str]:
        paid.state = state  # the answer's bookkeeping, where _tokens reports the released words
        return super()._pieces(prompt, limit, stops, rng, state, paid)

    def hinted(self, query: str | tuple[dict[str, str], ...], keywords: Sequence[str] | None):
        """The public prompt with released ``keywords`` (public, DP): an instruction line before a completion
        query, or a system message of a chat (appended to its own system message); the query itself when none.

        Args:
            query: the checked query.
            keywords: the released keywords, or None.
        """
        if not keywords:
            return query
        line = self.knn.keyword_prompt.instruction.format(keywords=", ".join(keywords))
        if isinstance(query, str):
            return f"{line}\n{query}"
        messages = [dict(m) for m in query]
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{line}"
        else:
            messages.insert(0, {"role": "system", "content": line})
        return tuple(messages)

    def _tokens(self, prompt, limit: int, rng: np.random.Generator, paid: Any, rule: Any) -> Generator[int, None, None]:
        used, records = self.knn._charged_records(paid.admitted, "answer", paid.k)
        retrieval = Retrieval("answer", paid.query, used, records, paid.k, paid.entry, charged_by=self.knn)
        words = self.knn._keywords_of(retrieval, self.keywords, rng)  # the release (DP)
        if paid.state is not None:
            paid.state.released = words or ()
        # Everything below is post-processing: the public model, the query and the released words.
        yield from self._public_greedy(self._ids(self.hinted(prompt, words), None, reserve=limit - 1), [], limit, rule)


@dataclass
class _Charged:
    """One charged answer: its query, the admitted candidates, k, its ledger entry, and its bookkeeping."""

    query: str
    admitted: Candidates
    k: int
    entry: int
    state: AnswerState | None = None


def build_keyword_decoder(
    backend: NextTokenBackend,
    dataset: PrivateDataset,
    *,
    budget: BudgetManager,
    epsilon: float,
    n_queries: int,
    delta: float | None = None,
    max_tokens: int = 64,
    k: int = 40,
    min_similarity: float = 0.3,
    uses: int | None = None,
    population_size: int | None = None,
    embedder: object | None = None,
    keywords: int = 5,
    keywords_per_record: int = 4,
    template: AnswerTemplate | None = None,
    fixed_latency: float | FixedLatency | None = None,
    choices: Sequence[str] | None = None,
    records_per_unit: int | None = None,
    index_path: str | os.PathLike[str] | None = None,
    index_name: str = DEFAULT_KEYWORD_INDEX,
    keep_index: bool = True,
) -> KNNKeywordDecoder:
    """Keyword hints over a dataset: its records go into a :class:`PrivateIndex` whose per-record filter is covered
    by ``epsilon`` (and δ) on the ledger once, kept beside a durable ledger as for
    :func:`~dp_icl_plugin.decoding.knn_experts.build_expert_decoder` (an app that starts again reopens it and pays
    no second cover). Each answer is one keyword release by the query's candidate records; the public model
    answers from the released keywords.

    Args:
        backend: the language model.
        dataset: the private records (text, label); a record votes the keywords of its label (its answer), so a
            dataset of free-text answers gives content words and one of class labels gives the label's words.
        budget: the shared ledger; the filter's total is charged to it once, here.
        epsilon: this decoder's share of the ledger.
        n_queries: the answers expected; with ``k`` it sets ``uses`` (⌈n_queries·k/N⌉ answers per record).
        delta: δ of the share (default: half the ledger's δ).
        max_tokens: the answer limit (free: the public model writes it).
        k: the candidates expected per query (public): with ``n_queries`` it sets ``uses``; set
            ``min_similarity`` so that about this many records pass
            (:func:`~dp_icl_plugin.planning.estimate_min_similarity`).
        min_similarity: the public similarity a record needs to vote (and pay).
        uses: answers per record; or give the public ``population_size`` (required under add/remove).
        population_size: N, the public population size ``uses`` is computed from.
        embedder: the embedder (default all-MiniLM-L6-v2).
        keywords: the most keywords an answer's release publishes.
        keywords_per_record: m, the keywords each record votes (the sensitivity is √m per record).
        template: how a completion query forms a prompt.
        fixed_latency: hide timing (seconds or a shared :class:`~dp_icl_plugin.timing.FixedLatency`).
        choices: public answers every answer is restricted to.
        records_per_unit: under a unit-level ledger, the most records one person votes with (its most similar;
            default ``dataset.records_per_unit``).
        index_path: where the index is kept (default beside the ledger, as ``index_name``).
        index_name: the kept index's name (default ``"knn-keywords"``).
        keep_index: False keeps the index in memory only (every start then pays the cover again).

    Raises:
        ConfigurationError: a bad setting, or a kept index with other records or another budget (before anything
            is charged).
        BudgetExhaustedError: the ledger cannot afford the filter's charge.
    """
    check_dataset_settings(dataset, budget=budget, keep_index=keep_index)
    if template is not None and not isinstance(template, AnswerTemplate):
        raise ConfigurationTypeError("template must be an AnswerTemplate")
    answers = None if choices is None else AnswerChoices.of(backend, choices)
    if answers is not None and answers.max_tokens > check.positive_int("max_tokens", max_tokens):
        raise ConfigurationError(
            f"max_tokens = {max_tokens} is below the {answers.max_tokens} tokens the longest choice needs: raise it"
        )
    fixed_latency = as_fixed_latency(fixed_latency)
    knn = knn_for_dataset(
        backend,
        dataset,
        budget=budget,
        epsilon=epsilon,
        n_queries=n_queries,
        delta=delta,
        k=k,
        uses=uses,
        population_size=population_size,
        embedder=embedder,
        per_unit_limit=records_per_unit,
        index_path=index_path,
        index_name=index_name,
        keep_index=keep_index,
        releases=("answer",),
        settings={
            "min_similarity": min_similarity,
            "max_answer_tokens": max_tokens,
            "keyword_source": "records",
            "keywords": check.positive_int("keywords", keywords),
            "keywords_per_answer": check.positive_int("keywords_per_record", keywords_per_record),
        },
    )
    return KNNKeywordDecoder(knn, template=template, fixed_latency=fixed_latency, choices=answers)
