"""Nothing data-dependent after a charge (issue 27, item 3).

Records are encoded and checked when a decoder or a synthesis is set up, so a record the tokenizer rejects is
refused before any charge (before, it raised only when drawn: with MOZO, P[exception] was 0 on D and 0.31 on a
neighbour, and the fake backend's message named the word's position). Whatever still fails after a charge is
one :class:`ReleaseFailedError`, the same type, message and arguments on neighbouring datasets, with no cause or
context. And the answer template's stop text ends an answer, as its docstring says.
"""

from __future__ import annotations

import numpy as np
import pytest

from dp_icl_plugin import (
    BudgetManager,
    ConfigurationError,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    ReleaseFailedError,
    TangSynthesizer,
)
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.templates.answer import AnswerTemplate

WORDS = ["a", "b", "c", "d", "e", "Text:", "Label:", "user:", "assistant:", "system:", "<eos>", "/"]


def _data(bad_at: int | None = None, word: str = "zebra") -> PrivateDataset:
    texts = [" ".join("abcde"[(i + j) % 5] for j in range(3)) for i in range(12)]
    if bad_at is not None:
        texts[bad_at] = f"a {word} b"  # a word the tokenizer does not know
    return PrivateDataset([PrivateRecord(t, "ab"[i % 2]) for i, t in enumerate(texts)])


def _mozo(dataset: PrivateDataset, backend: FakeBackend, budget: BudgetManager, **kw: object) -> MozoDecoder:
    return MozoDecoder(dataset, backend=backend, budget=budget, n_queries=4, beta=0.5, max_tokens=3, top_k=5, **kw)


def _clip(dataset: PrivateDataset, backend: FakeBackend, budget: BudgetManager, **kw: object) -> ClipBlendDecoder:
    return ClipBlendDecoder(
        dataset,
        backend=backend,
        budget=budget,
        n_queries=4,
        subset_size=12,
        temperature=1.0,
        rng_subset=np.random.default_rng(0),
        max_tokens=3,
        **kw,
    )


@pytest.mark.parametrize("make", [_mozo, _clip], ids=["mozo", "clip-blend"])
def test_a_record_the_tokenizer_rejects_is_refused_when_the_decoder_is_built(make) -> None:
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    with pytest.raises(ConfigurationError, match="record 2 of label 'a' cannot be encoded") as caught:
        make(_data(bad_at=4), FakeBackend(WORDS, eos_token="<eos>"), budget)
    assert "zebra" not in str(caught.value)  # the position and the public label, never the text
    assert budget.history() == []


def test_a_synthesis_refuses_a_record_the_tokenizer_rejects_before_charging() -> None:
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    data = PrivateDataset(
        list(_data(bad_at=5).records("b")) + list(_data().records("a")), public_label_counts="observed"
    )
    method = TangSynthesizer(noise_multiplier=1.0, max_tokens=2, n_prompts=2, records_per_prompt=1, top_k=5)
    with pytest.raises(ConfigurationError, match="cannot be encoded"):
        method.synthesize(data, backend=FakeBackend([*WORDS, "{", "}"]), budget=budget, rng=np.random.default_rng(0))
    assert budget.history() == []


