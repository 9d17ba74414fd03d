"""PrivateKNN: who pays, the ledger, determinism, private text, bad input; end to end on a tiny GPT-2
with the real MiniLM embedder and TREC."""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from tests_support import SHARED, tiny_text_gpt2

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget
from dp_icl_plugin.accounting import FilteredReleaseEvent, IndividualBudget
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.errors import WeakReleaseWarning
from dp_icl_plugin.retrieval import (
    AnswerPrompt,
    ClassificationPrompt,
    KeywordAnswerPrompt,
    KNNConfig,
    PrivateIndex,
    PrivateKNN,
    Retrieval,
)
from dp_icl_plugin.retrieval.retriever import _shard_keys

LABELS = ["red", "green", "blue"]
CANARY = "zzcanaryzz"


class BagEmbedder:
    """Bag of words hashed into 32 dimensions: similar word sets, similar vectors."""

    name = "bag32"

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 32))
        for i, text in enumerate(texts):
            for word in text.split():
                out[i, sum(map(ord, word)) % 32] += 1.0
            out[i, 31] += 0.1  # never a zero vector
        return out


def records(n: int = 60) -> tuple[list[str], list[str], list[str]]:
    texts = [f"{LABELS[i % 3]} thing number{i % 7} {CANARY}{i}" for i in range(n)]
    return texts, [LABELS[i % 3] for i in range(n)], [f"{LABELS[i % 3]}" for i in range(n)]


def fake_backend(texts: list[str]) -> FakeBackend:
    words: set[str] = set()
    for t in texts + LABELS:
        words |= set(t.split()) | {w + "," for w in t.split()}
    for rendered in (
        ClassificationPrompt().render([("x", "y")], "q", LABELS),
        AnswerPrompt().render([("x", "y")], "q"),
        KeywordAnswerPrompt().render(["k"], "q"),
    ):
        words |= set(rendered.split())
    return FakeBackend(sorted(words | {"<eos>"}), eos_token="<eos>", seed=3)


def setup(*, config: KNNConfig | None = None, n: int = 60, group_by_user: bool = False, **budget_kwargs):
    texts, labels, answers = records(n)
    index = PrivateIndex(
        budget=IndividualBudget(epsilon=budget_kwargs.pop("epsilon", 2.0), delta=1e-5),
        embedder=BagEmbedder(),
        group_by_user=group_by_user,
    )
    users = [f"user{i % 10}" for i in range(n)] if group_by_user else None
    index.add(texts, labels=labels, answers=answers, user_ids=users)
    # a person's (2, 1e-5) is (4, 8.4e-5) per record under add/remove; replace-one would need a δ of 4.7e-3
    ledger = BudgetManager(PrivacyBudget(10.0, 1e-4, neighbouring="add_remove" if group_by_user else "replace_one"))
    retriever = PrivateKNN(
        index,
        budget=ledger,
        backend=fake_backend(texts),
        labels=LABELS,
        config=config or KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4, keywords=2),
    )
    return index, ledger, retriever


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_the_ledger_holds_the_filter_total_once_and_a_record_of_every_release() -> None:
    index, ledger, retriever = setup()
    rng = np.random.default_rng(0)
    retriever.vote("red thing number1", rng=rng)
    retriever.classify("green thing number2", rng=rng)
    retriever.answer("blue thing number3", rng=rng)
    again = PrivateKNN(index, budget=ledger, labels=LABELS)  # a second retriever: no second charge
    assert again.cover_entry == retriever.cover_entry
    history = ledger.history()
    assert [e.label.split(":")[0] for e in history] == ["knn-filter", "knn-vote", "knn-classify", "knn-answer"]
    assert history[0].event == index.filter.budget.as_event()
    assert all(isinstance(e.event, FilteredReleaseEvent) and e.event.covered_by == history[0].id for e in history[1:])
    # The filter's (ε, δ) = (2, 1e-5) under add/remove, however many releases, held by the replace-one ledger
    # as its group-privacy conversion (2ε, (1 + e^ε)δ); no label carries a count.
    assert ledger.neighbouring == "replace_one"
    assert ledger.spent().epsilon == pytest.approx(4.0, rel=1e-4)
    assert len({e.label for e in history[1:]}) == 3 and not any("units" in e.label for e in history)


