"""The release paths the canary and membership audits run on the copy model, each as the library ships it.

A private record is ``prefix secret``: four random names and a three-digit number (``bak mir fal kun 417``).
Every path takes the records (and, for the answering paths, public queries: record prefixes), runs the
library's method with a fresh in-memory ledger, and returns what it releases as text:

- synthesis (:func:`synthesize`): PTA or clip-blend synthetic demonstrations, or the noiseless versions
  (``epsilon=inf``: ``synthesize_nonprivate``); ``"real"`` returns real records instead;
- DP decoding (:func:`decode`): :class:`MozoDecoder` or :class:`ClipBlendDecoder` answering each query
  (``epsilon=inf``: greedy decoding with the 4 records nearest the query in the prompt);
- kNN (:func:`knn_answer`): :meth:`PrivateKNN.answer` (keyword-space aggregation) over a
  :class:`PrivateIndex` embedded with MiniLM (``epsilon=inf``: greedy decoding with the 4 nearest records).

All prompts use ``;`` between records, the only layout this word-level model knows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from dp_icl_plugin import (
    AnswerTemplate,
    BudgetManager,
    ClipBlendSynthesizer,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PTASynthesizer,
)
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.backends.generation import greedy_generate
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.retrieval import AnswerPrompt, KeywordAnswerPrompt, KNNConfig, PrivateIndex, PrivateKNN
from dp_icl_plugin.retrieval.embedding import default_embedder, embed_texts
from dp_icl_plugin.templates.demonstration import PromptTemplate

INF = math.inf
LABEL = "rec"
# synthesis prompts: "rec : <record> ; rec : <record> ; rec :" and the demonstration is generated after it
SYNTH_TEMPLATE = PromptTemplate(header="", example="{label} : {text} ; ", query="{label} :", base=":", stop=";")
# decoding prompts: "<record> ; <query>" (one-shot) and "<query>" (zero-shot); the answer ends at ";"
DECODE_TEMPLATE = AnswerTemplate(header="", example="{text} ; ", query="{input}", stop=";")
# kNN shard prompts: "; <prefix> <secret> ; <prefix> <secret> ; <query>"; final prompt "<keywords> ; <query>"
KNN_PROMPT = AnswerPrompt(context_prefix=";", answer_prefix="", question_prefix=";", separator=" ")
KEYWORD_PROMPT = KeywordAnswerPrompt(instruction="{keywords} ;", question_prefix="", answer_prefix="", separator=" ")
ANSWER_TOKENS = 2  # the secret, then ";"
# Public records that open every context the secret is ranked in, so that a short release (one answer) is
# ranked in the same kind of context as a long one (the model copies best a few records into a stream).
PREAMBLE = "lak dor fim sun 250 ; tip gev rob mas 731 ; kez nal pud vog 468"


def eps_name(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def dataset(records: Sequence[str]) -> PrivateDataset:
    # one label: its size is |D|, public under replace-one and fixed by the experiment
    return PrivateDataset([PrivateRecord(r, LABEL) for r in records], labels=[LABEL], public_label_counts="observed")


def ledger(epsilon: float, n_records: int) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon, 1 / n_records))


def synthesize(
    method: str, epsilon: float, records: Sequence[str], backend: Any, *, rng: np.random.Generator, shots: int = 4
) -> list[str]:
    """``shots`` demonstrations from ``method`` (``pta``, ``clip_blend``, or ``real``: records drawn at random)."""
    if method == "real":
        return [records[int(i)] for i in rng.choice(len(records), shots, replace=False)]
    data, delta = dataset(records), 1 / len(records)
    if method == "pta":
        synth: Any = PTASynthesizer(
            epsilon=None if math.isinf(epsilon) else epsilon,
            noise_multiplier=1.0 if math.isinf(epsilon) else None,
            delta=delta,
            alpha=2.0,
            n_prompts=5,
            records_per_prompt=max(1, len(records) // 25),
            max_tokens=6,
            shots_per_label=shots,
            top_k=100,
            template=SYNTH_TEMPLATE,
        )
    elif method == "clip_blend":
        synth = ClipBlendSynthesizer(
            epsilon=None if math.isinf(epsilon) else epsilon,
            temperature=1.0 if math.isinf(epsilon) else None,
            delta=delta,
            max_tokens=6,
            shots_per_label=shots,
            subset_size=len(records) // shots,
            template=SYNTH_TEMPLATE,
        )
    else:
        raise ValueError(method)
    if math.isinf(epsilon):  # the same computation without noise (its config's noise is then unused)
        demos = synth.synthesize_nonprivate(data, backend=backend, rng=rng, progress=False)
    else:
        demos = synth.synthesize(data, backend=backend, budget=ledger(epsilon, len(records)), rng=rng, progress=False)
    return [d.text.strip() for d in demos]


def nearest(records: Sequence[str], query: str, n: int) -> list[str]:
    """The ``n`` records most similar to the query under MiniLM (what a non-private retriever would use)."""
    vectors = embed_texts(embedder(), [query, *records])
    order = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable")
    return [records[int(i)] for i in order[:n]]


def plain_answers(records: Sequence[str], queries: Sequence[str], backend: Any) -> list[str]:
    """ε = ∞: greedy answers with the 4 records nearest each query in the prompt (retrieval-augmented)."""
    prompts = [" ; ".join(nearest(records, q, 4)) + f" ; {q}" for q in queries]
    outs = greedy_generate(
        backend, [backend.encode(p, add_special_tokens=True) for p in prompts], max_new_tokens=ANSWER_TOKENS
    )
    return [backend.decode(o).split(";")[0].strip() for o in outs]


def decode(
    kind: str, epsilon: float, records: Sequence[str], queries: Sequence[str], backend: Any, *, rng: np.random.Generator
) -> list[str]:
    """DP decoding of every query (one share of ε for all of them) by ``kind`` (``mozo``, ``clip_blend``, or
    ``plain``: :func:`plain_answers`). ``epsilon=inf``: the same decoder with its noise all but switched off
    (MOZO β = 1,000, clip-blend τ = 0.001: a ledger of ε = 10¹²)."""
    if kind == "plain":
        return plain_answers(records, queries, backend)
    off = math.isinf(epsilon)
    data, budget = dataset(records), ledger(1e12 if off else epsilon, len(records))
    common = {
        "backend": backend,
        "budget": budget,
        "n_queries": len(queries),
        "max_tokens": ANSWER_TOKENS,
        "template": DECODE_TEMPLATE,
    }
    if kind == "mozo":
        noise = {"beta": 1e3} if off else {"epsilon": epsilon}
        decoder: Any = MozoDecoder(data, n_shots=4, top_k=100, **common, **noise)
    elif kind == "clip_blend":
        noise = {"temperature": 1e-3} if off else {"epsilon": epsilon}
        decoder = ClipBlendDecoder(data, subset_size=max(1, len(records) // 4), rng_subset=rng, **common, **noise)
    else:
        raise ValueError(kind)
    return [decoder.generate(q, rng=rng).text.strip() for q in queries]


class _CachedEmbedder:
    """MiniLM with a cache by text: the audits embed the same records again and again (the vectors are the same)."""

    dp_icl_name = "sentence-transformers/all-MiniLM-L6-v2 (cached)"

    def __init__(self) -> None:
        self.model = default_embedder()
        self.vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        missing = sorted({t for t in texts if t not in self.vectors})
        if missing:
            self.vectors.update(zip(missing, embed_texts(self.model, missing), strict=True))
        return np.stack([self.vectors[t] for t in texts])


@cache
def embedder() -> Any:
    return _CachedEmbedder()


def knn_answer(
    epsilon: float,
    records: Sequence[tuple[str, str]],
    queries: Sequence[str],
    backend: Any,
    *,
    rng: np.random.Generator,
    noise_off: bool = False,
) -> list[tuple[str, str]]:
    """(released keywords, answer) per query from :meth:`PrivateKNN.answer`, each record paying for all
    queries (``uses``) out of its own ε; ``epsilon=inf``: no keywords, :func:`plain_answers`;
    ``noise_off``: the same release with σ = 10⁻³ on the keyword histogram (no privacy to speak of)."""
    if math.isinf(epsilon) and not noise_off:
        return [("", a) for a in plain_answers([f"{p} {s}" for p, s in records], queries, backend)]
    per_record = 1e9 if noise_off else epsilon
    index = PrivateIndex(budget=IndividualBudget(epsilon=per_record, delta=1e-5), embedder=embedder())
    index.add([p for p, _ in records], answers=[s for _, s in records])
    noise = {"noise_std": 1e-3, "keyword_noise_std": 1e-3} if noise_off else {}
    # one-token answers and one keyword: the shards' answers are the secret or not, nothing else to count.
    # The paper's PTR release, as when the committed tables were measured (the threshold release, now the
    # default, needs T = 39.6 shards at ε = 8 and 20 uses with m = 4, 19.8 with m = 1: with 5 shards, never).
    config = KNNConfig(
        k=20,
        shards=5,
        min_similarity=-1.0,
        uses=len(queries),
        keywords=1,
        max_answer_tokens=1,
        keyword_release="ptr",
        **noise,
    )
    ledger = BudgetManager(PrivacyBudget(per_record, 1e-5, neighbouring="add_remove"))  # the filter's own relation
    retriever = PrivateKNN(
        index, budget=ledger, backend=backend, config=config, answer_prompt=KNN_PROMPT, keyword_prompt=KEYWORD_PROMPT
    )
    out = []
    for q in queries:
        answer = retriever.answer(q, rng=rng)
        out.append((" , ".join(answer.keywords or ()), answer.text.split(";")[0].strip()))
    return out


def secret_logprob(backend: Any, context: str, prefix: str, secret: str) -> tuple[float, int]:
    """Log-probability and rank (1 = top) of the secret's token after ``PREAMBLE ; context ; prefix``."""
    text = " ; ".join(part for part in (PREAMBLE, context, prefix) if part)
    ids = backend.encode(text, add_special_tokens=True)
    logprobs = backend.next_token_logprobs([ids[-(backend.max_length - 1) :]])[0]
    (token,) = backend.encode(secret)
    return float(logprobs[token]), int((logprobs > logprobs[token]).sum()) + 1
