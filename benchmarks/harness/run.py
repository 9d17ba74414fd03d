"""One real-text harness: does the private data make a difference a user can see?

Every row answers the same held-out queries with the same prompt layout on the same real model
(SmolLM2-135M-Instruct, float32 on CPU unless ``--device``), and is compared with what the user already has
without private data, **greedy zero-shot**, and with the non-private ceiling, **kNN RAG** (the nearest
records as the examples of one prompt, greedy). Per task:

- ``e2e`` (answers): the E2E dev pairs (4,672, meaning representation → reference) are the private records;
  queries are test MRs. Score: ROUGE-L F1 against the best reference (``rouge-score``, stemming) ×100. Chat
  layout of the DPS-MOZO paper (instruction as system turn, a record as an earlier exchange).
- ``trec`` (classification): the TREC training questions (5,452) are the private records, test questions
  the queries; the header names the six types. Score: the answer names the right type (accuracy ×100).
- ``triage`` (an app-shaped task): route news items to one of four desks (World, Sports, Business,
  Technology), 2,000 AG News items as the private "tickets" (public benchmark text standing in for private
  tickets: AG News is the only routing-style set in ``../shared/data``), queries from the rest. Accuracy.

Rows, each on its own ledger ``PrivacyBudget(ε, δ = 1e-5)`` (replace-one) at ε ∈ {1, 2, 4, 8}; for the kNN
rows the per-record filter budget whose cover on that ledger is (ε, δ) (ε/2 per record,
:func:`~dp_icl_plugin.decoding.knn_experts.filter_budget_for`):

- ``sparse expert decoding`` (``--methods sparse``): the same with ``paid_tokens = --paid-tokens`` (default 2):
  the public greedy token wherever the sparse-vector test finds no departure, at most P paid tokens an answer;
  the row records the mean number an answer paid.
- ``expert decoding, paid per token`` (``--methods experts-per-token``): the same decoder with
  ``pay_per_token=True``: every candidate's filter is charged one token right before each token mechanism; the row
  records the tokens each answer paid beside its worst case, and both as a one-candidate record's ε for the answer
  (:meth:`Harness._answer_all_filtered`).
- ``expert decoding``: :class:`~dp_icl_plugin.retrieval.KNNExpertDecoder` (``build_expert_decoder``), the
  k nearest records with budget left as experts of every token; ``min_similarity`` and ``uses`` chosen on public
  data only (:meth:`Harness.threshold`): the tune queries against public stand-ins for the records (TREC: the other
  tune questions; triage: 2,000 AG News items that are neither records nor queries; E2E: the tune MRs of other
  restaurants than the query's, as the records name other restaurants than the test MRs), never the records.
- ``DPS-MOZO decoding``: :class:`MozoDecoder` (ε for the run's answers, β calibrated).
- ``clip-blend decoding``: :class:`ClipBlendDecoder` (a fixed subset of 40 records, τ calibrated).
- ``..., paid per token`` (``--methods mozo-per-token,clip-blend-per-token``): the same decoders with
  ``pay_per_token=True``: the row's ε is an allowance (at δ/10, so that its cover leaves the ledger's δ room)
  drawn on once per token mechanism; the noise calibrated for the queries' answers of ``--expected-tokens``
  tokens (default: the mean length, EOS included, of the greedy zero-shot answers to 50 tune queries: public).
  Every MOZO and clip-blend row records the tokens its answers ran and what an answer paid as ε beside its
  worst-case charge (:meth:`Harness._answer_all_paid`).
- ``kNN vote`` (classification): :meth:`PrivateKNN.vote`, report-noisy-max over the k nearest labels (no LLM).
- ``kNN keyword answer`` (e2e): :meth:`PrivateKNN.answer`; refused before any charge when no keyword could
  pass its threshold (then the row says so).
- ``keyword hints (records vote)`` (``--methods keyword-hints``): :class:`~dp_icl_plugin.decoding.knn_keywords
  .KNNKeywordDecoder` (``build_keyword_decoder``): every candidate above the experts' public ``min_similarity``
  votes its own keywords (E2E: 4 words of its reference; classification: its label), the threshold release
  publishes what about T of them share, and the public model answers greedy with those words in its prompt.
- ``pay once: <method> demonstrations`` (``--methods tang,pta,adadpsyn,clip-blend-synthesis``; classification
  with the labels as choices): one DP demonstration per label synthesized once on the row's ledger (label counts
  declared public), then every query answered few-shot with them; with each demonstration's agreement with the
  public model's own label for it and its per-token NLL beside a real record's (:meth:`Harness.synthesis`).
- ``few-shot greedy, the label names as examples`` (``--methods public-layout``; classification with choices, no
  private data, once per task): the pay-once rows' prompt with each label's name as its example's text, the
  layout alone (:meth:`Harness.public_layout`).
- ``pay once: DPS-MOZO+Off`` and ``pay once: Tang aggregation`` (``--methods mozo-offline,tang-answers``; free
  text, E2E): DP answers to 4 public tune inputs synthesized once on the row's ledger
  (:class:`~dp_icl_plugin.MozoOfflineSynthesizer`, :class:`~dp_icl_plugin.TangAnswerSynthesizer`), then every
  query answered greedy with those pairs as its examples; beside them the same decoding with 4 random real records
  (NOT private), the best such demonstrations can give (:meth:`Harness._pay_once_answers`).

Classification rows answer with one of the labels (``choices``: every token restricted to those continuing a
label, :mod:`dp_icl_plugin.decoding.choices`; ``--free-answers`` lets them write anything), and so does the
baseline they are compared with, greedy zero-shot restricted to the labels (the free greedy zero-shot row is
shown too); the ceiling is restricted the same way.

Gains are paired per query against greedy zero-shot, with 95 % bootstrap intervals (2,000 resamples, seeded);
"recovered" is the gain over the ceiling's gain. Queries: ``--split held-out`` (default) draws them from a part
of the test data that no setting was chosen on; ``--split tune`` from the part used to choose the expert
defaults (T0, k, ``uses`` margin). Seeds are fixed (benchmarks only).

    python benchmarks/harness/run.py                 # every task, 100 held-out queries, ε ∈ {1, 2, 4, 8}
    python benchmarks/harness/run.py --quick         # 12 queries, ε = 4, e2e 8 tokens: minutes on 2 cores

Writes ``results/harness[_quick].{json,md,png}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1].parent / "shared" / "data"
sys.path.insert(0, str(HERE.parent / "knn"))
sys.path.insert(0, str(HERE.parent / "e2e"))

DELTA = 1e-5
MODEL = "smollm2-135m-instruct"
E2E_INSTRUCTION = "Please convert the structured data into natural language."
TREC_NAMES = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}
DESKS = {"1": "World", "2": "Sports", "3": "Business", "4": "Technology"}


@dataclass
class Task:
    """One task: private records, public queries, one prompt layout, a per-query score."""

    name: str
    metric: str
    records: list[tuple[str, str]]
    queries: list[str]
    tune_queries: list[str]  # public: the part of the test data settings were chosen on
    header: str
    example: str
    query: str
    max_tokens: int
    k: int
    ceiling_shots: int
    score: Callable[[int, str], float]
    labels: list[str] | None = None
    truth: list[str] = field(default_factory=list)
    synth_tokens: int = 24  # a synthetic demonstration's tokens (pay-once rows)
    # public stand-ins for the records when settings are chosen (never a record, never a held-out query), and for
    # each tune query the stand-ins it may not be compared with (itself; on E2E its own restaurant's MRs)
    proxy: list[str] = field(default_factory=list)
    proxy_excluded: Callable[[int, int], bool] = lambda query, item: False


def _clean(text: str) -> str:
    """An answer up to the chat end marker (a tokenizer that does not stop or skip it leaves it in the text)."""
    return text.split("<|im_end|>")[0].split("<|endoftext|>")[0].strip()


def _label_of(text: str, labels: list[str]) -> str | None:
    words = _clean(text).lower().replace(".", " ").split()
    if not words:
        return None
    hits = [y for y in labels if y.lower().startswith(words[0]) and len(words[0]) >= 3]
    return hits[0] if len(hits) == 1 else None


def e2e_task(n: int, split: str, quick: bool) -> Task:
    with open(DATA / "e2e" / "devset.csv", newline="", encoding="utf-8") as fh:
        records = [(r["mr"], r["ref"]) for r in csv.DictReader(fh)]
    refs: dict[str, list[str]] = {}
    with open(DATA / "e2e" / "testset_w_refs.csv", newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            refs.setdefault(r["mr"], []).append(r["ref"])
    mrs = list(refs)
    order = np.random.default_rng(2026).permutation(len(mrs))
    tune, held = [mrs[i] for i in order[:200]], [mrs[i] for i in order[200:]]
    queries = (tune if split == "tune" else held)[:n]
    from rouge_score import rouge_scorer

    rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

    def score(i: int, out: str) -> float:
        return 100 * max(rouge.score(ref, _clean(out))["rougeL"].fmeasure for ref in refs[queries[i]])

    def restaurant(mr: str) -> str:
        return mr.split("name[", 1)[1].split("]", 1)[0] if "name[" in mr else mr

    return Task(
        "e2e",
        "ROUGE-L",
        records,
        queries,
        tune,
        f"<|im_start|>system\n{E2E_INSTRUCTION}<|im_end|>\n",
        "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{label}<|im_end|>\n",
        "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n",
        8 if quick else 25,
        16,
        4,
        score,
        # the tune MRs stand in for the records; the dev records name other restaurants than the test MRs, so a
        # tune query is compared with the MRs of other restaurants only
        proxy=tune,
        proxy_excluded=lambda query, item: restaurant(tune[query]) == restaurant(tune[item]),
    )


def classification_task(name: str, n: int, split: str) -> Task:
    if name == "trec":

        def read(path: Path) -> tuple[list[str], list[str]]:
            lines = path.read_text(encoding="latin-1").splitlines()
            return [ln.split(" ", 1)[1] for ln in lines], [TREC_NAMES[ln.split(":", 1)[0]] for ln in lines]

        pool_x, pool_y = read(DATA / "trec" / "train.txt")
        test_x, test_y = read(DATA / "trec" / "test.txt")
        labels, item = sorted(TREC_NAMES.values()), "question"
        proxy_items = None  # the tune questions themselves (no TREC pool is public beside the records)
    else:
        with open(DATA / "agnews" / "test.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        texts = [f"{r['Title']}. {r['Description']}".replace("\\", " ")[:400] for r in rows]
        ys = [DESKS[r["Class Index"]] for r in rows]
        order = np.random.default_rng(7).permutation(len(texts))
        pool_x, pool_y = [texts[i] for i in order[:2000]], [ys[i] for i in order[:2000]]
        test_x, test_y = [texts[i] for i in order[2000:3000]], [ys[i] for i in order[2000:3000]]
        proxy_items = [texts[i] for i in order[3000:5000]]  # public items, neither records nor queries
        labels, item = list(DESKS.values()), "news item"
    order = np.random.default_rng(2026).permutation(len(test_x))
    tune_idx, held_idx = order[:200], order[200:]
    chosen = (tune_idx if split == "tune" else held_idx)[:n]
    queries, truth = [test_x[i] for i in chosen], [test_y[i] for i in chosen]
    kind = "type" if name == "trec" else "desk"
    header = f"<|im_start|>system\nAnswer with the {kind} of the {item}, one of: {', '.join(labels)}.<|im_end|>\n"

    def score(i: int, out: str) -> float:
        return 100.0 * (_label_of(out, labels) == truth[i])

    return Task(
        "trec" if name == "trec" else "triage",
        "accuracy",
        list(zip(pool_x, pool_y, strict=True)),
        queries,
        [test_x[i] for i in tune_idx],
        header,
        "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{label}<|im_end|>\n",
        "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n",
        3,
        40,
        8,
        score,
        labels,
        truth,
        proxy=[test_x[i] for i in tune_idx] if proxy_items is None else proxy_items,
        proxy_excluded=(lambda query, item: query == item) if proxy_items is None else (lambda query, item: False),
    )


class Harness:
    """Models, embeddings and rows for one task."""

    def __init__(self, task: Task, args) -> None:
        from accuracy import Lookup

        from dp_icl_plugin import AnswerTemplate
        from dp_icl_plugin.retrieval import default_embedder
        from dp_icl_plugin.retrieval.embedding import embed_texts

        self.task, self.args = task, args
        self.template = AnswerTemplate(header=task.header, example=task.example, query=task.query, stop="\n")
        texts = [x for x, _ in task.records]
        if args.embeddings:  # precomputed (a machine without the MiniLM files): every text must be in the table
            table = load_table(args.embeddings)
            self.record_vectors = np.stack([table[t] for t in texts])
            self.query_vectors = np.stack([table[t] for t in task.queries])
            self.tune_vectors = np.stack([table[t] for t in task.tune_queries])
            self.proxy_vectors = np.stack([table[t] for t in task.proxy])
            self.embedder = TableEmbedder(table)
        else:
            model = default_embedder()
            self.record_vectors = embed_texts(model, texts, batch_size=128)
            self.query_vectors = embed_texts(model, task.queries, batch_size=128)
            self.tune_vectors = embed_texts(model, task.tune_queries, batch_size=128)
            self.proxy_vectors = embed_texts(model, task.proxy, batch_size=128)
            self.embedder = Lookup(
                texts + task.queries + task.tune_queries,
                np.vstack([self.record_vectors, self.query_vectors, self.tune_vectors]),
                model,
            )
        self.expert_settings = {
            k: v for k, v in (("public_temperature", args.expert_t0), ("top_k", args.expert_top_k)) if v is not None
        }
        self._backends: dict[int, object] = {}
        self.choices = None  # classification: every LLM row (and the baselines) answers with one of the labels
        if task.labels is not None and not args.free_answers:
            from dp_icl_plugin.decoding.choices import AnswerChoices

            self.choices = AnswerChoices(self.backend(1), task.labels)
        self.rows: list[dict] = []
        self.on_row: Callable[[], None] = lambda: None
        self._expected: int | None = None  # expected_tokens, once computed
        self.zero: np.ndarray | None = None

    def backend(self, rows: int):
        from dp_icl_plugin.backends.loading import load_backend

        if rows not in self._backends:
            self._backends[rows] = load_backend(self.args.model, device=self.args.device, micro_batch_size=rows)
        return self._backends[rows]

    # -- scoring -----------------------------------------------------------------------------------------
    def add(self, method: str, epsilon: float, outputs: list[str] | None, seconds: float, **extra) -> None:
        task = self.task
        if outputs is None:
            row = {"task": task.name, "method": method, "epsilon": epsilon, "score": None, "seconds": seconds, **extra}
        else:
            scores = np.array([task.score(i, o) for i, o in enumerate(outputs)])
            row = {
                "task": task.name,
                "method": method,
                "epsilon": epsilon,
                "score": float(scores.mean()),
                "scores": scores.tolist(),
                "seconds": round(seconds, 1),
                "examples": outputs[:3],
                **extra,
            }
            if self.zero is not None:
                row.update(gain_interval(scores - self.zero))
        self.rows.append(row)
        self.on_row()
        shown = "refused" if row["score"] is None else f"{row['score']:.1f}"
        print(f"[{task.name}] {method} ε={epsilon:g}: {shown} ({seconds:.0f} s)", flush=True)

    # -- rows ----------------------------------------------------------------------------------------------
    def zero_shot(self) -> None:
        from dp_icl_plugin.backends.generation import greedy_generate

        started = time.perf_counter()
        b = self.backend(1)
        prompts = [b.encode(self.template.zero_shot_prompt(q), add_special_tokens=True) for q in self.task.queries]
        outs = [b.decode(o).strip() for o in greedy_generate(b, prompts, max_new_tokens=self.task.max_tokens)]
        self.add("zero-shot greedy (no private data)", 0.0, outs, time.perf_counter() - started)
        if self.choices is not None:  # the fair baseline where answers are restricted to the labels
            started = time.perf_counter()
            outs = [self.choices.greedy(b, p) for p in prompts]
            self.add(
                "zero-shot greedy, restricted to the labels (no private data)", 0.0, outs, time.perf_counter() - started
            )
        self.zero = np.asarray(self.rows[-1]["scores"])

    def ceiling(self) -> None:
        from dp_icl_plugin.backends.generation import greedy_generate

        started = time.perf_counter()
        b, t = self.backend(1), self.task
        sims = self.query_vectors @ self.record_vectors.T
        prompts = []
        for q, row in zip(t.queries, sims, strict=True):
            near = np.argsort(-row)[: t.ceiling_shots][::-1]  # the nearest last, closest to the query
            examples = "".join(self.template.example.format(text=t.records[i][0], label=t.records[i][1]) for i in near)
            prompts.append(b.encode(t.header + examples + t.query.format(input=q), add_special_tokens=True))
        if self.choices is None:
            outs = [b.decode(o).strip() for o in greedy_generate(b, prompts, max_new_tokens=t.max_tokens)]
        else:
            outs = [self.choices.greedy(b, p) for p in prompts]
        self.add(
            f"kNN RAG, {t.ceiling_shots} nearest (NOT private, the ceiling)",
            math.inf,
            outs,
            time.perf_counter() - started,
        )

    def _ledger(self, epsilon: float):
        from dp_icl_plugin import BudgetManager, PrivacyBudget

        return BudgetManager(PrivacyBudget(epsilon, DELTA))

    def _dataset(self):
        from dp_icl_plugin import PrivateDataset, PrivateRecord

        return PrivateDataset([PrivateRecord(x, y) for x, y in self.task.records])

    def _labels(self) -> list[str] | None:
        return None if self.choices is None else self.task.labels

    def _answer_all(self, decoder, seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        return [decoder.generate(q, rng=rng).text.strip() for q in self.task.queries]

    def threshold(self, k: int) -> tuple[float, int]:
        """``min_similarity`` and ``uses`` for k experts, chosen on public data only: the tune queries against the
        task's public stand-ins for the records (:attr:`Task.proxy`; no record, no held-out query). τ is the median
        over tune queries of the similarity at the stand-ins' rank that matches the k-th nearest of the N records
        (rank k·M/N among M stand-ins; N is public under the replace-one ledger, as ``build_expert_decoder`` reads
        it); ``uses`` covers the held-out queries at the tune queries' mean share of stand-ins above τ (×1.5).
        Nothing private is read, so the benchmark's ε is the whole cost (before issue 40 both were chosen from
        the tune queries' similarities to the private records, outside the accounting)."""
        return public_threshold(self.task, self.tune_vectors, self.proxy_vectors, k)

    def private_threshold(self, k: int) -> tuple[float, int]:
        """What :meth:`threshold` chose before issue 40, from the private records (for the record only)."""
        sims = self.tune_vectors @ self.record_vectors.T
        tau = float(np.median(-np.sort(-sims, axis=1)[:, k - 1]))
        mean_candidates = float((sims >= tau).sum(axis=1).mean())
        return tau, max(1, math.ceil(1.5 * len(self.task.queries) * mean_candidates / len(self.task.records)))

    def experts(self, epsilon: float, paid_tokens: int | None = None, per_token: bool = False) -> None:
        """Expert decoding (``build_expert_decoder``); ``paid_tokens``: sparse; ``per_token``: each token mechanism
        charged to the candidates' filters right before it runs (the row then records the tokens each answer paid
        beside its worst case, and both as a one-candidate record's ε for the answer)."""
        from dp_icl_plugin.decoding.knn_experts import build_expert_decoder

        t = self.task
        started = time.perf_counter()
        tau, uses = self.threshold(t.k)
        sparse = {} if paid_tokens is None else {"paid_tokens": paid_tokens}
        if per_token:
            sparse["pay_per_token"] = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decoder = build_expert_decoder(
                self.backend(t.k),
                self._dataset(),
                budget=self._ledger(epsilon),
                epsilon=epsilon,
                delta=DELTA * (1 - 1e-9),
                n_queries=len(t.queries),
                max_tokens=t.max_tokens,
                k=t.k,
                min_similarity=tau,
                uses=uses,
                embedder=self.embedder,
                template=self.template,
                choices=self._labels(),
                **self.expert_settings,
                **sparse,
            )
        tests: list = []  # sparse: each answer's sparse-vector state, to count the tokens it paid (benchmark only)
        if paid_tokens is not None:
            fresh = decoder._sparse_test
            decoder._sparse_test = lambda rng: tests.append(fresh(rng)) or tests[-1]  # type: ignore[method-assign]
        paid: dict = {}
        if per_token:
            outs, paid = self._answer_all_filtered(decoder, 11)
        else:
            outs = self._answer_all(decoder, 11)
        if paid_tokens is not None:
            sparse = {
                "paid_tokens": paid_tokens,
                "paid_tokens_mean": float(np.mean([test.given for test in tests])),
                "test_threshold": decoder.knn.config.expert_test_threshold,
            }
        name = (
            f"sparse expert decoding (k = {t.k}, P = {paid_tokens})"
            if paid_tokens is not None
            else f"expert decoding (k = {t.k}), paid per token"
            if per_token
            else f"expert decoding (k = {t.k})"
        )
        self.add(
            name,
            epsilon,
            outs,
            time.perf_counter() - started,
            min_similarity=round(tau, 3),
            uses=uses,
            **sparse,
            **paid,
            settings_from=SETTINGS_FROM,
            token_epsilon=decoder.token_epsilon,
            log_odds_range=decoder.clip / decoder.temperature,
            warned=[str(w.message)[:120] for w in caught],
        )

    def _answer_all_filtered(self, decoder, seed: int) -> tuple[list[str], dict]:
        """Every query's answer from an expert decoder paid per token, and what the answers paid: the token
        mechanisms each ran (one filter release each on the ledger) beside the answer's worst case, and both as
        the ε of one answer to a record with one candidate (the tightest accountant, at the row's δ)."""
        from dp_icl_plugin.accounting.accountants import tightest

        rng = np.random.default_rng(seed)
        outs, ran = [], []
        for q in self.task.queries:
            before = len(decoder.budget.history())
            outs.append(decoder.generate(q, rng=rng).text.strip())
            ran.append(len(decoder.budget.history()) - before)
        acc = tightest()
        worst_steps = decoder._steps(decoder.max_tokens)
        return outs, {
            "tokens_ran_mean": float(np.mean(ran)),
            "tokens_worst_case": worst_steps,
            "answer_epsilon_ran_mean": float(np.mean([acc.epsilon(decoder._steps_event(n), delta=DELTA) for n in ran])),
            "answer_epsilon_worst_case": acc.epsilon(decoder._steps_event(worst_steps), delta=DELTA),
        }

    def keyword_hints(self, epsilon: float) -> None:
        """Keyword hints (``build_keyword_decoder``): the candidates above the experts' public ``min_similarity``
        vote their own keywords (E2E: the reference's words; classification: the label's), the threshold release
        publishes those about T of them share, and the public model answers with them; the row records how
        often a keyword passed and T."""
        from dp_icl_plugin.decoding.knn_keywords import build_keyword_decoder

        t = self.task
        started = time.perf_counter()
        tau, uses = self.threshold(t.k)
        decoder = build_keyword_decoder(
            self.backend(1),
            self._dataset(),
            budget=self._ledger(epsilon),
            epsilon=epsilon,
            delta=DELTA * (1 - 1e-9),
            n_queries=len(t.queries),
            max_tokens=t.max_tokens,
            k=t.k,
            min_similarity=tau,
            uses=uses,
            embedder=self.embedder,
            template=self.template,
            choices=self._labels(),
            keywords_per_record=1 if t.labels is not None else 4,
        )
        released: list = []  # benchmark only: whether each answer's release passed a keyword
        release = decoder.knn._keywords_of
        decoder.knn._keywords_of = lambda *a: released.append(release(*a)) or released[-1]  # type: ignore[method-assign]
        outs = self._answer_all(decoder, 17)
        self.add(
            "keyword hints (records vote)",
            epsilon,
            outs,
            time.perf_counter() - started,
            min_similarity=round(tau, 3),
            uses=uses,
            settings_from=SETTINGS_FROM,
            records_to_agree=decoder.records_to_agree(),
            answers_with_keywords=sum(r is not None for r in released),
            keywords_example=[list(r) for r in released if r is not None][:5],
        )

    def expected_tokens(self) -> int:
        """The token mechanisms an answer is expected to run, from public data only: the mean length (its EOS
        included) of the greedy zero-shot answers to the first 50 tune queries, rounded up (``--expected-tokens``
        overrides it). What a per-token share is calibrated for."""
        from dp_icl_plugin.backends.generation import greedy_generate

        if self.args.expected_tokens is not None:
            return int(self.args.expected_tokens)
        if self._expected is None:
            b = self.backend(1)
            prompts = [
                b.encode(self.template.zero_shot_prompt(q), add_special_tokens=True)
                for q in self.task.tune_queries[:50]
            ]
            outs = greedy_generate(b, prompts, max_new_tokens=self.task.max_tokens)
            ran = [min(len(o) + 1, self.task.max_tokens) for o in outs]  # + the EOS that ended it, within the limit
            self._expected = min(self.task.max_tokens, math.ceil(float(np.mean(ran))))
        return self._expected

    def _per_token(self, per_token: bool) -> dict:
        """A per-token decoder's settings: with the labels as choices an answer runs at most their token
        decisions (public), which caps what it is expected to run."""
        if not per_token:
            return {}
        expected = self.expected_tokens()
        if self.choices is not None:
            expected = min(expected, self.choices.decisions)
        return {"pay_per_token": True, "expected_tokens": expected}

    def _answer_all_paid(self, decoder, seed: int) -> tuple[list[str], dict]:
        """Every query's answer, and what the answers paid: the token mechanisms each ran (per token: the draws
        on its allowance; per answer: its tokens, the EOS that ended it included) beside the answer's worst case,
        and both as ε at the row's δ (the tightest accountant, one answer alone)."""
        from dp_icl_plugin.accounting.accountants import tightest

        rng = np.random.default_rng(seed)
        outs, ran = [], []
        for q in self.task.queries:
            before = decoder.allowance.spent()[0] if decoder.allowance is not None else 0
            answer = decoder.generate(q, rng=rng)
            outs.append(answer.text.strip())
            if decoder.allowance is not None:
                ran.append(decoder.allowance.spent()[0] - before)
            else:
                ran.append(
                    len(answer.token_ids)
                    + (answer.finish_reason == "stop" and len(answer.token_ids) < decoder.max_tokens)
                )
        acc = tightest()
        paid = [acc.epsilon(decoder._steps_event(max(n, 1)), delta=DELTA) for n in ran]
        worst = acc.epsilon(decoder.answer_event(), delta=DELTA)
        return outs, {
            "tokens_ran_mean": float(np.mean(ran)),
            "tokens_worst_case": decoder.max_tokens,
            "answer_epsilon_ran_mean": float(np.mean(paid)),
            "answer_epsilon_worst_case": worst,
            "per_token": decoder.allowance is not None,
            **(
                {
                    "expected_tokens": self.expected_tokens(),
                    "allowance_draws": decoder.allowance.spent()[0],
                    "allowance_epsilon_used": decoder.allowance.spent()[1],
                }
                if decoder.allowance is not None
                else {}
            ),
        }

    def mozo(self, epsilon: float, per_token: bool = False) -> None:
        from dp_icl_plugin.decoding.decoders import MozoDecoder

        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decoder = MozoDecoder(
                self._dataset(),
                backend=self.backend(4),
                budget=self._ledger(epsilon),
                n_queries=len(self.task.queries),
                max_tokens=self.task.max_tokens,
                epsilon=epsilon,
                delta=DELTA / 10 if per_token else DELTA,  # an allowance's cover must leave the ledger's δ room
                order={1.0: 14.0, 2.0: 8.0}.get(epsilon, 5.0),
                template=self.template,
                choices=self._labels(),
                **self._per_token(per_token),
            )
        outs, paid = self._answer_all_paid(decoder, 12)
        self.add(
            "DPS-MOZO decoding, paid per token" if per_token else "DPS-MOZO decoding",
            epsilon,
            outs,
            time.perf_counter() - started,
            beta=decoder.beta,
            **paid,
            warned=[str(w.message)[:120] for w in caught],
        )

    def clip_blend(self, epsilon: float, per_token: bool = False) -> None:
        from dp_icl_plugin.decoding.decoders import ClipBlendDecoder
        from dp_icl_plugin.decoding.factory import step_rows

        started = time.perf_counter()
        s = 40
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = step_rows("clip-blend", {"subset_size": s})
            decoder = ClipBlendDecoder(
                self._dataset(),
                backend=self.backend(rows),
                budget=self._ledger(epsilon),
                n_queries=len(self.task.queries),
                max_tokens=self.task.max_tokens,
                epsilon=epsilon,
                delta=DELTA / 10 if per_token else DELTA,  # an allowance's cover must leave the ledger's δ room
                subset_size=s,
                rng_subset=np.random.default_rng(13),
                template=self.template,
                choices=self._labels(),
                **self._per_token(per_token),
            )
        outs, paid = self._answer_all_paid(decoder, 14)
        self.add(
            "clip-blend decoding (s = 40), paid per token" if per_token else "clip-blend decoding (s = 40)",
            epsilon,
            outs,
            time.perf_counter() - started,
            temperature=decoder.temperature,
            **paid,
            warned=[str(w.message)[:120] for w in caught],
        )

    def synthesis(self, name: str, epsilon: float) -> None:
        """Pay once: ``name``'s DP demonstrations (one per label), synthesized once on the row's ledger, then every
        query answered few-shot with them (greedy, restricted to the labels like its baseline). The label counts
        are declared public (as the synthesis papers' experiments do). Also measured, to say why demonstrations
        help or not: how often the public model, restricted zero-shot, gives a demonstration its own label
        (``label_agreement``), and the demonstrations' mean per-token NLL under the public model beside that of
        one real record per label (``nll``, ``real_nll``; lower is more fluent)."""
        from collections import Counter

        from dp_icl_plugin import PrivateDataset, PrivateRecord
        from dp_icl_plugin.synthesis import (
            AdaDPSynSynthesizer,
            ClipBlendSynthesizer,
            PTASynthesizer,
            TangSynthesizer,
        )
        from dp_icl_plugin.templates import PRESETS

        t = self.task
        assert t.labels is not None and self.choices is not None
        started = time.perf_counter()
        classes = {"tang": TangSynthesizer, "pta": PTASynthesizer, "adadpsyn": AdaDPSynSynthesizer}
        classes["clip-blend-synthesis"] = ClipBlendSynthesizer
        template = PRESETS["trec" if t.name == "trec" else "agnews"]
        method = classes[name](epsilon=epsilon, delta=DELTA, template=template, max_tokens=t.synth_tokens)
        dataset = PrivateDataset(
            [PrivateRecord(x, y) for x, y in t.records],
            labels=t.labels,
            public_label_counts=dict(Counter(y for _, y in t.records)),
        )
        demos = method.synthesize(
            dataset,
            labels=t.labels,
            backend=self.backend(8),
            budget=self._ledger(epsilon),
            rng=np.random.default_rng(17),
            progress=False,
        )
        pairs = [(d.text.strip(), d.label) for d in demos]
        np.random.default_rng(18).shuffle(pairs)
        outs = self._few_shot(pairs)
        real = [next(x for x, y in t.records if y == label) for label in t.labels]
        self.add(
            f"pay once: {name} demonstrations (1 per label)",
            epsilon,
            outs,
            time.perf_counter() - started,
            demonstrations=pairs,
            label_agreement=float(np.mean([self._restricted(x) == y for x, y in pairs])),
            nll=float(np.mean([self._nll(x) for x, _ in pairs])),
            real_nll=float(np.mean([self._nll(x) for x in real])),
        )

    def public_layout(self) -> None:
        """No private data: the pay-once rows' few-shot prompt with the label names themselves as the examples
        (one per label, text = label, in the synthesis rows' shuffled order). What a user gets from the layout
        alone, which the DP demonstrations must beat to show the records helped."""
        assert self.task.labels is not None and self.choices is not None
        started = time.perf_counter()
        pairs = [(label, label) for label in self.task.labels]
        np.random.default_rng(18).shuffle(pairs)
        outs = self._few_shot(pairs)
        self.add(
            "few-shot greedy, the label names as examples (no private data)",
            0.0,
            outs,
            time.perf_counter() - started,
            demonstrations=pairs,
        )

    def mozo_offline(self, epsilon: float) -> None:
        """Pay once, free text: DPS-MOZO+Off (:class:`~dp_icl_plugin.MozoOfflineSynthesizer`) answers
        ``PUBLIC_INPUTS`` public tune inputs (never a held-out query) with the private records at ``epsilon`` on the
        row's ledger; every query is then answered greedy with those DP pairs as its examples (post-processing)."""
        from dp_icl_plugin import MozoOfflineSynthesizer

        method = MozoOfflineSynthesizer(
            epsilon=epsilon,
            delta=DELTA,
            max_tokens=self.task.max_tokens,
            order={1.0: 14.0, 2.0: 8.0}.get(epsilon, 5.0),
            template=self.template,
        )
        self._pay_once_answers("DPS-MOZO+Off", method, epsilon, rows=4, beta="beta")

    def tang_answers(self, epsilon: float) -> None:
        """Pay once, free text: Tang et al.'s aggregation for public inputs
        (:class:`~dp_icl_plugin.TangAnswerSynthesizer`, M = ``TANG_PROMPTS`` prompts of N = 2 expected records a
        token, up to ``ANSWER_TOKENS`` tokens an output) answers ``PUBLIC_INPUTS`` public tune inputs at ``epsilon``;
        every query is then answered greedy with those DP pairs as its examples (post-processing)."""
        from dp_icl_plugin import TangAnswerSynthesizer

        method = TangAnswerSynthesizer(
            epsilon=epsilon,
            delta=DELTA,
            n_prompts=TANG_PROMPTS,
            max_tokens=ANSWER_TOKENS,
            template=self.template,
        )
        self._pay_once_answers("Tang aggregation", method, epsilon, rows=TANG_PROMPTS, beta="noise_multiplier")

    def _pay_once_answers(self, name: str, method, epsilon: float, *, rows: int, beta: str) -> None:
        """``method`` (a public-input synthesizer) answers ``PUBLIC_INPUTS`` public tune inputs once on the row's
        ledger; every query is answered greedy with the DP pairs as its examples. Beside it, once per task, the same
        decoding with as many real records drawn at random (NOT private): what demonstrations of this kind can give
        at best."""
        t = self.task
        if not any(r["method"].startswith("few-shot greedy") for r in self.rows):
            started = time.perf_counter()
            drawn = np.random.default_rng(19).choice(len(t.records), PUBLIC_INPUTS, replace=False)
            outs = self._greedy_with([t.records[i] for i in drawn])
            self.add(
                f"few-shot greedy, {PUBLIC_INPUTS} random records (NOT private)",
                math.inf,
                outs,
                time.perf_counter() - started,
            )
        for synthesis_seed in (int(x) for x in str(self.args.synthesis_seeds).split(",")):
            started = time.perf_counter()
            ledger = self._ledger(epsilon)
            inputs = t.tune_queries[:PUBLIC_INPUTS]
            demos = method.synthesize(
                self._dataset(),
                public_inputs=inputs,
                backend=self.backend(rows),
                budget=ledger,
                rng=np.random.default_rng(synthesis_seed),
                progress=False,
            )
            pairs = [(d.input, _clean(d.text)) for d in demos if _clean(d.text)]
            seed = "" if synthesis_seed == 21 else f", seed {synthesis_seed}"
            self.add(
                f"pay once: {name}, {PUBLIC_INPUTS} DP pairs{seed}",
                epsilon,
                self._greedy_with(pairs),
                time.perf_counter() - started,
                demonstrations=pairs,
                **{beta: demos.provenance.extra[beta]},
                spent_epsilon=ledger.spent().epsilon,
                synthesis_seed=synthesis_seed,
            )

    def _greedy_with(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Every query answered greedy (free text) with ``pairs`` as the examples of one prompt."""
        from dp_icl_plugin.backends.generation import greedy_generate

        b, t = self.backend(1), self.task
        examples = "".join(t.example.format(text=x, label=y) for x, y in pairs)
        prompts = [b.encode(t.header + examples + t.query.format(input=q), add_special_tokens=True) for q in t.queries]
        return [b.decode(o).strip() for o in greedy_generate(b, prompts, max_new_tokens=t.max_tokens)]

    def _few_shot(self, pairs: list[tuple[str, str]]) -> list[str]:
        assert self.choices is not None
        b, t = self.backend(1), self.task
        examples = "".join(t.example.format(text=x, label=y) for x, y in pairs)
        prompts = [b.encode(t.header + examples + t.query.format(input=q), add_special_tokens=True) for q in t.queries]
        return [self.choices.greedy(b, p) for p in prompts]

    def _restricted(self, text: str) -> str | None:
        """The public model's label for ``text``, restricted zero-shot."""
        assert self.choices is not None and self.task.labels is not None
        b = self.backend(1)
        out = self.choices.greedy(b, b.encode(self.template.zero_shot_prompt(text), add_special_tokens=True))
        return _label_of(out, self.task.labels)

    def _nll(self, text: str) -> float:
        """Mean negative log-likelihood per token of ``text`` as the user's turn under the public model."""
        b = self.backend(1)
        head = b.encode(self.task.header + "<|im_start|>user\n", add_special_tokens=True)
        ids = b.encode(text, add_special_tokens=False)
        if not ids:
            return float("nan")
        rows = b.next_token_logprobs([head + ids[:i] for i in range(len(ids))])
        return float(-np.mean([rows[i][tok] for i, tok in enumerate(ids)]))

    def _knn(self, epsilon: float, *, labels, config):
        from dp_icl_plugin.decoding.knn_experts import filter_budget_for
        from dp_icl_plugin.retrieval import PrivateIndex, PrivateKNN

        index = PrivateIndex(
            budget=filter_budget_for(epsilon, DELTA * (1 - 1e-9), "replace_one"), embedder=self.embedder
        )
        xs, ys = zip(*self.task.records, strict=True)
        if labels is None:
            index.add(list(xs), answers=list(ys))
        else:
            index.add(list(xs), labels=list(ys))
        return PrivateKNN(index, budget=self._ledger(epsilon), backend=self.backend(1), labels=labels, config=config)

    def vote(self, epsilon: float) -> None:
        from dp_icl_plugin.retrieval import KNNConfig

        t = self.task
        started = time.perf_counter()
        k = self.args.vote_k
        tau, uses = self.threshold(k)
        knn = self._knn(epsilon, labels=t.labels, config=KNNConfig(k=k, shards=10, min_similarity=tau, uses=uses))
        rng = np.random.default_rng(15)
        outs = [knn.vote(q, rng=rng).label for q in t.queries]
        self.add(
            "kNN vote (no LLM)" if k == 40 else f"kNN vote (no LLM, k = {k})",
            epsilon,
            outs,
            time.perf_counter() - started,
            min_similarity=round(tau, 3),
            uses=uses,
            settings_from=SETTINGS_FROM,
        )

    def keywords(self, epsilon: float) -> None:
        from dp_icl_plugin.errors import ConfigurationError
        from dp_icl_plugin.retrieval import KNNConfig

        t = self.task
        started = time.perf_counter()
        tau, uses = self.threshold(40)
        knn = self._knn(
            epsilon,
            labels=None,
            config=KNNConfig(k=40, shards=10, min_similarity=tau, uses=uses, max_answer_tokens=t.max_tokens),
        )
        rng = np.random.default_rng(16)
        try:
            outs = [knn.answer(q, rng=rng).text for q in t.queries]
        except ConfigurationError as exc:
            self.add("kNN keyword answer", epsilon, None, time.perf_counter() - started, refused=str(exc)[:300])
            return
        seconds = time.perf_counter() - started
        self.add("kNN keyword answer", epsilon, outs, seconds, uses=uses, settings_from=SETTINGS_FROM)


class TableEmbedder:
    """Precomputed unit vectors by text (``--embeddings``); a text not in the table is an error."""

    name = "sentence-transformers/all-MiniLM-L6-v2"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def load_table(path: str) -> dict[str, np.ndarray]:
    data = np.load(path, allow_pickle=False)
    return dict(zip(data["texts"].tolist(), data["vectors"].astype(np.float32), strict=True))


SYNTHESIS = ("tang", "pta", "adadpsyn", "clip-blend-synthesis")
PUBLIC_INPUTS = 4  # DPS-MOZO+Off's public inputs (the paper's E2E setting: 4 DP pairs as the examples)
TANG_PROMPTS = 10  # Tang et al.'s M for public inputs (N = 2 expected records a prompt)
ANSWER_TOKENS = 40  # a pay-once output's tokens (E2E references run 20-40 tokens; all are charged)
SETTINGS_FROM = "public stand-ins for the records (Task.proxy), never the records"


def public_threshold(task: Task, tune_vectors: np.ndarray, proxy_vectors: np.ndarray, k: int) -> tuple[float, int]:
    """``(min_similarity, uses)`` for k experts from public vectors only (:meth:`Harness.threshold`).

    Args:
        task: the task (its record count N, public under replace-one, its queries and stand-ins' exclusions).
        tune_vectors: the tune queries' embeddings.
        proxy_vectors: the public stand-ins' embeddings.
        k: the experts per answer.
    """
    sims = tune_vectors @ proxy_vectors.T
    allowed = np.array(
        [[not task.proxy_excluded(q, i) for i in range(len(task.proxy))] for q in range(len(tune_vectors))]
    )
    sims = np.where(allowed, sims, -np.inf)
    n_records, pool = len(task.records), allowed.sum(axis=1)
    ranks = np.maximum(1, np.rint(k * pool / n_records).astype(int))
    ordered = -np.sort(-sims, axis=1)
    tau = float(np.median(ordered[np.arange(len(ordered)), ranks - 1]))
    share = float(((sims >= tau).sum(axis=1) / pool).mean())  # of the stand-ins: of the records, on average
    return tau, max(1, math.ceil(1.5 * len(task.queries) * share))


def save_table(path: str, tasks: list[Task]) -> None:
    """MiniLM vectors of every text the tasks embed (and the index's probe texts), for ``--embeddings``."""
    from dp_icl_plugin.retrieval import default_embedder
    from dp_icl_plugin.retrieval.embedding import PROBE_TEXTS, embed_texts

    texts = list(
        dict.fromkeys(
            [
                *PROBE_TEXTS,
                *(x for t in tasks for x, _ in t.records),
                *(q for t in tasks for q in t.queries + t.tune_queries + t.proxy),
            ]
        )
    )
    vectors = embed_texts(default_embedder(), texts, batch_size=128)
    np.savez_compressed(path, texts=np.array(texts), vectors=vectors.astype(np.float16))


def gain_interval(diff: np.ndarray, resamples: int = 2000) -> dict[str, float]:
    """Mean paired gain over greedy zero-shot and its 95 % bootstrap interval (seeded)."""
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"gain": float(diff.mean()), "gain_low": float(low), "gain_high": float(high)}