def test_every_candidate_pays_and_nobody_else() -> None:
    index, _, retriever = setup()
    query = "red thing number1"
    q = index.embed_query(query)
    candidates = set(index.within(q, 0.6).ids.tolist())
    outside = sorted(set(range(1, 61)) - candidates)
    assert candidates and outside
    retriever.vote(query, rng=np.random.default_rng(0))
    spent = index.filter.spent(np.arange(1, 61))[0].sum(axis=1)
    assert {i + 1 for i in np.flatnonzero(spent > 0)} == candidates
    expected = retriever._cost("vote", 1).rdp
    for rid in candidates:
        np.testing.assert_allclose(index.filter.spent(np.array([rid]))[0][0], expected)


def test_records_are_used_at_most_uses_times_then_skipped() -> None:
    index, _, retriever = setup(config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=2))
    rng = np.random.default_rng(1)
    query = "red thing number1"
    first = retriever.retrieve(query, release="vote")
    assert len(first) == 8
    retriever.retrieve(query, release="vote")
    third = retriever.retrieve(query, release="vote")
    used_before = set(index.within(index.embed_query(query), 0.6).ids.tolist())
    assert not used_before  # all candidates above τ are exhausted after 2 uses
    assert len(third) == 0 and not third.complete
    assert retriever.vote(third, rng=rng).label in LABELS  # a release on nothing is pure noise, still valid


def test_a_person_pays_for_all_their_records() -> None:
    index, _, retriever = setup(group_by_user=True, config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=50))
    query = "red thing number1"
    candidates = index.within(index.embed_query(query), 0.6)
    units, counts = np.unique(index.units_of(candidates.ids), return_counts=True)
    retriever.classify(query, rng=np.random.default_rng(0))
    spent = index.filter.spent(units)[0]
    for row, c in zip(spent, counts, strict=True):
        np.testing.assert_allclose(row, retriever._cost("classify", int(c)).rdp)
        assert retriever._event("classify", int(c)).sensitivity == pytest.approx(math.sqrt(2) * min(c, 4))


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_fixed_seed_gives_identical_releases() -> None:
    outs = []
    for _ in range(2):
        _, _, retriever = setup()
        rng = np.random.default_rng(42)
        outs.append(
            [
                retriever.vote("red thing number1", rng=rng).label,
                retriever.classify("blue thing number5", rng=rng).label,
                retriever.answer("green thing number4", rng=rng).text,
            ]
        )
    assert outs[0] == outs[1]


def test_removing_one_candidate_changes_at_most_one_shard() -> None:
    ids = np.arange(1, 200)
    keys = _shard_keys(ids, 12345, 10)
    assert np.bincount(keys, minlength=10).min() > 5  # spread over all shards
    np.testing.assert_array_equal(_shard_keys(np.delete(ids, 17), 12345, 10), np.delete(keys, 17))