class FailsOn(FakeBackend):
    """A backend that fails on any prompt holding ``word``'s token, with a message naming where (as a real
    failure's message might: a shape, a length, a position)."""

    def __init__(self, *args: object, word: str, value: float = np.nan, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._bad = self.encode(word)[0]
        self._value = value

    def next_token_logprobs(self, prompts):  # type: ignore[override]
        for i, p in enumerate(prompts):
            ids = list(p) if not isinstance(p, str) else self.encode(p, add_special_tokens=True)
            if self._bad in ids:
                raise RuntimeError(f"out of memory at prompt {i}, position {ids.index(self._bad)}, length {len(ids)}")
        return super().next_token_logprobs(prompts)

    def start(self, prompts):  # type: ignore[override]
        self.next_token_logprobs(prompts)
        return super().start(prompts)


def _failure(make, dataset: PrivateDataset) -> BaseException:
    backend = FailsOn([*WORDS, "e2"], word="e2", eos_token="<eos>")
    budget = BudgetManager(PrivacyBudget(1e4, 1e-3))
    decoder = make(dataset, backend, budget)
    with pytest.raises(ReleaseFailedError) as caught:
        for seed in range(20):  # until a failing record is drawn
            decoder.generate("a b", rng=np.random.default_rng(seed))
    assert len(budget.history()) >= 1  # it failed after its charge, which stands
    return caught.value


@pytest.mark.parametrize("make", [_mozo, _clip], ids=["mozo", "clip-blend"])
def test_a_failure_after_the_charge_is_the_same_error_on_neighbouring_datasets(make) -> None:
    # D and D′ differ in one record: each holds a record the backend fails on, at different places and lengths
    texts = [" ".join("abcde"[(i + j) % 5] for j in range(3)) for i in range(12)]
    d, d2 = list(texts), list(texts)
    d[0], d2[0] = "e2", "a b c d e2 e"
    errors = [_failure(make, PrivateDataset([PrivateRecord(t, "ab"[i % 2]) for i, t in enumerate(x)])) for x in (d, d2)]
    first, second = errors
    assert type(first) is type(second) and str(first) == str(second) and first.args == second.args
    for error in errors:
        assert error.__cause__ is None and error.__context__ is None and "prompt" not in str(error)


def test_a_failure_during_synthesis_is_the_fixed_error_and_the_charge_stands() -> None:
    backend = FailsOn([*WORDS, "e2", "{", "}"], word="e2")
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    data = PrivateDataset(
        [PrivateRecord("e2", "a"), *(PrivateRecord("a b", "a") for _ in range(5))], public_label_counts="observed"
    )
    method = TangSynthesizer(noise_multiplier=1.0, max_tokens=2, n_prompts=6, records_per_prompt=1, top_k=5)
    with pytest.raises(ReleaseFailedError) as caught:
        method.synthesize(data, backend=backend, budget=budget, rng=np.random.default_rng(0))
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert len(budget.history()) == 1


@pytest.mark.parametrize("make", [_mozo, _clip], ids=["mozo", "clip-blend"])
def test_the_templates_stop_text_ends_an_answer(make) -> None:
    table = {(): [0.0] * (len(WORDS) - 1) + [1.0]}  # the fake model always says "/"
    backend = FakeBackend(WORDS, table=table, eos_token="<eos>")
    template = AnswerTemplate(stop="/")
    decoder = make(_data(), backend, BudgetManager(PrivacyBudget(50.0, 1e-3)), template=template)
    answer = decoder.generate("a b", rng=np.random.default_rng(0), max_tokens=3)
    assert answer.text == "" and answer.finish_reason == "stop" and len(answer.token_ids) <= 1


@pytest.mark.usefixtures("weak_keywords_allowed")
@pytest.mark.parametrize("release", ["classify", "answer"])
def test_a_knn_release_that_fails_after_its_charge_is_the_fixed_error(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_knn_retriever import setup

    _, ledger, retriever = setup()
    charges = len(ledger.history())

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA out of memory while computing a 412-token prompt of shard 3")

    monkeypatch.setattr(retriever.backend, "next_token_logprobs", out_of_memory)
    monkeypatch.setattr(retriever.backend, "start", out_of_memory)
    with pytest.raises(ReleaseFailedError) as caught:
        getattr(retriever, release)("red thing number1", rng=np.random.default_rng(0))
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert str(caught.value) == ReleaseFailedError.MESSAGE and "412" not in str(caught.value)
    assert len(ledger.history()) == charges + 1  # the release was charged; the charge stands


@pytest.mark.parametrize("name", ["mozo_offline", "tang_answers"])
def test_the_public_input_synthesizers_check_the_labels_their_prompts_hold(name: str) -> None:
    """A one-shot prompt of MOZO offline holds its record's label: a label the tokenizer rejects failed after
    the charge in 9 of 10 runs on a dataset holding it, never on its neighbour (review of issue 27). Tang's
    aggregation for public inputs shows records the same way."""
    from dp_icl_plugin import MozoOfflineSynthesizer, TangAnswerSynthesizer

    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))  # replace-one, as MOZO needs
    records = [PrivateRecord("a b", "a"), PrivateRecord("b c", "zebra"), *(PrivateRecord("c d", "b") for _ in range(6))]
    method = (
        MozoOfflineSynthesizer(beta=0.5, max_tokens=2, top_k=5)
        if name == "mozo_offline"
        else TangAnswerSynthesizer(noise_multiplier=1.0, max_tokens=2, top_k=5, n_prompts=2)
    )
    with pytest.raises(ConfigurationError, match="label 'zebra' cannot be encoded"):
        method.synthesize(
            PrivateDataset(records, labels=["a", "b", "zebra"]),
            public_inputs=["a b"],
            backend=FakeBackend(WORDS),
            budget=budget,
            rng=np.random.default_rng(0),
        )
    assert budget.history() == []


