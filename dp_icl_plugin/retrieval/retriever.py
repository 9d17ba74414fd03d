"""DP-ICL with nearest-neighbour retrieval and individual privacy filters (the kNN DP-ICL paper, Wu et al. 2024).

Four releases, each answering one public query from the private records nearest to it (the fourth, expert
decoding, is :class:`~dp_icl_plugin.decoding.knn_experts.KNNExpertDecoder`, charged here as ``"decode"``):

- :meth:`PrivateKNN.vote` ("nearest neighbours only"): report-noisy-max over the labels of the k
  nearest records; no language model.
- :meth:`PrivateKNN.classify`: the records are split into shards, the LLM labels the query once per
  shard with the shard's records as demonstrations, and report-noisy-max picks a label from the shards'
  votes (Wu et al. ICLR 2024, RNM-Gaussian).
- :meth:`PrivateKNN.answer`: each shard's LLM answer adds its keyword tokens to a histogram; keywords
  are released from it (by default every token whose Gaussian-noised count passes a threshold,
  :mod:`dp_icl_plugin.mechanisms.keyword_threshold`; or the paper's top-k propose-test-release,
  :mod:`dp_icl_plugin.mechanisms.keyword_ptr`) and a public prompt with only those keywords (or the 0-shot
  prompt when none is released) produces the answer (keyword-space aggregation, Wu et al.). With
  ``KNNConfig(keyword_source="records")`` (keyword hints) every candidate record votes its own first m keywords
  instead, with no LLM call (:class:`~dp_icl_plugin.decoding.knn_keywords.KNNKeywordDecoder` as a chat model).

**Who pays.** Neighbouring relation: add/remove one unit (a record, or every record of one person). A
record is a *candidate* when it is active (its unit can still pay) and its cosine similarity to the query
is at least ``min_similarity``. Every candidate's unit is charged, whether or not the record ends up among
the k used: that keeps each unit's charge a function of its own records and the public query alone, the
condition under which Feldman & Zrnic's individual filter is valid (charging only the records actually
used would let one record's presence change which *other* records pay, and so the later retrievals).
``min_similarity`` therefore sets how many records pay per query; the paper charges only the k used,
which has no such guarantee. ``KNNConfig.records_per_unit`` bounds a person's contribution: only that many of
each person's most similar records are candidates (a choice made from that person's records and the query
alone), so a person pays for at most that many records per release.

**Sensitivity.** Shards are assigned by a keyed hash of each record's id with a fresh random key per
query, and each shard takes its r = k / shards most similar candidates: removing one candidate changes
one shard (the next candidate of that shard moves up). So the vote histogram moves by at most √2 in ℓ2
per shard touched (one vote moves from one label to another), i.e. √2·min(c, shards) for a unit with c
candidate records; for :meth:`vote`, √2·min(c, k) (each removed record swaps one vote). The keyword
histogram changes in at most min(c, shards) shards: by √(2m) in ℓ2 per shard when each answer adds its
first m keywords (threshold release; with records voting, c·√m: a removed record takes its own vote away and
no other record moves up), and the PTR stability distance by one unit (at most ``shards``
shard changes per person, :mod:`dp_icl_plugin.mechanisms.keyword_ptr`).

**Accounting.** Each unit pays the Gaussian RDP of its own sensitivity (plus δ₀ for the PTR test) in the
index's :class:`~dp_icl_plugin.accounting.RenyiFilter`; the ledger is charged once for the filter's total
(ε, δ) under add/remove of a record (converted by a replace-one ledger, the default, to (2ε, (1 + e^ε)δ) by
group privacy; for a per-person filter first (2ε, (1 + e^ε)δ) per record, :meth:`PrivateKNN.cover_event`)
and records every release as a :class:`~dp_icl_plugin.accounting.FilteredReleaseEvent`. Ledger
labels name the release kind and the index, never a count computed from the records (how many were near
the query). A unit-level ledger (``PrivacyBudget(..., privacy_unit="unit")``) takes a per-person index (its
user ids the records' units) and is charged the filter's own (ε, δ) under add/remove of one unit, with no
group-privacy factor: the filter bounds exactly that (:meth:`PrivateKNN.cover_event`).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import rdp
from dp_icl_plugin.accounting.budget import RELEASE_NUMBER, BudgetManager, LedgerEntry
from dp_icl_plugin.accounting.conversion import group_of_two_delta
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost
from dp_icl_plugin.accounting.neighbouring import PER_RECORD
from dp_icl_plugin.accounting.process_mark import process_mark
from dp_icl_plugin.backends.base import NextTokenBackend, check_top_k, context_limit
from dp_icl_plugin.backends.generation import greedy_generate
from dp_icl_plugin.errors import (
    BudgetExhaustedError,
    ConfigurationError,
    ConfigurationTypeError,
    WeakReleaseWarning,
    after_charge,
)
from dp_icl_plugin.mechanisms.keyword_ptr import stable_top_k
from dp_icl_plugin.mechanisms.keyword_threshold import (
    answer_keywords,
    keyword_threshold,
    record_keywords,
    record_vote_sensitivity,
    threshold_keywords,
    threshold_sensitivity,
)
from dp_icl_plugin.mechanisms.noisy_max import report_noisy_max
from dp_icl_plugin.mechanisms.token_shift import (
    MIN_KEYWORD_PASS,
    keyword_pass_probability,
    log_odds_shift,
    warn_if_weak,
)
from dp_icl_plugin.retrieval.index import Candidates, PrivateIndex
from dp_icl_plugin.retrieval.prompts import STOPWORDS, AnswerPrompt, ClassificationPrompt, KeywordAnswerPrompt
from dp_icl_plugin.timing import FixedLatency, as_fixed_latency

__all__ = [
    "Answer",
    "Classification",
    "KNNConfig",
    "PrivateKNN",
    "PrivateText",
    "Retrieval",
    "RetrievedRecord",
    "noise_for_uses",
]

SQRT2 = math.sqrt(2.0)
RELEASES = ("vote", "classify", "answer", "decode")
PUBLIC_RELEASES = RELEASES[:3]  # "decode" is charged by KNNExpertDecoder, which reads its records itself
EXPERT_CLIP = 4.0
"""The clipping bound c of an expert-decoding release: an expert's tokens within 2c nats of its favourite keep
their order, the rest share the floor. Only c/τ is paid for: τ follows from the budget."""
KEYWORD_RELEASES = ("threshold", "ptr")
KEYWORD_SOURCES = ("shards", "records")


def noise_for_uses(budget: IndividualBudget, *, uses: int, sensitivity: float) -> float:
    """The smallest Gaussian σ such that a unit can pay for ``uses`` releases of this ℓ2 sensitivity.

    Closed form: uses·α·Δ²/(2σ²) ≤ B_α at the best order, σ² = uses·Δ²·min_α(α/B_α)/2.

    Args:
        budget: a unit's lifetime budget.
        uses: the releases a unit must afford.
        sensitivity: Δ, the release's ℓ2 sensitivity for one unit.

    Raises:
        ConfigurationError: ``uses`` or ``sensitivity`` is not positive.
    """
    uses = check.positive_int("uses", uses)
    delta_sens = check.positive_finite("sensitivity", sensitivity)
    a = np.asarray(budget.orders)
    caps = budget.caps
    ok = np.isfinite(caps) & (caps > 0)
    ratio = float(np.min(a[ok] / caps[ok]))
    return math.sqrt(uses * delta_sens**2 * ratio / 2.0) * (1 + 1e-9)


def ptr_delta_for_uses(budget: IndividualBudget, *, uses: int) -> float:
    """The δ0 of one PTR keyword test such that a unit can pay for exactly ``uses`` of them from its
    approximate-δ share: ``uses``·δ0 stays below the room the filter keeps under the share (it admits while
    spent δ + δ0 ≤ share·(1 − 1e-9)), as the calibrated noise does below the RDP caps (:func:`noise_for_uses`).

    Args:
        budget: a unit's lifetime budget.
        uses: the releases a unit must afford.

    Raises:
        ConfigurationError: ``uses`` is not positive.
    """
    uses = check.positive_int("uses", uses)
    return float(budget.approximate_delta or 0.0) * (1 - 2e-9) / uses


def token_epsilon_for_uses(budget: IndividualBudget, *, uses: int, tokens: int, test_ratio: float = 0.0) -> float:
    """The largest per-token ε0 of a bounded-range mechanism (the expert-decoding token, one expert changed)
    such that a unit can pay for ``uses`` answers of ``tokens`` tokens each: uses·tokens·min(αε0²/8, pure(ε0))
    ≤ B_α at some order α of the filter, found by bisection (the RDP curve grows with ε0). With ``test_ratio``
    a > 0 each token also pays one sparse-vector run of pure ε_s = a·ε0 (sparse expert decoding: ``tokens`` is
    then the paid tokens): uses·tokens·(BR(ε0) + pure(a·ε0)) ≤ B_α.

    Args:
        budget: a unit's lifetime budget.
        uses: the answers a unit must afford.
        tokens: the (paid) tokens of each answer.
        test_ratio: a, the sparse-vector run's ε over the token's (0: no test).

    Raises:
        ConfigurationError: ``uses`` or ``tokens`` is not positive, ``test_ratio`` is negative, or the budget
            affords no ε0 > 0.
    """
    uses = check.positive_int("uses", uses)
    steps = uses * check.positive_int("tokens", tokens)
    ratio = check.non_negative_finite("test_ratio", test_ratio)
    orders = np.asarray(budget.orders)
    caps = budget.caps * (1 - 2e-9)  # the filter keeps 1e-9 of room below every cap

    def fits(eps0: float) -> bool:
        test = rdp.pure_dp_rdp(orders, ratio * eps0) if ratio > 0 else 0.0
        return bool(np.any(steps * (rdp.bounded_range_rdp(orders, eps0) + test) <= caps))

    low, high = 0.0, 1.0
    while fits(high):
        low, high = high, 2.0 * high
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if fits(mid) else (low, mid)
    if low <= 0.0:
        raise ConfigurationError(f"the index's budget cannot pay for {uses} answers of {tokens} tokens")
    return low


@dataclass(frozen=True)
class KNNConfig:
    """What a release uses and costs.

    Args:
        k: records used per release (for classify/answer: ``shards`` × demonstrations per shard).
        shards: LLM calls per classify/answer release (the paper: 10 shards × 4 demonstrations).
        min_similarity: public cosine threshold τ; every active record at least this similar pays.
        uses: releases a record can take part in; sets the noise when ``noise_std`` is not given. Each kind
            is calibrated on its own: ``uses`` votes/classifications, or ``uses`` answers, fill a record's budget.
        noise_std: σ of the Gaussian noise on vote histograms (default: calibrated from ``uses``).
        keyword_release: how an answer release picks keywords: ``"threshold"`` (every token whose noisy
            count passes a threshold; no δ) or ``"ptr"`` (the paper's exact top-``keywords`` set when a
            propose-test-release stability test passes; needs an approximate-δ share in the budget).
        keyword_noise_std: σ of the keyword release (threshold counts or the PTR test; default: calibrated
            from ``uses``).
        keywords: how many keywords an answer release publishes (``"threshold"``: at most this many).
        keywords_per_answer: ``"threshold"``: each shard's answer (or, with ``keyword_source="records"``, each
            candidate record) counts its first this many distinct keyword tokens (the ℓ2 sensitivity is
            √(2·keywords_per_answer) per shard, √keywords_per_answer per record).
        keyword_source: who votes in an answer release's keyword histogram: ``"shards"`` (default: each shard's
            LLM answer, Wu et al.) or ``"records"`` (keyword hints: every candidate record votes the keywords of
            its own answer, else its label, else its text, with no LLM call; :func:`record_keywords`). Records
            vote through the threshold release only.
        stopwords: words that are never keywords (a keyword is a token with a letter or digit whose
            lower-cased text is not one of them); public, default :data:`~dp_icl_plugin.retrieval.prompts.STOPWORDS`.
        max_answer_tokens: the length limit of every generated answer (a ``decode`` release is charged for it).
        expert_public_temperature: the temperature T0 of the public zero-shot row in a ``decode`` release
            (expert decoding, :class:`~dp_icl_plugin.decoding.knn_experts.KNNExpertDecoder`); public, free. The
            experts' part has the temperature the budget allows (:meth:`PrivateKNN.expert_scale`). Default 0.1,
            chosen on E2E tune queries (ROUGE-L 39.6 vs 30.4 at 0.5; on held-out queries 0.1 is level with greedy
            zero-shot, +0.8 [−0.4, +1.9], where 0.5 fell 6.9 points below it). ``inf``
            drops the public row's preferences (it still sets the support), as with public answer choices.
        expert_top_k: a ``decode`` release samples among the zero-shot output's this many most likely tokens
            (public; 0 for the whole vocabulary).
        records_per_unit: contribution bounding for a per-person index: only each person's this many most
            similar records are candidates of a release (each pays, and a person with c of them pays for c), or
            None (default) for every record above ``min_similarity``. A per-record index has one record per unit.
        expert_paid_tokens: sparse expert decoding (:mod:`~dp_icl_plugin.decoding.knn_experts`): at most this
            many tokens of an answer are drawn from the experts and paid; every other token is the public row's
            greedy token, emitted for free where a sparse-vector test finds that the experts do not depart from
            it. None (default): every token is drawn from the experts and paid.
        expert_test_ratio: a, the sparse-vector test's ε over the token's (ε_s = a·ε0 per run): larger tests
            better for a smaller token ε0. Public; default 2.
        expert_test_threshold: T, in nats of the experts' margin over the public greedy token (public); default
            3·4/a, three times the test's noise scale (a token on which the experts agree with the public row
            is paid about 3 % of the time).

    Raises:
        ConfigurationError: a field is out of range, or ``k`` is not a multiple of ``shards``.
    """

    k: int = 40
    shards: int = 10
    min_similarity: float = 0.3
    uses: int = 1
    noise_std: float | None = None
    keyword_release: str = "threshold"
    keyword_noise_std: float | None = None
    keywords: int = 5
    keywords_per_answer: int = 4
    keyword_source: str = "shards"
    stopwords: frozenset[str] = STOPWORDS
    max_answer_tokens: int = 16
    expert_public_temperature: float = 0.1
    expert_top_k: int = 100
    records_per_unit: int | None = None
    expert_paid_tokens: int | None = None
    expert_test_ratio: float = 2.0
    expert_test_threshold: float | None = None

    def __post_init__(self) -> None:
        for name in ("k", "shards", "uses", "keywords", "keywords_per_answer", "max_answer_tokens"):
            object.__setattr__(self, name, check.positive_int(name, getattr(self, name)))
        if self.k % self.shards:
            raise ConfigurationError(f"k ({self.k}) must be a multiple of shards ({self.shards})")
        tau = check.real("min_similarity", self.min_similarity)
        if not -1.0 <= tau <= 1.0:
            raise ConfigurationError(f"min_similarity must lie in [-1, 1], got {tau!r}")
        object.__setattr__(self, "min_similarity", tau)
        if self.keyword_release not in KEYWORD_RELEASES:
            raise ConfigurationError(
                f"keyword_release must be one of {', '.join(KEYWORD_RELEASES)}, got {self.keyword_release!r}"
            )
        if self.keyword_source not in KEYWORD_SOURCES:
            raise ConfigurationError(
                f"keyword_source must be one of {', '.join(KEYWORD_SOURCES)}, got {self.keyword_source!r}"
            )
        if self.keyword_source == "records" and self.keyword_release != "threshold":
            raise ConfigurationError('records vote through the threshold release only (keyword_release="threshold")')
        if isinstance(self.stopwords, str) or not all(isinstance(w, str) for w in self.stopwords):
            raise ConfigurationError("stopwords must be a collection of strings")
        object.__setattr__(self, "stopwords", frozenset(w.strip().lower() for w in self.stopwords))
        for name in ("noise_std", "keyword_noise_std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check.positive_finite(name, getattr(self, name)))
        t0 = check.real("expert_public_temperature", self.expert_public_temperature)
        if not t0 > 0.0:
            raise ConfigurationError(f"expert_public_temperature must be positive (inf: no public prior), got {t0!r}")
        object.__setattr__(self, "expert_public_temperature", t0)
        object.__setattr__(self, "expert_top_k", check.int_at_least("expert_top_k", self.expert_top_k, 0))
        if self.records_per_unit is not None:
            object.__setattr__(self, "records_per_unit", check.positive_int("records_per_unit", self.records_per_unit))
        if self.expert_paid_tokens is not None:
            paid = check.positive_int("expert_paid_tokens", self.expert_paid_tokens)
            object.__setattr__(self, "expert_paid_tokens", paid)
        ratio = check.positive_finite("expert_test_ratio", self.expert_test_ratio)
        if not math.isfinite(12.0 / ratio):  # the test's noise scale 1/a (and the default threshold) must be finite
            raise ConfigurationError(f"expert_test_ratio is too small to give the test a noise scale: {ratio!r}")
        object.__setattr__(self, "expert_test_ratio", ratio)
        threshold = 12.0 / self.expert_test_ratio if self.expert_test_threshold is None else self.expert_test_threshold
        threshold = check.real("expert_test_threshold", threshold)
        if not math.isfinite(threshold):
            raise ConfigurationError(f"expert_test_threshold must be finite, got {threshold!r}")
        object.__setattr__(self, "expert_test_threshold", threshold)

    @property
    def records_vote(self) -> bool:
        """Whether an answer release's keywords are the candidate records' own (``keyword_source="records"``)."""
        return self.keyword_source == "records"

    @property
    def sparse(self) -> bool:
        """Whether expert decoding is sparse (``expert_paid_tokens`` set)."""
        return self.expert_paid_tokens is not None

    def paid_tokens(self, tokens: int) -> int:
        """Token mechanisms an expert-decoding answer of ``tokens`` token decisions runs and pays: all of them, or
        at most ``expert_paid_tokens`` when sparse (public)."""
        return tokens if self.expert_paid_tokens is None else min(tokens, self.expert_paid_tokens)


class PrivateText:
    """Private text that will not print: ``str``, ``repr`` and formatting give ``<private text>``.

    Only a DP release step should read it (:meth:`reveal`); putting it into a prompt of a non-private
    LLM, a log line or a trace is exactly what this wrapper is there to stop.

    Args:
        value: the private text.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The raw private text. Anything computed from it must go through a DP release."""
        return self._value

    def __repr__(self) -> str:
        return "<private text>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "<private text>"

    def __reduce__(self):  # never pickled along with a component
        raise TypeError("private text cannot be pickled")


@dataclass(frozen=True)
class RetrievedRecord:
    """One retrieved private record; its fields print as ``<private text>``.

    Attributes:
        text: the record's text.
        label: its label, if it has one.
        answer: its answer, if it has one.
        similarity: its cosine similarity to the query (private).
    """

    text: PrivateText
    label: PrivateText | None
    answer: PrivateText | None
    similarity: float

    def __repr__(self) -> str:
        return "RetrievedRecord(<private>)"


class Retrieval(Sequence[RetrievedRecord]):
    """The records charged for one release, most similar first; consumed by one release step.

    ``complete`` is False when fewer than the configured k records were available: the release then
    uses fewer (never padded). Both the records and that flag are private: only the release's output is DP.

    Args:
        release: the release kind it was charged for.
        query: the public query.
        candidates: the admitted candidates the records come from.
        records: the records the release uses.
        k: the configured number of records.
        entry: the id of the ledger entry that records the release.
        charged_by: the :class:`PrivateKNN` that charged it.
    """

    def __init__(
        self,
        release: str,
        query: str,
        candidates: Candidates,
        records: list[RetrievedRecord],
        k: int,
        entry: int,
        charged_by: object,
    ) -> None:
        self.release = release
        self.ledger_entry = entry
        self._query = query
        self._candidates = candidates
        self._records = records
        self.k = k
        self.complete = len(records) >= k
        self._used = False
        self._claim = threading.Lock()  # released once, even by two threads at once
        self._process = process_mark()  # ... and never by a forked copy (a second release of one charge)
        self._charged_by = charged_by  # the PrivateKNN whose costs were charged (its release must match them)

    def claim(self) -> None:
        """Mark this retrieval released; raises ConfigurationError if it already was, or in another process.

        Raises:
            ConfigurationError: it was released already, or this is another process.
        """
        if self._process != process_mark():
            raise ConfigurationError(
                "a retrieval cannot be released in a process other than the one that charged it "
                "(a fork would release one charge twice)"
            )
        with self._claim:
            if self._used:
                raise ConfigurationError("a retrieval can be released once")
            self._used = True

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i):  # type: ignore[override]
        return self._records[i]

    def __iter__(self) -> Iterator[RetrievedRecord]:
        return iter(self._records)

    def __repr__(self) -> str:
        return f"Retrieval(release={self.release!r}, <private records>)"

    def __reduce__(self):
        raise TypeError("a retrieval holds private records and cannot be pickled")


@dataclass(frozen=True)
class Classification:
    """A DP label: ``label`` is the release; ``ledger_entry`` is the ledger entry that records it.

    Attributes:
        label: the released label.
        release: the release kind (``"vote"`` or ``"classify"``).
        ledger_entry: the id of the ledger entry.
    """

    label: str
    release: str
    ledger_entry: int


@dataclass(frozen=True)
class Answer:
    """A DP answer: text generated from released keywords only (or 0-shot when the test failed).

    Attributes:
        text: the generated answer.
        keywords: the released keywords, or None when none was released.
        ledger_entry: the id of the ledger entry.
    """

    text: str
    keywords: tuple[str, ...] | None
    ledger_entry: int

    @property
    def fell_back(self) -> bool:
        """Whether no keyword was released (none passed the threshold, or the PTR test failed): the 0-shot answer."""
        return self.keywords is None


def _second_cover_refused(exc: BudgetExhaustedError, history: Sequence[LedgerEntry]) -> BudgetExhaustedError:
    """The refusal of a new index's cover, saying so when the ledger already covers other indexes: most often the
    same records indexed again in memory at an app's restart, which pays their cover twice."""
    others = sorted({entry.label for entry in history if entry.label.startswith("knn-filter:")})
    if not others:
        return exc
    return BudgetExhaustedError(
        f"{exc}. The refused charge is the cover of a new private index (its records' whole filter budget), and "
        f"this ledger already covers {len(others)} other index(es): if they hold the same records (an app "
        "started again builds a new in-memory index each time), reopen the kept one instead: "
        "PrivateIndex.open(directory or postgresql:// URL), or build_expert_decoder / from_model_id(..., "
        "method='knn-experts'), which keep their index beside a file or PostgreSQL ledger",
        requested_epsilon=exc.requested_epsilon,
        remaining_epsilon=exc.remaining_epsilon,
        total_epsilon=exc.total_epsilon,
    )