def test_private_text_never_prints_pickles_or_leaks_into_errors() -> None:
    _, _, retriever = setup()
    retrieval = retriever.retrieve("red thing number1", release="vote")
    shown = f"{retrieval} {list(retrieval)} {retrieval[0].text} {retrieval[0]!r} {retriever!r} {retriever.index!r}"
    assert CANARY not in shown and "<private" in shown
    assert CANARY in retrieval[0].text.reveal()
    with pytest.raises(TypeError):
        pickle.dumps(retrieval)
    with pytest.raises(TypeError):
        pickle.dumps(retrieval[0].text)
    with pytest.raises(ConfigurationError) as info:
        retriever.classify(retrieval, rng=np.random.default_rng(0))
    assert CANARY not in str(info.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.retrieve("red", release="summarise"), "release must be"),
        (lambda r: r.retrieve("   "), "query"),
        (lambda r: r.vote("red", rng=None), "rng"),
        (lambda r: PrivateKNN(r.index, budget=r.budget).vote("red", rng=np.random.default_rng(0)), "labels"),
        (
            lambda r: PrivateKNN(r.index, budget=r.budget, labels=LABELS).classify("red", rng=np.random.default_rng(0)),
            "backend",
        ),
        (lambda r: PrivateKNN(r.index, budget=r.budget, labels=["red", "red"]), "distinct"),
        (lambda r: PrivateKNN(r.index, budget=None), "BudgetManager"),
        (lambda r: KNNConfig(k=10, shards=4), "multiple"),
        (lambda r: KNNConfig(min_similarity=2.0), "min_similarity"),
        (lambda r: KNNConfig(keyword_release="top-k"), "keyword_release"),
        (lambda r: KNNConfig(keywords_per_answer=0), "keywords_per_answer"),
    ],
)
def test_bad_input_is_refused_before_anything_is_charged(call, message) -> None:
    index, ledger, retriever = setup()
    before = (len(ledger.history()), index.filter.all_spent()[0].size)
    with pytest.raises(ConfigurationError, match=message):
        call(retriever)
    assert (len(ledger.history()), index.filter.all_spent()[0].size) == before


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_ptr_answers_need_an_approximate_delta_share_and_threshold_answers_spend_none() -> None:
    texts, labels, answers = records(9)
    index = PrivateIndex(
        budget=IndividualBudget(epsilon=2.0, delta=1e-5, approximate_delta=0.0), embedder=BagEmbedder()
    )
    index.add(texts, labels=labels, answers=answers)
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-4))
    with pytest.raises(ConfigurationError, match="approximate_delta"):  # refused before the cover
        PrivateKNN(
            index,
            budget=ledger,
            backend=fake_backend(texts),
            config=KNNConfig(keyword_release="ptr"),
            releases=["answer"],
        )
    assert ledger.history() == []
    ptr = PrivateKNN(
        index, budget=ledger, backend=fake_backend(texts), labels=LABELS, config=KNNConfig(keyword_release="ptr")
    )
    with pytest.raises(ConfigurationError, match="approximate_delta"):
        ptr.answer("red thing", rng=np.random.default_rng(0))
    threshold = PrivateKNN(index, budget=ledger, backend=fake_backend(texts), config=KNNConfig(k=8, shards=4))
    threshold.answer("red thing", rng=np.random.default_rng(0))
    _, spent, spent_delta = index.filter.all_spent()
    assert spent_delta.max() == 0.0 and spent.max() > 0


def _refusing(ledger: BudgetManager) -> BudgetManager:
    class Refusing(BudgetManager):
        def spend(self, event, *, label):  # type: ignore[no-untyped-def]
            raise ValueError("halt: the test stops at the cover")

    refusing = Refusing.__new__(Refusing)
    refusing.__dict__.update(ledger.__dict__)
    return refusing


def test_a_retriever_that_could_release_nothing_is_refused_before_its_cover() -> None:
    """Issue 40, item 4: keyword answers whose threshold no keyword can pass were refused at every answer(), after
    the filter's cover had been charged at construction. What decides it is public: now refused before the cover."""
    texts, labels, answers = records(60)
    index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=BagEmbedder())
    index.add(texts, labels=labels, answers=answers)
    ledger = BudgetManager(PrivacyBudget(5.0, 1e-4))
    hopeless = KNNConfig(k=20, shards=5, uses=4)
    with pytest.warns(WeakReleaseWarning, match="Only expert decoding"), pytest.raises(ValueError, match="halt"):
        # the retriever: warned before the cover (expert decoding could use it); the ledger is made to
        # refuse the cover so that nothing is charged here
        PrivateKNN(index, budget=_refusing(ledger), backend=fake_backend(texts), config=hopeless)
    with pytest.raises(ConfigurationError, match=r"keyword answers would release nothing: .* nothing was charged"):
        PrivateKNN(index, budget=ledger, backend=fake_backend(texts), config=hopeless, releases=("answer",))
    with pytest.raises(ConfigurationError, match=r"the threshold is [\d.]+ noisy votes but at most 5 shards"):
        PrivateKNN(
            index, budget=ledger, backend=fake_backend(texts), config=hopeless, labels=LABELS, releases=["answer"]
        )
    with pytest.raises(ConfigurationError, match="needs the retriever's labels"):
        PrivateKNN(index, budget=ledger, backend=fake_backend(texts), config=hopeless, releases=("vote",))
    with pytest.raises(ConfigurationError, match="releases must name"):
        PrivateKNN(index, budget=ledger, labels=LABELS, releases=("votes",))
    assert ledger.history() == []  # nothing paid for nothing
    # votes are useful with these settings: the cover is paid for them, and an answer is refused before its charge
    knn = PrivateKNN(index, budget=ledger, backend=fake_backend(texts), config=hopeless, labels=LABELS)
    assert knn.releases == ("vote", "classify", "answer", "decode")
    with pytest.raises(ConfigurationError, match="would release nothing"):
        knn.answer("red thing", rng=np.random.default_rng(0))
    votes_only = PrivateKNN(
        index, budget=ledger, backend=fake_backend(texts), config=hopeless, labels=LABELS, releases=("vote",)
    )
    votes_only.vote("red thing", rng=np.random.default_rng(0))
    with pytest.raises(ConfigurationError, match="built for releases"):
        votes_only.retrieve("red thing", release="classify")
    assert [e.label.split(":")[0] for e in ledger.history()] == ["knn-filter", "knn-vote"]