@pytest.mark.parametrize("unit", ["record", "unit"])
def test_mozo_offline_refuses_an_add_remove_ledger_before_any_charge(unit: str) -> None:
    """DPS-MOZO's rate n_shots/|D| needs |D| public (replace-one); the refactor onto ``PublicInputsMethod`` keeps
    the refusal, at both privacy units, in ``plan`` and in ``synthesize``."""
    from dp_icl_plugin import MozoOfflineSynthesizer, UnsupportedEventError

    records = [PrivateRecord(f"w{i % 3} a", "a", unit=f"u{i // 2}") for i in range(8)]
    data = PrivateDataset(records)
    method = MozoOfflineSynthesizer(beta=0.5, max_tokens=2, top_k=5)
    with pytest.raises(UnsupportedEventError):
        method.plan(data, public_inputs=["a b"], neighbouring="add_remove", privacy_unit=unit)
    budget = BudgetManager(PrivacyBudget(50.0, 1e-3, neighbouring="add_remove", privacy_unit=unit))
    with pytest.raises(UnsupportedEventError):
        method.synthesize(
            data, public_inputs=["a b"], backend=FakeBackend(WORDS), budget=budget, rng=np.random.default_rng(0)
        )
    assert budget.history() == []


def test_a_lazy_example_selector_refuses_a_bad_record_when_it_is_built() -> None:
    """The LangChain selector synthesizes on its first request: the record check ran then, so a user's request
    got examples on D and an error naming a record on D′, uncharged (review of issue 27). It runs at set-up now."""
    pytest.importorskip("langchain_dp_icl")
    from langchain_dp_icl import DPICLExampleSelector

    budget = BudgetManager(PrivacyBudget(50.0, 1e-3))
    data = PrivateDataset(
        list(_data(bad_at=4).records("a")) + list(_data().records("b")), public_label_counts="observed"
    )
    method = TangSynthesizer(noise_multiplier=1.0, max_tokens=2, n_prompts=2, records_per_prompt=1, top_k=5)
    with pytest.raises(ConfigurationError, match="cannot be encoded"):
        DPICLExampleSelector(
            synthesizer=method, dataset=data, backend=FakeBackend([*WORDS, "{", "}"]), budget=budget, seed=0
        )
    assert budget.history() == []


@pytest.mark.usefixtures("weak_keywords_allowed")
@pytest.mark.parametrize("release", ["classify", "answer"])
def test_a_knn_record_the_tokenizer_rejects_sits_idle_instead_of_failing_the_release(release: str) -> None:
    """The index has no tokenizer when records are added, so a record the retriever's backend cannot encode was
    found only when retrieved: D gave 'green' 5 times of 5, D ∪ {that record} ReleaseFailedError 5 times of 5
    (review of issue 27). It now sits idle in its shard, as a record without a label does; it still pays."""
    from test_knn_retriever import LABELS, BagEmbedder, fake_backend, records

    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

    texts, labels, answers = records(30)
    index = PrivateIndex(budget=IndividualBudget(epsilon=4.0, delta=1e-5), embedder=BagEmbedder())
    index.add(texts, labels=labels, answers=answers)
    (bad,) = index.add(["red thing number1 qqqunknown"], labels=["red"], answers=["red"])
    ledger = BudgetManager(PrivacyBudget(1e3, 1e-4, neighbouring="add_remove"))
    knn = PrivateKNN(
        index,
        budget=ledger,
        backend=fake_backend(texts),
        labels=LABELS,
        config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=5, keywords=2),
    )
    for seed in range(5):
        getattr(knn, release)("red thing number1", rng=np.random.default_rng(seed))  # no error
    assert index.filter.spent(np.array([bad]))[0].sum() > 0  # it was a candidate, and paid


def test_a_charged_retrieval_is_released_once_and_only_in_its_process() -> None:
    """A Retrieval is one charge: released twice (two threads, or a fork of the process holding it), its records
    would be used twice for one payment (review of issue 27)."""
    import multiprocessing as mp

    from test_knn_retriever import setup

    _, _, retriever = setup()
    retrieval = retriever.retrieve("red thing number1", release="vote")
    context = mp.get_context("fork")
    queue = context.Queue()

    def child() -> None:
        try:
            retriever.vote(retrieval, rng=np.random.default_rng(0))
            queue.put("released")
        except ConfigurationError as exc:
            queue.put(str(exc))

    worker = context.Process(target=child)
    worker.start()
    worker.join(60)
    assert "other than the one that charged it" in queue.get(timeout=5)  # the fork refuses it
    retriever.vote(retrieval, rng=np.random.default_rng(0))  # the parent releases it, once
    with pytest.raises(ConfigurationError, match="once"):
        retriever.vote(retrieval, rng=np.random.default_rng(1))