def _release_tag(cover: LedgerEntry) -> str:
    """What a cover's releases are counted under in the filter: this ledger's cover (its id and commit time), so
    that releases another ledger records count apart."""
    return f"knn-filter:{cover.id}@{cover.timestamp!r}"


def _shard_keys(ids: np.ndarray, salt: int, shards: int) -> np.ndarray:
    """splitmix64(salt ⊕ id) mod shards: a shard per record that depends on no other record."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) ^ np.uint64(salt)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(shards)).astype(np.int64)


class PrivateKNN:
    """Private nearest-neighbour DP-ICL over a :class:`PrivateIndex`, charged to one shared ledger.

    Nothing this class returns to callers contains private text except :meth:`retrieve`'s records,
    which are wrapped in :class:`PrivateText` and meant only for a DP release step
    (:meth:`vote`, :meth:`classify`, :meth:`answer` accept a :class:`Retrieval`). A RAG pipeline that
    needs context for a non-private LLM should use :meth:`answer` (keyword-aggregated, DP).

    Args:
        index: the private records and their filter.
        budget: the app's ledger. On construction it is charged once with the filter's total (ε, δ)
            unless an earlier retriever over this index already did; every release is then recorded in it.
        backend: the language model for :meth:`classify` and :meth:`answer` (not needed for :meth:`vote`).
        labels: the public label set for :meth:`vote` and :meth:`classify`.
        config: sizes, threshold and noise (see :class:`KNNConfig`).
        classification_prompt: the prompt layout of :meth:`classify`.
        answer_prompt: the prompt layout of each shard's answer in :meth:`answer`.
        keyword_prompt: the prompt layout of the final answer from the released keywords.
        fixed_latency: hide timing: :meth:`vote`, :meth:`classify` and :meth:`answer` each return this many
            seconds after they start (seconds or a shared :class:`~dp_icl_plugin.timing.FixedLatency`), and
            the ledger labels leave out the number of paying records. A :class:`Retrieval` passed to them
            was timed by its own :meth:`retrieve` call: pass the query text to time the whole release.
        releases: the releases this retriever is for, of ``"vote"``, ``"classify"``, ``"answer"`` and ``"decode"``
            (expert decoding, :class:`~dp_icl_plugin.decoding.knn_experts.KNNExpertDecoder`). Each is checked
            against the public settings before the filter's cover is charged, and one that could release nothing
            (no labels or backend, labels the backend cannot score, a keyword threshold no keyword can pass, PTR
            without a δ share, a top-k wider than the backend returns) is refused with the deciding figure; a
            release not named is refused later. Default: every release the arguments allow (vote with labels,
            classify with labels and a backend, answer and decode with a backend): refused when none of them could
            release anything, warned about (:class:`~dp_icl_plugin.errors.WeakReleaseWarning`) when only expert
            decoding could; a useless release is refused when it is called, before its own charge.
        population: the number of records the index holds, where it is public (a replace-one ledger keeps it
            fixed; under add/remove only a declared size): keyword hints under which a word every record shares
            would pass less than 5 % of the time could release nothing and are refused before the cover. None: not
            known.

    Raises:
        ConfigurationError: a bad argument, a release that could release nothing (before any charge), or the ledger
            holds this index's filter charged otherwise.
        FilterRolledBackError: the index's filter counts fewer releases than the ledger records under its cover (it
            was restored from a backup).
        BudgetExhaustedError: the ledger cannot afford the filter's charge.
    """

    def __init__(
        self,
        index: PrivateIndex,
        *,
        budget: BudgetManager,
        backend: NextTokenBackend | None = None,
        labels: Sequence[str] | None = None,
        config: KNNConfig | None = None,
        classification_prompt: ClassificationPrompt | None = None,
        answer_prompt: AnswerPrompt | None = None,
        keyword_prompt: KeywordAnswerPrompt | None = None,
        fixed_latency: float | FixedLatency | None = None,
        releases: Collection[str] | None = None,
        population: int | None = None,
    ) -> None:
        if not isinstance(index, PrivateIndex):
            raise ConfigurationTypeError("index must be a PrivateIndex")
        self.population = None if population is None else check.positive_int("population", population)
        if not isinstance(budget, BudgetManager):
            raise ConfigurationTypeError("budget must be a BudgetManager (the app's shared ledger)")
        self.index = index
        self.budget = budget
        self.backend = backend
        self.config = config if config is not None else KNNConfig()
        if not isinstance(self.config, KNNConfig):
            raise ConfigurationTypeError("config must be a KNNConfig")
        self.labels = None if labels is None else self._check_labels(labels)
        self.classification_prompt = classification_prompt or ClassificationPrompt()
        self.answer_prompt = answer_prompt or AnswerPrompt()
        self.keyword_prompt = keyword_prompt or KeywordAnswerPrompt()
        self.fixed_latency = as_fixed_latency(fixed_latency)
        filt = index.filter.budget
        self.noise_std = self.config.noise_std or noise_for_uses(filt, uses=self.config.uses, sensitivity=SQRT2)
        self.keyword_sensitivity = (  # one unit changing one shard, or one record's own vote
            1.0
            if self.config.keyword_release == "ptr"
            else record_vote_sensitivity(self.config.keywords_per_answer)
            if self.config.records_vote
            else threshold_sensitivity(self.config.keywords_per_answer)
        )
        self.keyword_noise_std = self.config.keyword_noise_std or noise_for_uses(
            filt, uses=self.config.uses, sensitivity=self.keyword_sensitivity
        )
        self.ptr_delta = (
            ptr_delta_for_uses(filt, uses=self.config.uses) if self.config.keyword_release == "ptr" else 0.0
        )
        self.expert_epsilon = token_epsilon_for_uses(
            filt,
            uses=self.config.uses,
            tokens=self.config.paid_tokens(self.config.max_answer_tokens),
            test_ratio=self.config.expert_test_ratio if self.config.sparse else 0.0,
        )
        self._label_tokens: np.ndarray | None = None
        self.asked_releases: tuple[str, ...] = ()  # the releases named (none: the arguments decide)
        self.releases = self._plan_releases(releases)  # nothing paid for nothing: before the cover
        cover = self._cover()
        self.cover_entry = cover.id
        self._release_tag = _release_tag(cover)

    def __repr__(self) -> str:
        return f"PrivateKNN(index={self.index!r}, k={self.config.k}, shards={self.config.shards})"

    # -- public API -------------------------------------------------------------------------------
    def retrieve(self, query: str, *, release: str = "vote", k: int | None = None) -> Retrieval:
        """Charge every candidate's unit for one ``release`` and return the records that release may use.

        Args:
            query: the public query text.
            release: the release the records are for (``vote``, ``classify`` or ``answer``); it sets the cost.
                (Expert decoding charges through :class:`~dp_icl_plugin.retrieval.KNNExpertDecoder`.)
            k: records to use (default ``config.k``; for classify/answer a multiple of ``config.shards``).

        Raises:
            ConfigurationError: bad query, k or release kind, or a release this retriever cannot run (no
                labels / no backend / no approximate δ for answers); nothing is charged then. An empty index
                is no error: the release is charged and made over zero records, as over any number.
        """
        if release not in PUBLIC_RELEASES:
            raise ConfigurationError(f"release must be one of {', '.join(PUBLIC_RELEASES)}, got {release!r}")
        admitted, entry, k = self._charge_release(query, release, k, None)
        # reading the charged records: a failure here is the one fixed error
        used, records = after_charge(lambda: self._charged_records(admitted, release, k))
        return Retrieval(release, query, used, records, k, entry.id, charged_by=self)

    def _charge_release(
        self, query: str, release: str, k: int | None, tokens: int | None, *, answer_prompt_checked: bool = False
    ) -> tuple[Candidates, LedgerEntry, int]:
        """The public checks, then the charge of every candidate's unit and the ledger record (nothing private
        is read or released here): the admitted candidates, the committed ledger entry and k. A caller that
        builds its own answer prompt (``KNNKeywordDecoder``) checked its room itself (``answer_prompt_checked``)."""
        _, admitted, entry, k = self._charged_search(
            query, release, k, tokens, answer_prompt_checked=answer_prompt_checked
        )
        return admitted, entry, k

    def _charged_search(
        self, query: str, release: str, k: int | None, tokens: int | None, *, answer_prompt_checked: bool = False
    ) -> tuple[Candidates, Candidates, LedgerEntry, int]:
        """:meth:`_charge_release`, also returning the candidates it charged (first): an answer paid per token
        charges them again before each next token (:meth:`_charge_candidates`). The search and the charge run in
        the index's release turn (:mod:`~dp_icl_plugin.retrieval.release_turn`)."""
        with self.index.release_turn.hold():
            return self._search_and_charge(query, release, k, tokens, answer_prompt_checked)

    def _search_and_charge(
        self, query: str, release: str, k: int | None, tokens: int | None, answer_prompt_checked: bool
    ) -> tuple[Candidates, Candidates, LedgerEntry, int]:
        k = self.config.k if k is None else check.positive_int("k", k)
        if release in ("classify", "answer") and k % self.config.shards:
            raise ConfigurationError(f"k ({k}) must be a multiple of shards ({self.config.shards})")
        tokens = self.config.max_answer_tokens if tokens is None else check.positive_int("tokens", tokens)
        if tokens > self.config.max_answer_tokens:
            raise ConfigurationError(
                f"an answer of {tokens} tokens exceeds the {self.config.max_answer_tokens} "
                "(config.max_answer_tokens) a unit's budget was divided for"
            )
        self._require(release)
        query_vector = self.index.embed_query(query)
        if release == "answer" and not answer_prompt_checked:
            self._check_answer_room(query)
        # No check of the index's size: whether it holds any record is private (add/remove), so an empty index
        # (or one with no candidate) goes through the same charge and release, over zero records.
        self.index.refresh()  # records added or removed by other processes or hosts
        self.index.expect_release(self._cost(release, 1, k, tokens))  # public: the search mask's floor
        candidates = self.index.within(query_vector, self.config.min_similarity)
        if self.config.records_per_unit is not None:  # each unit's nearest records only: its own records decide
            candidates = candidates.nearest_per_unit(self.index.units_of(candidates.ids), self.config.records_per_unit)
        admitted, entry = self._charge_candidates(candidates, release, k, tokens)
        return candidates, admitted, entry, k

    def _charge_candidates(
        self, candidates: Candidates, release: str, k: int, tokens: int
    ) -> tuple[Candidates, LedgerEntry]:
        """Charge every one of ``candidates`` through its unit's filter for a release of ``tokens`` tokens (one
        release: counted by the filter and recorded on the ledger, nothing private read): the admitted candidates
        and the committed ledger entry.

        Args:
            candidates: the release's candidates (the query's, from :meth:`_charge_release`'s search).
            release: the release kind.
            k: the release's k.
            tokens: the token mechanisms the release covers.
        """
        admitted, number = self.index.charge_release(
            candidates, lambda c: self._cost(release, c, k, tokens), release_tag=self._release_tag
        )
        entry = self.budget.spend(
            ev.with_privacy_unit(  # stated per the ledger's unit, the filter's (cover_event)
                ev.FilteredReleaseEvent(
                    self._event(release, 1, k, tokens), covered_by=self.cover_entry, neighbouring=ev.ADD_REMOVE
                ),
                self.budget.privacy_unit,
            ),
            # the release's number under this cover (public: every release counts, whatever it used), so that a
            # filter rolled back below it is caught even where earlier ledger writes failed; no data-dependent count
            label=f"knn-{release}:{self.index.id}{RELEASE_NUMBER}{number}",
        )
        return admitted, entry

    def _charged_records(self, admitted: Candidates, release: str, k: int) -> tuple[Candidates, list[RetrievedRecord]]:
        # A record another host removed after this copy's refresh may have paid; it takes no part.
        still, stored = self.index.present(admitted.ids)
        admitted = admitted.take(still)
        top_k = release in ("vote", "decode")  # the k nearest admitted; shards pick their own from all of them
        used = admitted.take(np.arange(len(admitted)) < k) if top_k else admitted
        records = [
            RetrievedRecord(
                PrivateText(r.text),
                None if r.label is None else PrivateText(r.label),
                None if r.answer is None else PrivateText(r.answer),
                float(s),
            )
            for r, s in zip(stored[: len(used)], used.similarities, strict=True)
        ]
        return used, records

    def vote(self, query: str | Retrieval, *, rng: np.random.Generator) -> Classification:
        """Nearest neighbours only: report-noisy-max over the labels of the k nearest candidates.

        Args:
            query: the public query text, or a :class:`Retrieval` charged by :meth:`retrieve` for ``"vote"``.
            rng: the noise source.

        Raises:
            ConfigurationError: bad ``rng``, query or retrieval (charged for another release or retriever, or
                released already), or a release this retriever cannot run; nothing is charged then.
            ReleaseFailedError: the computation failed after the charge.
        """
        with self._hold():
            return self._vote(query, rng)

    def _vote(self, query: str | Retrieval, rng: np.random.Generator) -> Classification:
        retrieval = self._retrieval(query, "vote", rng)  # charged (here or before); public checks only
        return after_charge(lambda: self._vote_released(retrieval, rng))  # a failure: the one fixed error

    def _vote_released(self, retrieval: Retrieval, rng: np.random.Generator) -> Classification:
        assert self.labels is not None
        counts = np.zeros(len(self.labels))
        position = {label: i for i, label in enumerate(self.labels)}
        for record in retrieval:
            if record.label is not None and record.label.reveal() in position:
                counts[position[record.label.reveal()]] += 1
        label = self.labels[report_noisy_max(counts, noise_std=self.noise_std, rng=rng)]
        return Classification(label, "vote", retrieval.ledger_entry)

    def classify(self, query: str | Retrieval, *, rng: np.random.Generator) -> Classification:
        """Shards of nearest records as demonstrations, one LLM vote per shard, report-noisy-max.

        Args:
            query: the public query text, or a :class:`Retrieval` charged by :meth:`retrieve` for ``"classify"``.
            rng: the noise source.

        Raises:
            ConfigurationError: bad ``rng``, query or retrieval (charged for another release or retriever, or
                released already), or a release this retriever cannot run; nothing is charged then.
            ReleaseFailedError: the computation failed after the charge.
        """
        with self._hold():
            return self._classify(query, rng)

    def _classify(self, query: str | Retrieval, rng: np.random.Generator) -> Classification:
        retrieval = self._retrieval(query, "classify", rng)  # charged (here or before); public checks only
        return after_charge(lambda: self._classify_released(retrieval, rng))  # a failure: the one fixed error

    def _classify_released(self, retrieval: Retrieval, rng: np.random.Generator) -> Classification:
        assert self.labels is not None and self.backend is not None
        shards = self._shards(retrieval, rng, need="label")
        counts = np.zeros(len(self.labels))
        prompts = [
            self._fit(self.classification_prompt.render(demos, retrieval._query, self.labels), room=1)
            for demos in shards
            if demos
        ]
        if prompts:
            scores = self.backend.next_token_logprobs(prompts)[:, self._label_token_ids()]
            # a shard whose row the model got wrong (NaN, +inf, nothing finite) abstains: its vote is still a
            # function of that shard alone, and one vote fewer moves the histogram less than a changed vote
            usable = ~np.isnan(scores).any(axis=1) & ~np.isposinf(scores).any(axis=1) & np.isfinite(scores).any(axis=1)
            np.add.at(counts, np.argmax(scores[usable], axis=1), 1.0)
        label = self.labels[report_noisy_max(counts, noise_std=self.noise_std, rng=rng)]
        return Classification(label, "classify", retrieval.ledger_entry)

    def answer(self, query: str | Retrieval, *, rng: np.random.Generator, keywords: int | None = None) -> Answer:
        """Keyword-space aggregation: shard answers → keyword histogram → DP keywords → public answer.

        ``keywords`` overrides ``config.keywords`` (how many keywords to release; the cost does not change).

        Args:
            query: the public query text, or a :class:`Retrieval` charged by :meth:`retrieve` for ``"answer"``.
            rng: the noise source.
            keywords: how many keywords to release.

        Raises:
            ConfigurationError: bad ``rng``, query or retrieval (charged for another release or retriever, or
                released already), or a release this retriever cannot run; nothing is charged then.
            ReleaseFailedError: the computation failed after the charge.
        """
        n_keywords = self.config.keywords if keywords is None else check.positive_int("keywords", keywords)
        with self._hold():
            return self._answer(query, rng, n_keywords)

    def _answer(self, query: str | Retrieval, rng: np.random.Generator, n_keywords: int) -> Answer:
        retrieval = self._retrieval(query, "answer", rng)  # charged (here or before); public checks only
        return after_charge(lambda: self._answer_released(retrieval, rng, n_keywords))  # a failure: the fixed error

    def _answer_released(self, retrieval: Retrieval, rng: np.random.Generator, n_keywords: int) -> Answer:
        backend = self.backend
        assert backend is not None
        words = self._keywords_of(retrieval, n_keywords, rng)
        # Everything below is post-processing of the release: the query is public, the keywords are DP.
        # Fitted like the shard prompts: a long query or long keywords shorten it rather than fail after the charge.
        final = self._fit(self.keyword_prompt.render(words, retrieval._query), room=self.config.max_answer_tokens + 1)
        text = backend.decode(greedy_generate(backend, [final], max_new_tokens=self.config.max_answer_tokens)[0])
        return Answer(text.strip(), words, retrieval.ledger_entry)

    def _keywords_of(self, retrieval: Retrieval, n_keywords: int, rng: np.random.Generator) -> tuple[str, ...] | None:
        """The DP keywords of a charged answer release (words; None when none passed): from the shards' answers, or
        (``keyword_source="records"``) from every charged record's own keywords."""
        assert self.backend is not None
        if self.config.records_vote:
            votes = [self._record_vote(record) for record in retrieval]
        else:
            shards = [demos for demos in self._shards(retrieval, rng, need="answer") if demos]
            votes = self._shard_answers(retrieval._query, shards)
        released = self._release_keywords(votes, n_keywords, rng)
        return None if released is None else tuple(self.backend.decode([t]).strip() for t in released)

    def _record_vote(self, record: RetrievedRecord) -> list[int]:
        """One candidate record's keyword tokens (private until released): those of its answer, else its label, else
        its text (which field is the record's own)."""
        assert self.backend is not None
        field = (
            record.answer if record.answer is not None else record.label if record.label is not None else record.text
        )
        return record_keywords(
            field.reveal(),
            per_record=self.config.keywords_per_answer,
            encode=self.backend.encode,
            is_keyword=self._is_keyword,
        )

    def _shard_answers(self, query: str, shards: list[list[tuple[str, str]]]) -> list[list[int]]:
        """Each shard's keyword tokens (non-private until released): alphanumeric tokens of its greedy answer,
        distinct, in order; with the threshold release only the first ``keywords_per_answer``."""
        if not shards:
            return []
        assert self.backend is not None
        room = self.config.max_answer_tokens + 1
        prompts = [self._fit(self.answer_prompt.render(demos, query), room=room) for demos in shards]
        per_answer = self.config.keywords_per_answer if self.config.keyword_release == "threshold" else None
        outputs = greedy_generate(self.backend, prompts, max_new_tokens=self.config.max_answer_tokens, public=False)
        return [answer_keywords(tokens, per_answer=per_answer, is_keyword=self._is_keyword) for tokens in outputs]

    def _is_keyword(self, token: int) -> bool:
        """A public property of the token: a row of the model's output (a tokenizer larger than the output layer
        has ids beyond it, which would fail the histogram after the charge), with a letter or digit, and not a
        stop word."""
        assert self.backend is not None
        if not 0 <= int(token) < self.backend.vocab_size:
            return False
        text = self.backend.decode([token]).strip()
        return any(ch.isalnum() for ch in text) and text.lower() not in self.config.stopwords

    def _release_keywords(
        self, answers: list[list[int]], n_keywords: int, rng: np.random.Generator
    ) -> tuple[int, ...] | None:
        """The DP keyword release over the shards' keyword sets: token ids, or None when none is released."""
        assert self.backend is not None
        if self.config.keyword_release == "threshold":
            counts = np.zeros(self.backend.vocab_size, dtype=np.int64)
            for tokens in answers:
                counts[tokens] += 1  # distinct within an answer
            return threshold_keywords(counts, noise_std=self.keyword_noise_std, limit=n_keywords, rng=rng).keywords
        histogram = Counter(token for tokens in answers for token in tokens)
        return stable_top_k(
            np.fromiter(histogram.keys(), dtype=np.int64, count=len(histogram)),
            np.fromiter(histogram.values(), dtype=np.int64, count=len(histogram)),
            k=n_keywords,
            noise_std=self.keyword_noise_std,
            delta=self.ptr_delta,
            rng=rng,
            group_size=1 if not self.index.group_by_user else self.config.shards,
        ).keywords

    def per_record_epsilon(self) -> float:
        """The ε each record is protected with over all releases of this index, under add/remove of a record:
        the filter's budget, or for a per-person index group privacy's 2ε (:meth:`cover_event`), whatever the
        ledger's unit (on a unit-level ledger each unit has the filter's own ε: :attr:`IndividualBudget.epsilon`).
        ``inf`` when group privacy gives a per-person budget no record-level guarantee (δ would reach 1)."""
        try:
            return self._record_cover().epsilon
        except ConfigurationError:
            return math.inf

    def per_record_delta(self) -> float:
        """The δ that goes with :meth:`per_record_epsilon` (per person: (1 + e^ε)δ; 1.0 with an ``inf`` ε)."""
        try:
            return self._record_cover().delta
        except ConfigurationError:
            return 1.0

    # -- internals --------------------------------------------------------------------------------
    def cover_event(self) -> ev.ApproxDPEvent:
        """What the index's filter costs the ledger, under add/remove of the ledger's privacy unit.

        Record-level ledger. Per record: the filter's own (ε, δ). Per person (``group_by_user``): the filter
        bounds adding or removing *all* of a person's records, but removing one of them changes that person's
        charges and so when the filter halts them; D and D minus one record are two person steps apart (through D
        without that person), so group privacy of size 2 gives (2ε, (1 + e^ε)δ) under add/remove of a record (a
        replace-one ledger then converts it to (4ε, (1 + e^ε + e^2ε + e^3ε)δ), four person steps).

        Unit-level ledger (``privacy_unit="unit"``, the index grouped by user with each record's unit as its
        user id): the filter's own (ε, δ), under add/remove of one unit, which is what the filter bounds (a
        replace-one ledger converts it to (2ε, (1 + e^ε)δ): remove the unit, add another). The index's user ids
        must be the ledger's units, or coarser (the ledger composes every charge over one partition into people;
        nothing here can check that). A per-record index cannot cover a unit-level ledger: its filter bounds one
        record, and a unit with many records is charged many budgets.

        Raises:
            ConfigurationError: that δ reaches 1 (no record-level guarantee follows), or a per-record index on a
                unit-level ledger; checked before any charge.
        """
        budget = self.index.filter.budget
        if self.budget.privacy_unit != PER_RECORD:
            if not self.index.group_by_user:
                raise ConfigurationError(
                    "a unit-level ledger needs an index grouped by user (PrivateIndex(..., group_by_user=True), each "
                    "record's unit as its user id): this index's filter bounds one record, not one unit"
                )
            return ev.with_privacy_unit(budget.as_event(), self.budget.privacy_unit)  # type: ignore[return-value]
        return self._record_cover()

    def _record_cover(self) -> ev.ApproxDPEvent:
        """The filter's total under add/remove of one record (see :meth:`cover_event`)."""
        budget = self.index.filter.budget
        if not self.index.group_by_user:
            return budget.as_event()
        delta = group_of_two_delta(budget.epsilon, budget.delta)  # rounded up
        if not delta < 1.0:
            raise ConfigurationError(
                f"a per-person budget of (epsilon={budget.epsilon}, delta={budget.delta}) gives no guarantee for "
                f"one record: group privacy turns it into a delta of {delta:.3g} (at least 1); lower epsilon or delta"
            )
        return ev.ApproxDPEvent(2.0 * budget.epsilon, delta, neighbouring=ev.ADD_REMOVE)

    def _cover(self) -> LedgerEntry:
        """The ledger entry covering the index's filter: found (after checking the filter was not rolled back
        below the releases recorded under it) or charged now."""
        label = f"knn-filter:{self.index.id}"
        event = self.cover_event()  # checked before anything is charged
        covers = [entry for entry in self.budget.history() if entry.label == label]
        for entry in covers:  # every one: two hosts starting together may both have charged one
            if entry.event == self.index.filter.budget.as_event() and event != entry.event:
                raise ConfigurationError(
                    "the ledger holds this person-grouped index's filter charged as if a person were a record "
                    "(without group privacy): its total understates what one record lost; use a new ledger"
                )
            if entry.event != event:
                raise ConfigurationError("the ledger holds this index's filter charge with another budget")
            # the ledger first, then the filter: every release is counted by the filter (under this cover's tag)
            # before the ledger records it, so a live filter never counts fewer
            self.index.filter.check_releases(
                self.budget.covered_releases(entry.id),
                release_tag=_release_tag(entry),
                ledger=f"the ledger (cover entry {entry.id})",
            )
        if covers:
            return covers[0]
        try:
            return self.budget.spend(event, label=label)
        except BudgetExhaustedError as exc:
            raise _second_cover_refused(exc, self.budget.history()) from None

    def _plan_releases(self, releases: Collection[str] | None) -> tuple[str, ...]:
        """The releases this retriever makes, checked against the public settings (the constructor's
        ``releases``): each one asked for must be useful, and of those only allowed by default at least one."""
        if releases is not None:
            if isinstance(releases, str) or not all(isinstance(r, str) for r in releases):
                raise ConfigurationError(f"releases must be a collection of {', '.join(RELEASES)}")
            asked = tuple(dict.fromkeys(releases))
            unknown = [r for r in asked if r not in RELEASES]
            if unknown or not asked:
                raise ConfigurationError(f"releases must name some of {', '.join(RELEASES)}, got {list(releases)!r}")
            for release in asked:
                why = self._unreleasable(release)
                if why is not None:
                    raise ConfigurationError(f"{why}; nothing was charged")
            self.asked_releases = asked
            if "decode" in asked:  # said before the cover (KNNExpertDecoder then says nothing more)
                self._warn_if_weak_experts()
            if "answer" in asked and self.config.records_vote:  # ... and KNNKeywordDecoder then neither
                self.warn_if_weak_hints()
            return asked
        labels, backend = self.labels is not None, self.backend is not None
        possible = {"vote": labels, "classify": labels and backend, "answer": backend, "decode": backend}
        allowed = tuple(r for r in RELEASES if possible[r])
        reasons = {r: why for r in allowed if (why := self._unreleasable(r)) is not None}
        useful = [r for r in allowed if r not in reasons]
        if not useful:
            found = "; ".join(reasons.values()) or (
                "it has neither labels (vote, classify) nor a backend (classify, answer, decode)"
            )
            raise ConfigurationError(f"this retriever could release nothing: {found}; nothing was charged")
        if "answer" in useful and self.config.records_vote:
            self.warn_if_weak_hints()
        if useful == ["decode"]:  # its own releases are useless: meant for expert decoding, or a mistake
            warnings.warn(
                f"{'; '.join(reasons.values())}. Only expert decoding (KNNExpertDecoder) could use this retriever: "
                "pass releases=('decode',) to say that is what it is for, or name the releases it is for to be "
                "refused before the filter's cover is charged",
                WeakReleaseWarning,
                stacklevel=3,
            )
        return allowed

    def _warn_if_weak_experts(self) -> None:
        """Warn (:class:`~dp_icl_plugin.errors.WeakReleaseWarning`) when the experts of a ``decode`` release can
        barely move a token (public settings only)."""
        clip, temperature = self.expert_scale()
        warn_if_weak(
            f"expert decoding over k = {self.config.k} records",
            log_odds_shift(clip / temperature),
            "raise the per-record epsilon or k, or lower config.uses or max_answer_tokens",
            read=self.config.k,
        )

    def warn_if_weak_hints(self) -> None:
        """Warn (:class:`~dp_icl_plugin.errors.WeakReleaseWarning`) when records voting keywords
        (``keyword_source="records"``) need more of them to share a word than ``config.k``, the candidates an
        answer is expected to have (public settings only): the answers would then be paid for and be zero-shot."""
        assert self.backend is not None
        threshold, _ = self.keyword_outlook()
        need = math.ceil(threshold)
        if need > self.config.k:
            warnings.warn(
                f"keyword hints: a word passes half the time only when about {need} candidate records share it "
                f"(threshold {threshold:.3g} noisy votes), more than the {self.config.k} candidates an answer is "
                "expected to have (config.k), so the answers will almost surely be the zero-shot answers while each "
                "is charged; raise the per-record epsilon, lower config.uses or keywords_per_answer, or lower "
                "min_similarity so that more records vote (see `dp-icl plan`)",
                WeakReleaseWarning,
                stacklevel=4,
            )

    def _unreleasable(self, release: str) -> str | None:
        """Why the public settings alone make ``release`` impossible or useless, or None."""
        if release in ("vote", "classify") and self.labels is None:
            return f"a {release} release needs the retriever's labels"
        if release in ("classify", "answer", "decode") and self.backend is None:
            return f"a {release} release needs a backend (a language model)"
        try:
            if release == "classify":
                self._label_token_ids()
            elif release == "decode" and self.config.expert_top_k:
                assert self.backend is not None
                check_top_k(min(self.config.expert_top_k, self.backend.vocab_size), self.backend)
        except ConfigurationError as exc:
            return f"a {release} release cannot be made: {exc}"
        if release == "answer" and self.config.keyword_release == "ptr" and self.ptr_delta <= 0:
            return "PTR keyword answers need approximate_delta > 0 in the index's IndividualBudget"
        if release == "answer" and self.config.keyword_release == "threshold":
            return self._keywords_cannot_pass()
        return None

    def _check_labels(self, labels: Sequence[str]) -> tuple[str, ...]:
        if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) < 2:
            raise ConfigurationError("labels must be a sequence of at least two label names")
        out = tuple(labels)
        if not all(isinstance(x, str) and x.strip() for x in out) or len(set(out)) != len(out):
            raise ConfigurationError("labels must be distinct non-empty strings")
        return out

    def _require(self, release: str) -> None:
        """Refuse, before anything is charged, a release the public settings make useless or that this retriever
        was not built for."""
        why = self._unreleasable(release)
        if why is not None:
            raise ConfigurationError(why)
        if release not in self.releases:
            raise ConfigurationError(
                f"this retriever was built for releases={self.releases!r}, not {release!r} (PrivateKNN(releases=...))"
            )

    def keyword_outlook(self) -> tuple[float, float]:
        """The threshold keyword release's threshold T and how often a keyword every shard says passes it,
        P[shards + N(0, σ²) > T] (public settings only). With records voting (``keyword_source="records"``) how
        many vote is private: the probability is then that of a keyword ⌈T⌉ records share (one half or more).

        Returns:
            ``(threshold, pass_probability)``.
        """
        assert self.backend is not None
        threshold = keyword_threshold(self.keyword_noise_std, self.backend.vocab_size)
        voters = math.ceil(threshold) if self.config.records_vote else self.config.shards
        return threshold, keyword_pass_probability(threshold, voters, self.keyword_noise_std)

    def _keywords_cannot_pass(self) -> str | None:
        """Why threshold keyword answers could release no keyword (public settings only), or None."""
        threshold, passes = self.keyword_outlook()
        everyone = (
            keyword_pass_probability(threshold, self.population, self.keyword_noise_std)
            if self.config.records_vote and self.population is not None
            else 1.0
        )
        if everyone < MIN_KEYWORD_PASS:
            return (
                f"keyword hints would release nothing: a word passes half the time only when about "
                f"{math.ceil(threshold)} candidate records share it (threshold {threshold:.3g} noisy votes), and "
                f"one all {self.population} records share passes with probability {everyone:.2g}; every candidate "
                f"would pay for the zero-shot answer. Raise the per-record epsilon, lower uses ({self.config.uses}) "
                f"or keywords_per_answer ({self.config.keywords_per_answer}), or use expert decoding (see "
                "`dp-icl plan`)"
            )
        if passes >= MIN_KEYWORD_PASS:
            return None
        return (
            f"keyword answers would release nothing: the threshold is {threshold:.3g} noisy votes but at most "
            f"{self.config.shards} shards vote, so a keyword every shard says passes with probability "
            f"{passes:.2g}; every candidate would pay for the zero-shot answer. Use more shards (at least "
            f"{math.ceil(threshold)}), fewer uses ({self.config.uses}) or keywords_per_answer "
            f"({self.config.keywords_per_answer}), a larger per-record epsilon, or expert decoding "
            "(KNNExpertDecoder; see `dp-icl plan`)"
        )

    def _check_answer_room(self, query: str) -> None:
        """Refuse, before the charge, a (public) query whose answer prompt cannot fit the model: the final
        keyword prompt with ``config.keywords`` keywords and the answer's tokens (also surfaces text the
        tokenizer rejects). Otherwise the release would be paid for and then cut the prompt's instruction."""
        assert self.backend is not None
        placeholders = ["x"] * self.config.keywords
        ids = self.backend.encode(self.keyword_prompt.render(placeholders, query), add_special_tokens=True)
        capacity = context_limit(self.backend)
        room = self.config.max_answer_tokens
        if capacity is not None and len(ids) + room > capacity:
            raise ConfigurationError(
                f"the query is too long: its answer prompt takes {len(ids)} of the model's "
                f"{capacity} positions and the answer {room} more"
            )

    def _label_token_ids(self) -> np.ndarray:
        if self._label_tokens is None:
            assert self.backend is not None and self.labels is not None
            # The first token after the label prefix, as the tokenizer splits "<prefix> <label>" in context.
            prefix = self.classification_prompt.label_prefix
            base = self.backend.encode(prefix)
            first = []
            for label in self.labels:
                ids = self.backend.encode(f"{prefix} {label}")
                if len(ids) <= len(base) or ids[: len(base)] != base:
                    raise ConfigurationError(f"label {label!r} does not tokenize as a continuation of {prefix!r}")
                first.append(ids[len(base)])
            if len(set(first)) != len(first):
                raise ConfigurationError("labels must start with distinct tokens: each is scored by its first token")
            self._label_tokens = np.asarray(first, dtype=np.int64)
        return self._label_tokens

    def _event(self, release: str, c: int, k: int | None = None, tokens: int | None = None) -> ev.DPEvent:
        """What one release costs a unit with ``c`` candidate records (a function of its own records only)."""
        if release == "decode":  # min(c, k) experts swapped, each moving ẑ by c_clip/k: ε0 per expert
            swapped = min(c, k or self.config.k)
            token = ev.ExponentialMechanismEvent(self.expert_epsilon * swapped, neighbouring=ev.ADD_REMOVE)
            paid = self.config.paid_tokens(tokens or self.config.max_answer_tokens)
            if not self.config.sparse:
                return ev.SelfComposedEvent(token, paid)
            # sparse: at most `paid` sparse-vector runs (the margin moves by ε0 per expert) and `paid` tokens
            test = ev.PureDPEvent(
                self.config.expert_test_ratio * self.expert_epsilon * swapped, neighbouring=ev.ADD_REMOVE
            )
            return ev.compose(ev.SelfComposedEvent(token, paid), ev.SelfComposedEvent(test, paid))
        cap = (self.config.k if k is None else k) if release == "vote" else self.config.shards
        if release == "answer" and self.config.keyword_release == "ptr":  # the group is inside the distance
            return ev.GaussianEvent(self.keyword_noise_std, sensitivity=1.0, neighbouring=ev.ADD_REMOVE)
        if release == "answer":  # records voting: each of the unit's c candidates adds or removes its own vote
            sensitivity = self.keyword_sensitivity * (c if self.config.records_vote else min(c, cap))
            noise = self.keyword_noise_std
        else:
            sensitivity, noise = SQRT2 * min(c, cap), self.noise_std
        return ev.GaussianEvent(noise / sensitivity, sensitivity=sensitivity, neighbouring=ev.ADD_REMOVE)

    def _cost(self, release: str, c: int, k: int | None = None, tokens: int | None = None) -> ReleaseCost:
        delta = self.ptr_delta if release == "answer" else 0.0  # 0 unless the keywords go by PTR
        return ReleaseCost.of(self._event(release, c, k, tokens), self.index.filter.budget.orders, delta=delta)

    def expert_scale(self, k: int | None = None) -> tuple[float, float]:
        """The clipping bound c and the experts' temperature τ of a ``decode`` release over ``k`` experts
        (default ``config.k``): one expert swapped moves the scores by c/(kτ) per token, an exponential mechanism
        of ε0 = 2c/(kτ) = :attr:`expert_epsilon`; so c = :data:`EXPERT_CLIP` and τ = 2c/(kε0). The experts
        then add at most c/τ = ε0·k/2 nats to a token's log-odds (public settings only).

        Args:
            k: the number of experts.

        Returns:
            ``(c, τ)``.

        Raises:
            ConfigurationError: ``k`` is not a positive integer.
        """
        k = self.config.k if k is None else check.positive_int("k", k)
        return EXPERT_CLIP, 2.0 * EXPERT_CLIP / (k * self.expert_epsilon)

    def _fit(self, text: str, *, room: int) -> list[int]:
        """A prompt's tokens, oldest cut first so that ``room`` positions stay free: a private demonstration
        too long for the model shortens the prompt (inside the release) instead of raising an error whose
        occurrence would depend on private text."""
        assert self.backend is not None
        ids = self.backend.encode(text, add_special_tokens=True)
        capacity = context_limit(self.backend)
        if capacity is None or len(ids) + room <= capacity:
            return ids
        return ids[len(ids) + room - capacity :]

    @contextmanager
    def _hold(self) -> Iterator[None]:
        """A release's latency window, inside the index's release turn (the turn first: a window must never wait
        inside for another release, and every holder takes the two in this order)."""
        if self.fixed_latency is None:
            yield
            return
        with self.index.release_turn.hold(), self.fixed_latency.hold():
            yield

    def _retrieval(self, query: str | Retrieval, release: str, rng: np.random.Generator) -> Retrieval:
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationTypeError("rng must be a numpy.random.Generator")
        if isinstance(query, Retrieval):
            if query.release != release:
                raise ConfigurationError(f"this retrieval was charged for a {query.release} release, not {release}")
            if query._charged_by is not self:  # another retriever's noise, sensitivity or δ was paid for
                raise ConfigurationError("this retrieval was charged by another retriever: release it there")
            retrieval = query
        else:
            retrieval = self.retrieve(query, release=release)
        retrieval.claim()
        return retrieval

    def _shards(self, retrieval: Retrieval, rng: np.random.Generator, *, need: str) -> list[list[tuple[str, str]]]:
        """Per-query shards: each shard's r most similar candidates; records lacking ``need`` sit idle, as do
        records the backend's tokenizer cannot encode (their own text decides: a failure after the charge
        would otherwise depend on them). Either way an idle record keeps its slot, so the others' shards do
        not change."""
        cfg = self.config
        keys = _shard_keys(retrieval._candidates.ids, int(rng.integers(0, 2**63)), cfg.shards)
        per_shard = retrieval.k // cfg.shards
        shards: list[list[tuple[str, str]]] = [[] for _ in range(cfg.shards)]
        taken = np.zeros(cfg.shards, dtype=np.int64)
        for record, key in zip(retrieval, keys.tolist(), strict=True):  # most similar first
            if taken[key] >= per_shard:
                continue
            taken[key] += 1
            field = record.label if need == "label" else record.answer
            if field is not None and self._encodes(record.text.reveal()) and self._encodes(field.reveal()):
                shards[key].append((record.text.reveal(), field.reveal()))
        return shards

    def _encodes(self, text: str) -> bool:
        assert self.backend is not None
        try:
            self.backend.encode(text)
        except Exception:  # tokenizers raise plain Exception for what they cannot encode
            return False
        return True