@pytest.mark.parametrize("uses", [1, 2, 3])
def test_a_record_joins_exactly_uses_ptr_answers(uses: int) -> None:
    """Issue 40, item 3: δ0 = approximate_delta / uses filled the δ share exactly, while the filter keeps 1e-9 of
    room below it: a record joined uses − 1 PTR answers (none at the default uses=1, every answer a paid zero-shot
    one). δ0 now leaves that room, as the calibrated noise does below the RDP caps."""
    texts, labels, answers = records(6)
    index = PrivateIndex(budget=IndividualBudget(epsilon=2.0, delta=1e-5), embedder=BagEmbedder())
    index.add(texts, labels=labels, answers=answers)
    knn = PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(1e6, 1e-3)),
        backend=fake_backend(texts),
        config=KNNConfig(k=6, shards=2, min_similarity=-1.0, uses=uses, keyword_release="ptr"),
    )
    joined = [len(knn.retrieve("red thing", release="answer")) for _ in range(uses + 2)]
    assert joined == [6] * uses + [0, 0]
    _, _, spent_delta = index.filter.all_spent()
    assert (spent_delta <= index.filter.budget.approximate_delta).all()


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_a_threshold_answer_charges_the_gaussian_of_its_histogram_sensitivity() -> None:
    """Each shard adds its first m keyword tokens: √(2m) per shard, RDP α·Δ²/(2σ²), σ the release's noise."""
    index, _, retriever = setup(config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=3, keywords_per_answer=5))
    query = "red thing number1"
    candidates = index.within(index.embed_query(query), 0.6)
    retriever.answer(query, rng=np.random.default_rng(0))
    orders = np.asarray(index.filter.budget.orders)
    expected = orders * (2 * 5) / (2 * retriever.keyword_noise_std**2)
    spent, spent_delta = index.filter.spent(candidates.ids)
    np.testing.assert_allclose(spent, np.tile(expected, (len(candidates), 1)), rtol=1e-9)
    assert spent_delta.max() == 0.0
    # σ is the smallest that lets a record take part in `uses` answers: a fourth no longer fits.
    caps = index.filter.budget.caps
    assert ((3 * expected <= caps * (1 + 1e-6)) & np.isfinite(caps)).any()
    assert not ((4 * expected <= caps) & np.isfinite(caps)).any()