def recovered(rows: list[dict]) -> None:
    """Adds, to every DP row, the share of the ceiling's gain it recovers (with the interval's ends)."""
    for task in {r["task"] for r in rows}:
        ceiling = next((r for r in rows if r["task"] == task and r["epsilon"] == math.inf), None)
        gap = None if ceiling is None else ceiling.get("gain")
        for r in rows:
            if r["task"] == task and 0 < r["epsilon"] < math.inf and r.get("gain") is not None and gap:
                r["recovered"] = r["gain"] / gap
                r["recovered_low"], r["recovered_high"] = r["gain_low"] / gap, r["gain_high"] / gap


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# DP-ICL harness ({meta['split']} queries)",
        "",
        f"Model {meta['model']} on {meta['machine']}; {meta['queries']} queries per task; δ = {DELTA}; "
        f"`{meta['command']}` took {meta['minutes']:.1f} min.",
        "",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        lines += [
            f"## {task}",
            "",
            "| method | ε | score | gain over the last zero-shot row [95 % CI] | recovered |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in (r for r in rows if r["task"] == task):
            eps = "∞" if r["epsilon"] == math.inf else f"{r['epsilon']:g}"
            if r["score"] is None:
                lines.append(f"| {r['method']} | {eps} | refused | {r.get('refused', '')[:160]} | |")
                continue
            gain = "" if "gain" not in r else f"{r['gain']:+.1f} [{r['gain_low']:+.1f}, {r['gain_high']:+.1f}]"
            rec = "" if "recovered" not in r else f"{100 * r['recovered']:.0f} %"
            lines.append(f"| {r['method']} | {eps} | {r['score']:.1f} | {gain} | {rec} |")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        mine = [r for r in rows if r["task"] == task]
        ceiling = next(r for r in mine if r["epsilon"] == math.inf)
        ax.axhline(ceiling.get("gain", 0.0), color="grey", linestyle="--", label="kNN RAG (not private)")
        ax.axhline(0.0, color="black", linewidth=0.8)
        for method in dict.fromkeys(r["method"] for r in mine if 0 < r["epsilon"] < math.inf):
            pts = [r for r in mine if r["method"] == method and r.get("gain") is not None]
            if not pts:
                continue
            eps = [r["epsilon"] for r in pts]
            gain = np.array([r["gain"] for r in pts])
            err = np.array([gain - [r["gain_low"] for r in pts], [r["gain_high"] for r in pts] - gain])
            ax.errorbar(eps, gain, yerr=err, marker="o", capsize=3, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ε (ledger)")
        ax.set_ylabel("gain over greedy zero-shot")
        ax.set_title(task)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _use_data(path: Path) -> None:
    global DATA
    DATA = path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", default="e2e,trec,triage")
    parser.add_argument("--epsilons", default=None, help="comma-separated (default 1,2,4,8; --quick: 4)")
    parser.add_argument("--queries", type=int, default=None, help="per task (default 100; --quick: 12)")
    parser.add_argument("--methods", default="experts,mozo,clip-blend,vote,keywords")
    parser.add_argument("--split", choices=["held-out", "tune"], default="held-out")
    parser.add_argument("--device", default=None)
    parser.add_argument("--data", default=str(DATA), help="the data folder (default ../shared/data)")
    parser.add_argument("--model", default=MODEL, help="the model (a name, folder or .gguf file)")
    parser.add_argument("--embeddings", default=None, help="precomputed MiniLM vectors (.npz from --save-embeddings)")
    parser.add_argument("--save-embeddings", default=None, help="write the vectors every task needs, then exit")
    parser.add_argument(
        "--settings",
        action="store_true",
        help="print each task's min_similarity and uses, chosen on public stand-ins (and, for the record, what the "
        "private records would have chosen), then exit",
    )
    parser.add_argument("--expert-t0", type=float, default=None, help="expert decoding's public temperature")
    parser.add_argument("--expert-top-k", type=int, default=None, help="expert decoding's support (0: all)")
    parser.add_argument("--vote-k", type=int, default=40, help="the kNN vote's k (default 40)")
    parser.add_argument("--paid-tokens", type=int, default=2, help="sparse expert decoding's paid tokens (default 2)")
    parser.add_argument(
        "--synthesis-seeds",
        default="21",
        help="the free-text pay-once rows' synthesis seeds, comma-separated (default 21): a row per seed, each its "
        "own ledger and draw of the DP pairs",
    )
    parser.add_argument(
        "--expected-tokens",
        type=int,
        default=None,
        help="the per-token rows' expected tokens an answer (default: the tune queries' greedy zero-shot mean)",
    )
    parser.add_argument(
        "--free-answers",
        action="store_true",
        help="classification: let answers be any text (default: restricted to the labels)",
    )
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    _use_data(Path(args.data))
    if not DATA.is_dir():
        sys.exit(f"the data are not at {DATA} (../shared/data beside the project)")
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    n = args.queries or (12 if args.quick else 100)
    epsilons = [float(e) for e in (args.epsilons or ("4" if args.quick else "1,2,4,8")).split(",")]
    methods = args.methods.split(",")
    started = time.perf_counter()
    rows: list[dict] = []
    tasks = [
        e2e_task(n, args.split, args.quick)
        if name == "e2e"
        else classification_task("trec" if name == "trec" else "agnews", n, args.split)
        for name in args.tasks.split(",")
    ]
    if args.save_embeddings:
        save_table(args.save_embeddings, tasks)
        return
    if args.settings:
        for task in tasks:
            harness = Harness(task, args)
            print(
                json.dumps(
                    {
                        "task": task.name,
                        "k": task.k,
                        "queries": len(task.queries),
                        "public (used)": harness.threshold(task.k),
                        "from the private records (before issue 40)": harness.private_threshold(task.k),
                    }
                ),
                flush=True,
            )
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "harness_quick" if args.quick else "harness" if args.split == "held-out" else "harness_tune"
    gpu = f" ({torch.cuda.get_device_name()})" if (args.device or "").startswith("cuda") else ""
    meta = {
        "model": Path(args.model).name,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{torch.get_num_threads()} threads, device {args.device or 'cpu'}{gpu}",
        "queries": n,
        "split": args.split,
        "command": "python benchmarks/harness/run.py " + " ".join(sys.argv[1:]),
        "minutes": 0.0,
    }

    def save(final: bool) -> None:  # after every row: a run stopped midway keeps what it measured
        meta["minutes"] = (time.perf_counter() - started) / 60
        meta["complete"] = final
        done = [dict(r) for r in rows]
        recovered(done)
        (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": done}, indent=1, default=str))
        (out / f"{stem}.md").write_text(to_markdown(done, meta))
        if final:
            plot(done, out / f"{stem}.png")

    for task in tasks:
        h = Harness(task, args)
        h.on_row = lambda h=h: (rows.append(h.rows[-1]), save(False))
        h.zero_shot()
        h.ceiling()
        if "public-layout" in methods and task.labels is not None and h.choices is not None:
            h.public_layout()  # no private data: once, not per ε
        for eps in epsilons:
            for m in methods:
                if (m == "vote" and task.labels is None) or (m == "keywords" and task.labels is not None):
                    continue
                if m in SYNTHESIS and (task.labels is None or h.choices is None):
                    continue  # pay-once rows: classification with the labels as choices
                if m in ("mozo-offline", "tang-answers") and task.labels is not None:
                    continue  # pay once with free text (E2E)
                if m == "public-layout":
                    continue  # run once above
                {
                    "experts": h.experts,
                    "sparse": lambda e, h=h: h.experts(e, args.paid_tokens),
                    "experts-per-token": lambda e, h=h: h.experts(e, per_token=True),
                    "mozo": h.mozo,
                    "clip-blend": h.clip_blend,
                    "mozo-per-token": lambda e, h=h: h.mozo(e, per_token=True),
                    "clip-blend-per-token": lambda e, h=h: h.clip_blend(e, per_token=True),
                    "vote": h.vote,
                    "keywords": h.keywords,
                    "keyword-hints": h.keyword_hints,
                    "mozo-offline": h.mozo_offline,
                    "tang-answers": h.tang_answers,
                    **{name: (lambda e, h=h, name=name: h.synthesis(name, e)) for name in SYNTHESIS},
                }[m](eps)
    save(True)
    print(to_markdown([dict(r) for r in rows], meta))


if __name__ == "__main__":
    main()