@pytest.mark.parametrize("make", [_mozo, _clip], ids=["mozo", "clip-blend"])
def test_a_charged_answer_stream_continues_only_in_its_process(make, tmp_path) -> None:
    """A forked copy of a charged stream drew the rest of the answer again from the one charge (found by the
    cold review of issue 27: parent and child streamed different tokens, the ledger held one answer)."""
    import multiprocessing as mp

    budget = BudgetManager(PrivacyBudget(1000.0, 1e-3), ledger=tmp_path / "ledger.sqlite")
    decoder = make(_data(), FakeBackend(WORDS, eos_token="<eos>"), budget)
    stream = decoder.stream("a b", rng=np.random.default_rng(0), stop=[])
    next(stream)  # charged here
    context = mp.get_context("fork")
    queue = context.Queue()

    def child() -> None:
        try:
            queue.put("released: " + "".join(stream))
        except ConfigurationError as exc:
            queue.put(str(exc))

    worker = context.Process(target=child)
    worker.start()
    worker.join(60)
    assert "charged in another process" in queue.get(timeout=5)
    "".join(stream)  # the parent finishes its answer
    assert len(budget.history()) == 1


class NaNOn(FakeBackend):
    """A backend whose next-token row is NaN for any prompt holding ``word``'s token (as a model in half
    precision can overflow on one input): the record's own fault, not the model's on every input."""

    def __init__(self, *args: object, word: str, value: float = np.nan, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._bad = self.encode(word)[0]
        self._value = value

    def holds(self, prompt: object) -> bool:
        ids = self.encode(prompt, add_special_tokens=True) if isinstance(prompt, str) else list(prompt)  # type: ignore[call-overload]
        return self._bad in ids

    def poison(self, rows: np.ndarray, bad: list[bool]) -> np.ndarray:
        out = np.array(rows, copy=True)
        out[np.asarray(bad, dtype=bool)] = self._value
        return out

    def next_token_logprobs(self, prompts):  # type: ignore[override]
        return self.poison(super().next_token_logprobs(prompts), [self.holds(p) for p in prompts])

    def start(self, prompts):  # type: ignore[override]
        return _NaNSession(super().start(prompts), self, [self.holds(p) for p in prompts])


class _NaNSession:
    def __init__(self, session, backend: NaNOn, bad: list[bool]) -> None:
        self.session, self.backend, self.bad = session, backend, bad

    n_prompts = property(lambda self: self.session.n_prompts)
    lengths = property(lambda self: self.session.lengths)
    logprobs = property(lambda self: self.backend.poison(self.session.logprobs, self.bad))

    def append(self, token_ids):
        return self.backend.poison(self.session.append(token_ids), self.bad)

    def close(self) -> None:
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _synthesizers() -> dict[str, object]:
    from dp_icl_plugin import (
        AdaDPSynSynthesizer,
        ClipBlendSynthesizer,
        MozoOfflineSynthesizer,
        PTASynthesizer,
        TangAnswerSynthesizer,
    )

    aggregation = {"max_tokens": 3, "n_prompts": 3, "records_per_prompt": 2, "top_k": 5}
    return {
        "tang": TangSynthesizer(noise_multiplier=1.0, **aggregation),
        "pta": PTASynthesizer(noise_multiplier=1.0, **aggregation),
        "adadpsyn": AdaDPSynSynthesizer(sigma1=1.0, **aggregation),
        "clip_blend": ClipBlendSynthesizer(temperature=1.0, max_tokens=3, subset_size=8),
        "mozo_offline": MozoOfflineSynthesizer(beta=0.5, max_tokens=3, top_k=5, n_shots=6),
        "tang_answers": TangAnswerSynthesizer(noise_multiplier=1.0, **aggregation),
    }


ANSWERING = ("mozo_offline", "tang_answers")  # the synthesizers that answer public inputs


@pytest.mark.parametrize("value", [np.nan, 800.0])
@pytest.mark.parametrize("name", ["tang", "pta", "adadpsyn", "clip_blend", *ANSWERING])
def test_a_records_bad_row_cannot_fail_a_synthesis(name: str, value: float) -> None:
    """A record whose row the model gets wrong (NaN) made every synthesizer fail after its charge: whether the
    release failed then depended on that record (D: demonstrations; D ∪ {it}: ReleaseFailedError whenever it was
    drawn). Its row now stands in for the public row's, as in the decoders (``public_checked``), so the run
    completes on both. A finite row above 0 (800: no log-probability) overflowed exp() into NaN after the charge
    in Tang's family the same way (found by the cold review of the public-input synthesis)."""
    method = _synthesizers()[name]
    records = [PrivateRecord("e2 a", "a"), *(PrivateRecord(f"{w} b", "a") for w in "abcdeab")]
    data = PrivateDataset(records, public_label_counts="observed")
    budget = BudgetManager(PrivacyBudget(1e4, 1e-3))
    backend = NaNOn([*WORDS, "e2", "{", "}"], word="e2", value=value, eos_token="<eos>")
    inputs = {"public_inputs": ["a b"]} if name in ANSWERING else {}
    demos = method.synthesize(data, backend=backend, budget=budget, rng=np.random.default_rng(0), **inputs)
    assert len(budget.history()) == 1 and len(demos) >= 1