def test_a_person_grouped_filter_is_charged_to_the_record_ledger_by_group_privacy() -> None:
    """A person's filter bounds adding or removing a whole person. Removing one of their records changes their
    whole trajectory (their charges, then when they are halted): D and D minus one record are two person
    steps apart (through D without that person), so the record ledger holds (2ε, (1 + e^ε)δ) under add/remove,
    and 4 person steps, (4ε, (1 + e^ε + e^2ε + e^3ε)δ), under replace-one."""
    from dp_icl_plugin.accounting.conversion import to_relation
    from dp_icl_plugin.errors import BudgetExhaustedError

    eps, delta = 1.5, 1e-7

    def person_index(epsilon: float = eps) -> PrivateIndex:
        budget = IndividualBudget(epsilon=epsilon, delta=delta)
        return PrivateIndex(budget=budget, embedder=BagEmbedder(), group_by_user=True)

    add_remove = BudgetManager(PrivacyBudget(10.0, 1e-5, neighbouring="add_remove"))
    PrivateKNN(person_index(), budget=add_remove, labels=LABELS)
    (cover,) = add_remove.history()
    event = cover.event
    assert isinstance(event, ev.ApproxDPEvent) and event.neighbouring == "add_remove"
    assert (event.epsilon, event.delta) == pytest.approx((2 * eps, (1 + math.exp(eps)) * delta), rel=1e-12)
    replaced = to_relation(event, "replace_one")
    assert isinstance(replaced, ev.ApproxDPEvent)
    four_steps = sum(math.exp(j * eps) for j in range(4)) * delta
    assert (replaced.epsilon, replaced.delta) == pytest.approx((4 * eps, four_steps), rel=1e-12)
    # A ledger too small for the converted cover refuses it (the unconverted (ε, δ) would have fitted).
    small = BudgetManager(PrivacyBudget(2.5, 1e-5, neighbouring="add_remove"))
    with pytest.raises(BudgetExhaustedError):
        PrivateKNN(person_index(), budget=small, labels=LABELS)
    # No record-level guarantee at all when group privacy's δ reaches 1: refused before any charge.
    big = BudgetManager(PrivacyBudget(1e3, 1e-3, neighbouring="add_remove"))
    with pytest.raises(ConfigurationError, match="group privacy"):
        PrivateKNN(person_index(epsilon=20.0), budget=big, labels=LABELS)
    assert big.history() == [] and small.history() == []
    # What the adapters report as each record's guarantee is the record-level one, not the person's.
    grouped = PrivateKNN(
        person_index(), budget=BudgetManager(PrivacyBudget(10.0, 1e-5, neighbouring="add_remove")), labels=LABELS
    )
    assert (grouped.per_record_epsilon(), grouped.per_record_delta()) == (event.epsilon, event.delta)
    # A ledger that already holds the unconverted cover (written before this conversion) is refused.
    index = person_index()
    old = BudgetManager(PrivacyBudget(10.0, 1e-5, neighbouring="add_remove"))
    old.spend(index.filter.budget.as_event(), label=f"knn-filter:{index.id}")
    with pytest.raises(ConfigurationError, match="as if a person were a record"):
        PrivateKNN(index, budget=old, labels=LABELS)
    # Per-record indexes keep the filter's own (ε, δ).
    per_record = PrivateIndex(budget=IndividualBudget(epsilon=eps, delta=delta), embedder=BagEmbedder())
    plain = PrivateKNN(per_record, budget=big, labels=LABELS)
    assert big.history()[0].event == ev.ApproxDPEvent(eps, delta, neighbouring="add_remove")
    assert (plain.per_record_epsilon(), plain.per_record_delta()) == (eps, delta)


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_a_person_pays_a_threshold_answer_for_every_shard_they_can_change() -> None:
    config = KNNConfig(k=8, shards=4, min_similarity=0.6, uses=50, keywords_per_answer=3)
    index, _, retriever = setup(group_by_user=True, config=config)
    query = "red thing number1"
    units, counts = np.unique(index.units_of(index.within(index.embed_query(query), 0.6).ids), return_counts=True)
    assert counts.max() > 1
    retriever.answer(query, rng=np.random.default_rng(0))
    orders = np.asarray(index.filter.budget.orders)
    for row, c in zip(index.filter.spent(units)[0], counts, strict=True):
        sensitivity = math.sqrt(2 * 3) * min(int(c), 4)
        np.testing.assert_allclose(row, orders * sensitivity**2 / (2 * retriever.keyword_noise_std**2), rtol=1e-9)


def test_a_retrieval_is_released_once_and_by_its_own_kind() -> None:
    _, _, retriever = setup()
    retrieval = retriever.retrieve("red thing number1", release="classify")
    assert isinstance(retrieval, Retrieval)
    with pytest.raises(ConfigurationError, match="classify"):
        retriever.vote(retrieval, rng=np.random.default_rng(0))
    retriever.classify(retrieval, rng=np.random.default_rng(0))
    with pytest.raises(ConfigurationError, match="once"):
        retriever.classify(retrieval, rng=np.random.default_rng(0))


