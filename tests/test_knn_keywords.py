"""Keyword hints (records vote, KNNKeywordDecoder and PrivateKNN.answer with keyword_source="records"): each
record's vote is its own, the sensitivity √m per record, who pays and what, records that agree steer the
answer and those that do not leave it zero-shot, the budget filling after ``uses`` answers, bad input before
any charge, the factory, both adapters and the retriever's keyword mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_knn_retriever import BagEmbedder

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget
from dp_icl_plugin.accounting import FilteredReleaseEvent, IndividualBudget, rdp
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.decoding import build_decoder
from dp_icl_plugin.decoding.knn_keywords import KNNKeywordDecoder, build_keyword_decoder
from dp_icl_plugin.mechanisms.keyword_threshold import record_keywords, record_vote_sensitivity
from dp_icl_plugin.mechanisms.token_shift import keyword_pass_probability
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from dp_icl_plugin.retrieval.prompts import KeywordAnswerPrompt
from dp_icl_plugin.retrieval.retriever import noise_for_uses
from dp_icl_plugin.templates.answer import AnswerTemplate

VOCAB = ["q", "u", "hint", "fix", "reboot", "the", "a", "b", "x", "Question:", "Answer:", "<eos>"]
ID = {w: i for i, w in enumerate(VOCAB)}
TEMPLATE = AnswerTemplate(example="{text} {label} ", query="{input}", stop=None, stop_at_eos=False)
PROMPT = KeywordAnswerPrompt(instruction="hint {keywords}")
STOP = frozenset({"the"})


def backend() -> FakeBackend:
    """Zero-shot after ``q`` favours ``a``; after the hint ``fix`` (``... fix q``) it favours ``b``."""
    zero = np.full(len(VOCAB), 1e-3)
    zero[ID["a"]] = 0.9
    hinted = np.full(len(VOCAB), 1e-3)
    hinted[ID["b"]] = 0.9
    return FakeBackend(VOCAB, table={(ID["q"],): zero, (ID["fix"], ID["q"]): hinted}, eos_token="<eos>")


def build(answers: list[str], *, epsilon: float = 20.0, uses: int = 5, texts: list[str] | None = None, **config):
    index = PrivateIndex(budget=IndividualBudget(epsilon=epsilon, delta=1e-6), embedder=BagEmbedder())
    index.add(texts or ["q"] * len(answers), answers=answers)
    ledger = BudgetManager(PrivacyBudget(1000.0, 1e-3, neighbouring="add_remove"))
    settings_ = {
        "k": 8,
        "shards": 1,
        "min_similarity": 0.5,
        "uses": uses,
        "max_answer_tokens": 2,
        "keywords": 1,
        "keywords_per_answer": 1,
        "keyword_source": "records",
        "stopwords": STOP,
        **config,
    }
    knn = PrivateKNN(
        index,
        budget=ledger,
        backend=backend(),
        config=KNNConfig(**settings_),
        keyword_prompt=PROMPT,
        releases=("answer",),
    )
    return index, ledger, KNNKeywordDecoder(knn, template=TEMPLATE)


def test_a_records_vote_is_its_first_distinct_whole_word_keywords_lower_cased() -> None:
    b = backend()
    is_keyword = lambda t: b.decode([t]) not in STOP  # noqa: E731
    # lower-cased, distinct, in order, stop words skipped, at most m
    assert record_keywords("the FIX reboot fix a", per_record=2, encode=b.encode, is_keyword=is_keyword) == [
        ID["fix"],
        ID["reboot"],
    ]
    assert record_keywords("the Fix. FIX!", per_record=3, encode=b.encode, is_keyword=is_keyword) == [ID["fix"]]
    # a word the tokenizer cannot encode does not vote and fails nothing
    assert record_keywords("zzz fix", per_record=3, encode=b.encode, is_keyword=is_keyword) == [ID["fix"]]


@settings(max_examples=80, deadline=None)
@given(
    votes=st.lists(st.lists(st.sampled_from(["fix", "reboot", "a", "b", "u", "the"]), max_size=6), max_size=8),
    m=st.integers(1, 4),
    removed=st.integers(0, 7),
)
def test_removing_one_record_moves_the_histogram_by_at_most_root_m(votes, m, removed) -> None:
    b = backend()
    is_keyword = lambda t: b.decode([t]) not in STOP  # noqa: E731

    def histogram(texts: list[list[str]]) -> np.ndarray:
        h = np.zeros(len(VOCAB))
        for words in texts:
            for t in record_keywords(" ".join(words), per_record=m, encode=b.encode, is_keyword=is_keyword):
                h[t] += 1
        return h

    if not votes:
        return
    without = votes[: removed % len(votes)] + votes[removed % len(votes) + 1 :]
    assert np.linalg.norm(histogram(votes) - histogram(without)) <= record_vote_sensitivity(m) + 1e-12


def test_every_candidate_pays_one_gaussian_release_of_sensitivity_root_m() -> None:
    index, ledger, decoder = build(["fix"] * 5, keywords_per_answer=3, uses=1)
    index.add(["u"], answers=["fix"])  # not similar to the query: no candidate, pays nothing
    answer = decoder.generate("q", rng=np.random.default_rng(0))
    entry = ledger.history()[-1]
    assert answer.ledger_entry == entry.id and entry.label.startswith("knn-answer:")
    assert isinstance(entry.event, FilteredReleaseEvent)
    sigma = decoder.knn.keyword_noise_std
    assert sigma == pytest.approx(noise_for_uses(index.filter.budget, uses=1, sensitivity=math.sqrt(3)))
    assert entry.event.per_unit == ev.GaussianEvent(
        sigma / math.sqrt(3), sensitivity=math.sqrt(3), neighbouring="add_remove"
    )
    spent = index.filter.epsilon_spent(np.arange(1, 7))
    assert np.all(spent[:5] > 0) and spent[5] == 0
    curve, _ = index.filter.spent(np.array([1]))
    orders = np.asarray(index.filter.budget.orders)
    np.testing.assert_allclose(curve[0], orders * 3 / (2 * sigma**2), rtol=1e-9)
    # one release per answer whatever its length: the public model writes the tokens
    assert decoder.answer_event(2) == decoder.answer_event(1)


def test_a_person_with_c_candidates_pays_c_root_m() -> None:
    _, _, decoder = build(["fix"], keywords_per_answer=4)
    for c in (1, 3, 50):
        event = decoder.knn._event("answer", c)
        assert event.sensitivity == pytest.approx(2.0 * c)  # no cap: every candidate votes


def test_records_that_agree_steer_the_answer_and_those_that_do_not_leave_it_zero_shot() -> None:
    _, _, agree = build(["fix"] * 12)
    assert agree.records_to_agree() <= 3
    hinted = [agree.generate("q", rng=np.random.default_rng(s), max_tokens=1) for s in range(5)]
    assert [a.text for a in hinted] == ["b"] * 5  # the hint "fix" passed and the public model answered with it
    assert {a.released for a in hinted} == {("fix",)}  # ... and the answer says so
    _, _, scattered = build(["fix", "reboot", "u"])  # one vote each: below the threshold
    plain = [scattered.generate("q", rng=np.random.default_rng(s), max_tokens=1) for s in range(5)]
    assert [a.text for a in plain] == ["a"] * 5  # the zero-shot answer
    assert all(isinstance(a.released, tuple) for a in plain)  # the release ran each time (its words, if any)
    assert scattered.hinted("q", None) == "q" and scattered.hinted("q", ("fix",)) == "hint fix\nq"
    chat = scattered.hinted(({"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}), ("fix",))
    assert chat[0] == {"role": "system", "content": "be brief\n\nhint fix"} and len(chat) == 2


def test_uses_answers_fill_a_records_budget_and_the_next_one_is_made_without_it() -> None:
    index, _, decoder = build(["fix"], epsilon=4.0, uses=2)
    for seed in range(2):
        decoder.generate("q", rng=np.random.default_rng(seed))
    before = index.filter.spent(np.array([1]))[0].copy()
    decoder.generate("q", rng=np.random.default_rng(2))  # out of budget: not charged, no vote
    np.testing.assert_array_equal(index.filter.spent(np.array([1]))[0], before)
    sigma = decoder.knn.keyword_noise_std
    orders = np.asarray(index.filter.budget.orders)
    assert not bool(np.any(2.001 * orders / (2 * sigma**2) <= index.filter.budget.caps))  # the calibration is tight


def test_records_vote_only_through_the_threshold_release_and_bad_input_is_refused_before_any_charge() -> None:
    with pytest.raises(ConfigurationError, match="threshold release only"):
        KNNConfig(keyword_source="records", keyword_release="ptr")
    with pytest.raises(ConfigurationError, match="keyword_source"):
        KNNConfig(keyword_source="votes")
    _, ledger, decoder = build(["fix"] * 3)
    before = len(ledger.history())
    for bad in ("", [], [{"role": "user", "content": ""}]):
        with pytest.raises(ConfigurationError):
            decoder.generate(bad, rng=np.random.default_rng(0))
    with pytest.raises(ConfigurationError):
        decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)  # above what the filters cover
    with pytest.raises(ConfigurationError):
        decoder.generate("zzz", rng=np.random.default_rng(0))  # a query the tokenizer cannot encode
    assert len(ledger.history()) == before


def test_a_retriever_built_for_other_releases_is_refused() -> None:
    index = PrivateIndex(budget=IndividualBudget(epsilon=4.0, delta=1e-6), embedder=BagEmbedder())
    index.add(["q"], labels=["a"])
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    knn = PrivateKNN(index, budget=ledger, backend=backend(), labels=["a", "b"], releases=("vote",))
    with pytest.raises(ConfigurationError, match="not 'answer'"):
        KNNKeywordDecoder(knn)


def test_the_factory_builds_keyword_hints_over_a_dataset_and_refuses_unknown_settings(tmp_path) -> None:
    from dp_icl_plugin import PrivateDataset, PrivateRecord

    data = PrivateDataset([PrivateRecord("q", "fix") for _ in range(12)])
    ledger = BudgetManager(PrivacyBudget(1000.0, 1e-3))
    decoder = build_keyword_decoder(
        backend(),
        data,
        budget=ledger,
        epsilon=40.0,
        n_queries=4,
        k=12,
        max_tokens=1,
        keywords=1,
        keywords_per_record=1,
        embedder=BagEmbedder(),
        min_similarity=0.5,
        template=TEMPLATE,
    )
    assert isinstance(decoder, KNNKeywordDecoder) and decoder.knn.config.records_vote
    assert decoder.knn.config.uses == 4  # ⌈n_queries·k/N⌉
    labels = [e.label for e in ledger.history()]
    assert labels == ["knn-filter:" + decoder.knn.index.id]
    with pytest.raises(ConfigurationError, match="takes no setting paid_tokens"):
        build_decoder("unused-model", data, budget=ledger, method="knn-keywords", paid_tokens=2)


def test_keyword_hints_serve_the_langchain_chat_model_and_the_llama_index_llm() -> None:
    pytest.importorskip("langchain_dp_icl")
    pytest.importorskip("llama_index.llms.dp_icl")
    from langchain_dp_icl import DPICLLLM
    from llama_index.llms.dp_icl import DPICL

    _, ledger, decoder = build(["fix"] * 12)
    llm = DPICLLLM(decoder=decoder, seed=0)
    assert llm.invoke("q", max_tokens=1) == "b"
    result = llm.generate(["q"], max_tokens=1)  # the released words go into the answer's metadata
    assert result.generations[0][0].generation_info["released_keywords"] == ["fix"]
    li = DPICL(decoder=decoder, seed=1)
    response = li.complete("q", max_tokens=1)
    assert response.text == "b" and response.additional_kwargs["released_keywords"] == ["fix"]
    assert sum(e.label.startswith("knn-answer:") for e in ledger.history()) == 3


def test_the_retrievers_keyword_mode_releases_the_words_records_share() -> None:
    pytest.importorskip("langchain_dp_icl")
    from langchain_dp_icl import DPICLRetriever

    _, _, decoder = build(["fix"] * 12)
    docs = DPICLRetriever(knn=decoder.knn, mode="keywords", seed=0).invoke("q")
    assert [d.page_content for d in docs] == ["fix"]
    assert docs[0].metadata["kind"] == "dp_keyword" and docs[0].metadata["release"] == "knn-answer"
    pytest.importorskip("llama_index.retrievers.dp_icl")
    from llama_index.retrievers.dp_icl import DPICLRetriever as LlamaIndexRetriever

    nodes = LlamaIndexRetriever(decoder.knn, mode="keywords", seed=1).retrieve("q")
    assert [n.node.get_content() for n in nodes] == ["fix"]
    answer = LlamaIndexRetriever(decoder.knn, mode="answer", seed=2).retrieve("q")
    assert answer[0].node.metadata["keywords_released"] is True


def test_the_filter_rdp_of_one_vote_matches_the_gaussian_curve() -> None:
    _, _, decoder = build(["fix"], keywords_per_answer=2)
    orders = np.asarray(decoder.knn.index.filter.budget.orders)
    sigma = decoder.knn.keyword_noise_std
    cost = decoder.knn._cost("answer", 1)
    np.testing.assert_allclose(cost.rdp, rdp.gaussian_rdp(orders, sigma / math.sqrt(2)), rtol=1e-9)


def test_a_record_votes_its_answer_else_its_label_else_its_text() -> None:
    _index, _, decoder = build(["fix"])
    knn = decoder.knn
    from dp_icl_plugin.retrieval.retriever import PrivateText, RetrievedRecord

    def vote(text: str, label: str | None, answer: str | None) -> list[int]:
        wrap = lambda v: None if v is None else PrivateText(v)  # noqa: E731
        return knn._record_vote(RetrievedRecord(PrivateText(text), wrap(label), wrap(answer), 1.0))

    assert vote("u", "reboot", "fix") == [ID["fix"]]
    assert vote("u", "reboot", None) == [ID["reboot"]]
    assert vote("u", None, None) == [ID["u"]]


def test_hints_no_word_can_pass_even_when_every_record_shares_it_are_refused_before_the_cover() -> None:
    """The new user's 100 tickets at ε = 4 were warned about and then charged: when a word every record shares
    (public: a replace-one ledger keeps |D|) passes less than 5 % of the time, no word can pass, and the factory
    refuses before the cover, with the figure; where it passes more often it only warns (more than k)."""
    from dp_icl_plugin import PrivateDataset, PrivateRecord
    from dp_icl_plugin.errors import WeakReleaseWarning

    data = PrivateDataset([PrivateRecord("q", "fix") for _ in range(12)])
    ledger = BudgetManager(PrivacyBudget(1000.0, 1e-3))
    settings = dict(n_queries=4, k=12, max_tokens=1, keywords=1, keywords_per_record=4, embedder=BagEmbedder())
    with pytest.raises(ConfigurationError, match=r"one all 12 records share passes with probability"):
        build_keyword_decoder(backend(), data, budget=ledger, epsilon=2.0, template=TEMPLATE, **settings)
    assert ledger.history() == []
    with pytest.warns(WeakReleaseWarning, match="more than the 12 candidates"):  # T above 12, yet it can pass
        weak = build_keyword_decoder(backend(), data, budget=ledger, epsilon=8.0, template=TEMPLATE, **settings)
    threshold, _ = weak.knn.keyword_outlook()
    assert threshold > 12 and keyword_pass_probability(threshold, 12, weak.knn.keyword_noise_std) >= 0.05


def test_hints_that_need_more_voters_than_k_are_warned_about_before_the_cover() -> None:
    import warnings

    from dp_icl_plugin.errors import WeakReleaseWarning

    index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-6), embedder=BagEmbedder())
    index.add(["q"], answers=["fix"])
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    config = KNNConfig(k=8, shards=1, keyword_source="records", keywords_per_answer=4, uses=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeakReleaseWarning)
        with pytest.raises(WeakReleaseWarning, match="more than the 8 candidates"):
            PrivateKNN(
                index, budget=ledger, backend=backend(), config=config, keyword_prompt=PROMPT, releases=("answer",)
            )
    assert ledger.history() == []  # said before anything was charged
    _, _, agree = build(["fix"] * 12)  # T ≤ 3 of k = 8: no warning (warnings are errors in this suite)
    assert agree.records_to_agree() <= agree.knn.config.k


def test_a_token_beyond_the_models_output_never_votes_so_it_cannot_fail_a_release_after_the_charge() -> None:
    class Narrow(FakeBackend):
        @property
        def vocab_size(self) -> int:  # the output layer one row short of the tokenizer (an added token)
            return len(self.vocab) - 1

    def release(with_beyond: bool) -> str:
        index = PrivateIndex(budget=IndividualBudget(epsilon=50.0, delta=1e-6), embedder=BagEmbedder())
        index.add(["q"] * 3, answers=["fix"] * 3)
        if with_beyond:
            index.add(["q"], answers=["<eos>"])  # the last id: beyond the narrowed output
        knn = PrivateKNN(
            index,
            budget=BudgetManager(PrivacyBudget(1e3, 1e-3, neighbouring="add_remove")),
            backend=Narrow(VOCAB, eos_token="<eos>"),
            keyword_prompt=PROMPT,
            config=KNNConfig(
                k=8, shards=1, min_similarity=0.5, uses=2, keywords=1, keywords_per_answer=1, keyword_source="records"
            ),
            releases=("answer",),
        )
        return knn.answer("q", rng=np.random.default_rng(0)).text  # a ReleaseFailedError would tell x apart

    assert release(True) == release(False)


def test_a_sentencepiece_space_piece_before_the_word_is_dropped() -> None:
    space = len(VOCAB)  # a lone "▁" piece: no letter or digit, not a keyword
    encode = lambda text: [space, ID[text.strip()]] if text.strip() in ID else [space]  # noqa: E731
    is_keyword = lambda t: t != space and VOCAB[t] not in STOP  # noqa: E731
    assert record_keywords("fix the reboot", per_record=4, encode=encode, is_keyword=is_keyword) == [
        ID["fix"],
        ID["reboot"],
    ]


def test_a_retriever_with_default_releases_warns_about_hints_that_cannot_pass_too() -> None:
    from dp_icl_plugin.errors import WeakReleaseWarning

    index = PrivateIndex(budget=IndividualBudget(epsilon=1.0, delta=1e-6), embedder=BagEmbedder())
    index.add(["q"], answers=["fix"])
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    config = KNNConfig(k=8, shards=1, keyword_source="records", keywords_per_answer=4, uses=3)
    with pytest.warns(WeakReleaseWarning, match="keyword hints"):
        PrivateKNN(index, budget=ledger, backend=backend(), config=config, keyword_prompt=PROMPT)


@pytest.mark.filterwarnings("ignore::dp_icl_plugin.errors.WeakReleaseWarning")
def test_a_person_pays_for_each_candidate_record_it_votes_with_and_a_spent_record_does_not_vote(monkeypatch) -> None:
    index = PrivateIndex(budget=IndividualBudget(epsilon=4.0, delta=1e-6), embedder=BagEmbedder(), group_by_user=True)
    index.add(["q"] * 4, answers=["fix"] * 4, user_ids=["ann", "ann", "ann", "bob"])
    ledger = BudgetManager(PrivacyBudget(1000.0, 1e-3, neighbouring="add_remove"))

    def knn(per_unit: int | None) -> PrivateKNN:
        config = KNNConfig(
            k=8,
            shards=1,
            min_similarity=0.5,
            uses=3,
            keywords=1,
            keywords_per_answer=1,
            keyword_source="records",
            records_per_unit=per_unit,
        )
        return PrivateKNN(
            index, budget=ledger, backend=backend(), config=config, keyword_prompt=PROMPT, releases=("answer",)
        )

    for per_unit, ann in ((None, 3), (2, 2)):
        seen: list[int] = []
        real = index.charge_release

        def spy(candidates, cost, real=real, seen=seen, **kw):
            return real(candidates, lambda c: seen.append(c) or cost(c), **kw)

        monkeypatch.setattr(index, "charge_release", spy)
        retriever = knn(per_unit)
        retriever.answer("q", rng=np.random.default_rng(0))
        monkeypatch.undo()
        assert max(seen) == ann  # ann's candidate records (bounded by records_per_unit) ...
        assert retriever._event("answer", ann).sensitivity == pytest.approx(ann)  # ... each √m = 1
    # a record whose filter is spent is not a candidate: its vote is not in the histogram
    _, _, decoder = build(["fix"] * 2 + ["reboot"], epsilon=4.0, uses=1)
    votes: list[list[list[int]]] = []
    release = decoder.knn._release_keywords
    monkeypatch.setattr(decoder.knn, "_release_keywords", lambda v, *a: votes.append(v) or release(v, *a))
    decoder.generate("q", rng=np.random.default_rng(0))
    decoder.generate("q", rng=np.random.default_rng(1))  # every record spent its one use
    assert sorted(map(tuple, votes[0])) == [(ID["fix"],), (ID["fix"],), (ID["reboot"],)] and votes[1] == []