# ------------------------------------------------------------------ the real embedder and a tiny GPT-2


def _trec(limit: int) -> tuple[list[str], list[str]]:
    path = SHARED / "data" / "trec" / "train.txt"
    if not path.is_file():
        pytest.skip("../shared/data/trec is not available")
    lines = path.read_text(encoding="latin-1").splitlines()[:limit]
    coarse = [line.split(" ", 1)[0].split(":")[0] for line in lines]
    return [line.split(" ", 1)[1] for line in lines], coarse


@pytest.mark.usefixtures("weak_keywords_allowed")
@pytest.mark.slow
def test_classify_and_answer_on_a_tiny_gpt2_with_minilm(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    torch = pytest.importorskip("torch")
    from dp_icl_plugin.backends.hf import HFBackend

    torch.set_num_threads(1)
    texts, coarse = _trec(300)
    names = {
        "ABBR": "abbreviation",
        "DESC": "description",
        "ENTY": "entity",
        "HUM": "human",
        "LOC": "location",
        "NUM": "number",
    }
    labels = [names[c] for c in coarse]
    prompts = [
        ClassificationPrompt(item="question", text_prefix="Question:").render([(t, lab)], t, list(names.values()))
        for t, lab in zip(texts, labels, strict=True)
    ]
    extra = [AnswerPrompt().render([("a", "b")], "c"), KeywordAnswerPrompt().render(["k"], "q")]
    model_dir = tiny_text_gpt2(tmp_path / "gpt2", [*prompts, *extra])
    backend = HFBackend.from_pretrained(model_dir, device="cpu", dtype="float32")
    index = PrivateIndex(budget=IndividualBudget(epsilon=4.0, delta=1e-5), path=tmp_path / "index")
    index.add(texts, labels=labels, answers=labels)
    ledger = BudgetManager(PrivacyBudget(8.0, 1e-4, neighbouring="add_remove"), ledger=tmp_path / "ledger.db")
    retriever = PrivateKNN(
        index,
        budget=ledger,
        backend=backend,
        labels=list(names.values()),
        config=KNNConfig(k=8, shards=4, min_similarity=0.3, uses=3, keywords=2, max_answer_tokens=4),
        classification_prompt=ClassificationPrompt(item="question", text_prefix="Question:"),
    )
    rng = np.random.default_rng(0)
    query = "How far is it from Denver to Aspen ?"
    assert retriever.vote(query, rng=rng).label in names.values()
    assert retriever.classify(query, rng=rng).label in names.values()
    answer = retriever.answer(query, rng=rng)
    assert isinstance(answer.text, str)
    assert answer.keywords is None or len(answer.keywords) == 2
    charged = index.filter.all_spent()[0]
    assert 0 < len(charged) < len(texts)  # the near records paid, the others did not
    reopened = PrivateIndex.open(tmp_path / "index")
    np.testing.assert_array_equal(reopened.filter.all_spent()[1], index.filter.all_spent()[1])
    assert [e.label.split(":")[0] for e in BudgetManager.open(tmp_path / "ledger.db").history()] == [
        "knn-filter",
        "knn-vote",
        "knn-classify",
        "knn-answer",
    ]


def test_k_per_call_and_fewer_records_than_k_are_flagged_never_padded() -> None:
    _, _, retriever = setup()
    small = retriever.retrieve("red thing number1", release="vote", k=3)
    assert len(small) == 3 and small.complete
    big = retriever.retrieve("red thing number1", release="vote", k=1000)
    assert 0 < len(big) < 1000 and not big.complete
    with pytest.raises(ConfigurationError, match="multiple"):
        retriever.retrieve("red thing number1", release="classify", k=6)


@pytest.mark.usefixtures("weak_keywords_allowed")
@pytest.mark.parametrize("release", ["vote", "classify", "answer", "answer-ptr"])
def test_an_empty_index_releases_and_charges_as_a_one_record_index_does(release: str) -> None:
    """Whether the index holds a record is private (add/remove): an empty index must not raise where a
    one-record index answers. Both go through the same release and record the same ledger event."""
    kind = release.split("-")[0]
    config = KNNConfig(
        k=4,
        shards=2,
        min_similarity=0.5,
        uses=2,
        keywords=2,
        keyword_release="ptr" if release.endswith("ptr") else "threshold",
    )
    texts = ["red thing number1"]

    def run(records: list[str]) -> tuple[type, object, int]:
        index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=BagEmbedder())
        index.add(records, labels=["red"] * len(records), answers=["red"] * len(records))
        ledger = BudgetManager(PrivacyBudget(1e3, 1e-3, neighbouring="add_remove"))
        knn = PrivateKNN(index, budget=ledger, backend=fake_backend(texts), labels=LABELS, config=config)
        out = getattr(knn, kind)("red thing number1", rng=np.random.default_rng(0))
        history = ledger.history()
        assert [e.label.split(":")[0] for e in history] == ["knn-filter", f"knn-{kind}"]
        return type(out), history[-1].event, index.filter.all_spent()[0].size

    empty, one = run([]), run(texts)
    assert empty[:2] == one[:2]  # same kind of output, same event charged
    assert (empty[2], one[2]) == (0, 1)  # the record was a candidate and paid; nobody could in the empty index


def test_records_without_a_label_take_a_place_but_cast_no_vote() -> None:
    index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-5), embedder=BagEmbedder())
    index.add(["red thing a", "red thing b", "red thing c"], labels=[None, None, "green"])
    retriever = PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(2.0, 1e-4)),
        labels=LABELS,
        config=KNNConfig(k=2, shards=1, min_similarity=0.5),
    )
    retrieval = retriever.retrieve("red thing", release="vote")
    assert len(retrieval) == 2  # the two most similar, whatever their labels
    assert index.filter.all_spent()[0].size == 3  # all three candidates paid
    label = retriever.vote(retrieval, rng=np.random.default_rng(0)).label
    assert label in LABELS  # the two used cast no vote: the noise alone decides


def test_private_demonstrations_too_long_for_the_model_shorten_the_prompt_instead_of_raising() -> None:
    texts, labels, answers = records(30)

    class Short(FakeBackend):
        max_length = 40

        def next_token_logprobs(self, prompts):  # type: ignore[override]
            assert all(len(p) <= self.max_length for p in prompts)
            return super().next_token_logprobs(prompts)

        def start(self, prompts):  # type: ignore[override]
            assert all(len(p) < self.max_length for p in prompts)
            return super().start(prompts)

        def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
            # the final prompt lists released keywords joined by ", ": a released "word," becomes "word,,"
            return super().encode(re.sub(",+", ",", text), add_special_tokens=add_special_tokens)

    index = PrivateIndex(budget=IndividualBudget(epsilon=50.0, delta=1e-5), embedder=BagEmbedder())
    index.add([t + " thing thing thing thing" for t in texts], labels=labels, answers=answers)
    base = fake_backend(texts)
    short = Short(base.vocab, eos_token="<eos>", seed=3)
    retriever = PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(60.0, 1e-4, neighbouring="add_remove")),
        backend=short,
        labels=LABELS,
        config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4, keywords=2, max_answer_tokens=4),
    )
    rng = np.random.default_rng(0)
    assert retriever.classify("red thing number1", rng=rng).label in LABELS
    assert isinstance(retriever.answer("red thing number1", rng=rng).text, str)
    # More keywords than configured lengthen the final prompt, which is fitted too (after the charge: no error).
    assert isinstance(retriever.answer("red thing number1 thing thing", rng=rng, keywords=12).text, str)
    # A (public) query whose answer prompt cannot fit the model is refused before anything is charged.
    spent = retriever.budget.spent()
    with pytest.raises(ConfigurationError, match="query is too long"):
        retriever.answer("red thing number1" + " thing" * 60, rng=rng)
    assert retriever.budget.spent() == spent


def test_whether_a_record_takes_part_never_depends_on_another_records_presence() -> None:
    """The search mask's floor comes from the releases' public settings, not from the costs charged: with a
    floor made of charged costs, record j's presence (it alone matched one query) lowered the floor and let
    record i take part in later releases, and its absence masked i out (a cold review's reproducer)."""

    def later_uses(with_j: bool) -> list[int]:
        index = PrivateIndex(budget=IndividualBudget(epsilon=2.0, delta=1e-5), embedder=BagEmbedder())
        texts = ["blue sky"] + (["red apple"] if with_j else [])
        index.add(texts, labels=[t.split()[0] for t in texts])
        ledger = BudgetManager(PrivacyBudget(1e6, 1e-3))

        def knn(uses: int) -> PrivateKNN:
            return PrivateKNN(
                index,
                budget=ledger,
                labels=["red", "blue"],
                config=KNNConfig(k=4, shards=2, min_similarity=0.9, uses=uses),
            )

        dear, mid, cheap = knn(2), knn(3), knn(8)
        dear.retrieve("blue sky", release="vote")
        mid.retrieve("blue sky", release="vote")
        cheap.retrieve("red apple", release="vote")  # only j is near this query
        return [len(cheap.retrieve("blue sky", release="vote")) for _ in range(2)]

    assert later_uses(True) == later_uses(False)
    assert later_uses(False)[0] == 1  # i can still afford one cheap release, and takes part in it


def test_keywords_are_tokens_with_a_letter_or_digit_that_are_not_stop_words() -> None:
    _, _, retriever = setup()
    backend = retriever.backend
    assert backend is not None
    token = {word: backend.encode(word)[0] for word in ("red", "the", "thing")}
    assert retriever._is_keyword(token["red"]) and retriever._is_keyword(token["thing"])
    assert not retriever._is_keyword(token["the"])  # a stop word
    custom = setup(config=KNNConfig(k=8, shards=4, stopwords=["RED"]))[2]
    assert not custom._is_keyword(token["red"]) and custom._is_keyword(token["the"])


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_a_retrieval_is_released_only_by_the_retriever_that_charged_it() -> None:
    """A PTR retriever's charge (sensitivity 1) must not pay for another retriever's threshold release."""
    index, ledger, _ = setup()
    texts, _, _ = records()
    ptr = PrivateKNN(
        index,
        budget=ledger,
        backend=fake_backend(texts),
        config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4, keyword_release="ptr"),
    )
    threshold = PrivateKNN(
        index, budget=ledger, backend=fake_backend(texts), config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4)
    )
    retrieval = ptr.retrieve("red thing number1", release="answer")
    with pytest.raises(ConfigurationError, match="another retriever"):
        threshold.answer(retrieval, rng=np.random.default_rng(0))
    ptr.answer(retrieval, rng=np.random.default_rng(0))


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_the_threshold_release_puts_noise_on_every_token_of_the_vocabulary(monkeypatch) -> None:
    from dp_icl_plugin.retrieval import retriever as module

    seen = []
    real = module.threshold_keywords
    monkeypatch.setattr(module, "threshold_keywords", lambda counts, **kw: seen.append(counts) or real(counts, **kw))
    _, _, retriever = setup(config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4))
    retriever.answer("red thing number1", rng=np.random.default_rng(0))
    assert retriever.backend is not None
    (counts,) = seen
    assert counts.shape == (retriever.backend.vocab_size,) and counts.sum() > 0


def test_a_shard_whose_row_the_model_got_wrong_abstains(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN row voted for the first label (argmax returns the first NaN's index): still one shard's vote, but a
    bias towards labels[0]. It now abstains (review of issue 30)."""
    from dp_icl_plugin.retrieval import retriever as retriever_module

    _, _, retriever = setup()
    real = retriever.backend.next_token_logprobs
    monkeypatch.setattr(retriever.backend, "next_token_logprobs", lambda prompts: real(prompts) * np.nan)
    seen: list[np.ndarray] = []
    noisy_max = retriever_module.report_noisy_max

    def spy(counts: np.ndarray, **kwargs: object) -> int:
        seen.append(np.array(counts, copy=True))
        return noisy_max(counts, **kwargs)

    monkeypatch.setattr(retriever_module, "report_noisy_max", spy)
    retriever.classify("red thing number1", rng=np.random.default_rng(0))
    assert len(seen) == 1 and seen[0].sum() == 0  # every shard abstained: no vote for labels[0]
