"""Expert decoding paid per token (``KNNExpertDecoder(pay_per_token=True)``): each token mechanism charges every
candidate's filter one token right before it runs; an expert whose filter refuses leaves and the next candidate's
row joins as if it had been an expert from the first token; forced tokens and an early end cost nothing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_knn_experts import TEMPLATE, VOCAB, backend, build
from test_knn_retriever import BagEmbedder
from test_timing import FakeClock

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget, PrivateDataset
from dp_icl_plugin.accounting import FilteredReleaseEvent, rdp
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.decoding import knn_experts
from dp_icl_plugin.decoding.knn_experts import KNNExpertDecoder, build_expert_decoder
from dp_icl_plugin.retrieval import KNNConfig
from dp_icl_plugin.retrieval.index import Candidates
from dp_icl_plugin.templates.answer import AnswerTemplate

ID = {w: i for i, w in enumerate(VOCAB)}


def per_token(labels: list[str], **kw):
    index, ledger, decoder = build(labels, **kw)
    return index, ledger, KNNExpertDecoder(decoder.knn, template=decoder.template, pay_per_token=True)


def token_curve(decoder: KNNExpertDecoder, tokens: int) -> np.ndarray:
    orders = np.asarray(decoder.knn.index.filter.budget.orders)
    return tokens * rdp.bounded_range_rdp(orders, decoder.token_epsilon)


def test_each_token_charges_every_candidate_one_token_before_it_runs() -> None:
    index, ledger, decoder = per_token(["rare"] * 3 + ["plain"] * 3)
    before = len(ledger.history())
    answer = decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    entries = ledger.history()[before:]
    assert len(entries) == 3 and answer.ledger_entry == entries[0].id  # one release of the filter per token
    one_token = ev.ExponentialMechanismEvent(decoder.token_epsilon, neighbouring="add_remove")
    assert all(isinstance(e.event, FilteredReleaseEvent) for e in entries)
    assert all(e.event.per_unit == ev.SelfComposedEvent(one_token, 1) for e in entries)
    curve, _ = index.filter.spent(np.arange(1, 7))
    np.testing.assert_allclose(curve, np.tile(token_curve(decoder, 3), (6, 1)), rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_without_a_refusal_it_draws_the_tokens_paid_per_answer_draws(seed: int) -> None:
    labels = ["rare", "plain", "rare", "plain", "rare"]
    _, _, upfront = build(labels)
    _, _, paid = per_token(labels)
    a = upfront.generate("q", rng=np.random.default_rng(seed), max_tokens=3)
    b = paid.generate("q", rng=np.random.default_rng(seed), max_tokens=3)
    assert a.token_ids == b.token_ids


def test_an_answer_that_ends_early_pays_for_the_tokens_it_ran() -> None:
    eos = np.full(len(VOCAB), 1e-9)
    eos[ID["<eos>"]] = 1.0
    fake = FakeBackend(VOCAB, table={(ID["q"],): eos / eos.sum()}, eos_token="<eos>", chat_template=True)
    template = AnswerTemplate(example="{text} {label} ", query="{input}", stop=None, stop_at_eos=True)
    index, ledger, decoder = build(["rare", "plain"])
    knn = decoder.knn
    knn.backend = fake
    decoder = KNNExpertDecoder(knn, template=template, pay_per_token=True)
    before = len(ledger.history())
    answer = decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    assert answer.finish_reason == "stop" and answer.token_ids == ()
    assert len(ledger.history()) == before + 1  # EOS was the first token: one mechanism, one token paid
    np.testing.assert_allclose(index.filter.spent(np.array([1]))[0][0], token_curve(decoder, 1), rtol=1e-12)


class Recorder:
    """Wraps ``start_rows``: the rows of every session it starts, and the tokens appended to each."""

    def __init__(self, real) -> None:
        self.real, self.started = real, []

    def __call__(self, backend, rows, **kw):
        session = self.real(backend, rows, **kw)
        record = {"rows": [list(r) for r in rows], "appended": [], "public": kw.get("public", 0)}
        self.started.append(record)
        append = session.append

        def recorded(token):
            record["appended"].append(int(token))
            return append(token)

        session.append = recorded
        return session


def test_an_expert_whose_filter_runs_out_leaves_and_the_next_joins_as_from_the_first_token(monkeypatch) -> None:
    """k = 1. Record 1 (``rare``, nearest: ties go to the lower id) has spent 4 of its 6 tokens; record 2
    (``plain``) nothing. Tokens 1 and 2 read record 1; before token 3 its filter refuses, and record 2's row is
    started on its own prompt and extended by tokens 1 and 2 one at a time before token 3 reads it."""
    config = KNNConfig(k=1, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=3)
    index, _, decoder = per_token(["rare", "plain"], config=config)
    knn = decoder.knn
    first = Candidates(np.array([1]), np.array([1.0], dtype=np.float32))
    index.charge(first, lambda c: knn._cost("decode", c, 1, 4), release_tag=knn._release_tag)
    recorder = Recorder(knn_experts.start_rows)
    monkeypatch.setattr(knn_experts, "start_rows", recorder)
    read = []
    real_token = knn_experts.expert_token

    def spy(private, public, **kw):
        read.append(np.array(private))
        return real_token(private, public, **kw)

    monkeypatch.setattr(knn_experts, "expert_token", spy)
    answer = decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    tokens = list(answer.token_ids)
    assert len(tokens) == 3 and [len(r) for r in read] == [1, 1, 1]
    public, rare, plain = recorder.started
    assert public["public"] == 1 and public["appended"] == tokens[:2]
    assert rare["rows"] == [decoder._ids("q", knn_experts.PrivateRecord("q", "rare"), reserve=2)]
    assert plain["rows"] == [decoder._ids("q", knn_experts.PrivateRecord("q", "plain"), reserve=2)]
    assert plain["appended"] == tokens[:2]  # replayed, one token at a time, before it was read
    assert rare["appended"] == tokens[:1]  # nothing computed on a refused record's row after its refusal
    fresh = backend().start([plain["rows"][0]])
    for t in tokens[:2]:
        fresh.append(t)
    np.testing.assert_array_equal(read[2][0], fresh.logprobs[0])
    spent = index.filter.spent(np.array([1, 2]))[0]
    np.testing.assert_allclose(spent, [token_curve(decoder, 6), token_curve(decoder, 3)], rtol=1e-12)


def test_the_experts_rows_read_a_released_token_only_after_the_next_token_is_charged(monkeypatch) -> None:
    """Nothing private is computed for a token before it is paid: an expert's row is extended by token t only
    once token t + 1's charge is committed (the public row may run ahead)."""
    _, _, decoder = per_token(["rare", "plain", "rare"])
    log: list[str] = []
    real_start, real_pay = knn_experts.start_rows, knn_experts._ExpertMeter.pay

    def start_rows(backend, rows, **kw):
        session = real_start(backend, rows, **kw)
        if not kw.get("public"):  # an expert session: log each extension
            append = session.append
            session.append = lambda token: log.append("append") or append(token)
        return session

    def pay(meter):
        out = real_pay(meter)
        log.append("pay")
        return out

    monkeypatch.setattr(knn_experts, "start_rows", start_rows)
    monkeypatch.setattr(knn_experts._ExpertMeter, "pay", pay)
    answer = decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    assert len(answer.token_ids) == 3
    assert log == ["pay", "pay", "append", "pay", "append"]  # each extension after the next token's charge


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failure_mid_answer_charges_the_tokens_it_had_left_before_the_error(monkeypatch, fail_at: int) -> None:
    """Where an answer fails may depend on the records read: whatever the token, its candidates end up charged for
    every token mechanism the answer could run (as paid per answer), and the caller gets a ReleaseFailedError."""
    from dp_icl_plugin.errors import ReleaseFailedError

    index, ledger, decoder = per_token(["rare", "plain", "rare"])
    real_rows = knn_experts._ExpertRows.rows
    calls = []

    def rows(self, ids, records):
        calls.append(1)
        if len(calls) == fail_at:
            raise MemoryError("out of memory")
        return real_rows(self, ids, records)

    monkeypatch.setattr(knn_experts._ExpertRows, "rows", rows)
    before = len(ledger.history())
    with pytest.raises(ReleaseFailedError):
        decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    assert len(ledger.history()) == before + 3
    curve, _ = index.filter.spent(np.arange(1, 4))
    np.testing.assert_allclose(curve, np.tile(token_curve(decoder, 3), (3, 1)), rtol=1e-12)


def test_a_ledger_write_that_fails_after_the_filters_committed_is_not_charged_again(monkeypatch) -> None:
    """The second token's ledger record fails once (the filters had committed): the answer fails, and every
    candidate's filter holds the answer's worst case, 3 tokens, not 4 (the failed charge is not made again)."""
    from dp_icl_plugin.errors import ReleaseFailedError

    index, _, decoder = per_token(["rare", "plain", "rare"])
    real, calls = decoder.knn.budget.spend, []

    def spend(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk I/O error")
        return real(*args, **kw)

    monkeypatch.setattr(decoder.knn.budget, "spend", spend)
    with pytest.raises(ReleaseFailedError):
        decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    curve, _ = index.filter.spent(np.arange(1, 4))
    np.testing.assert_allclose(curve, np.tile(token_curve(decoder, 3), (3, 1)), rtol=1e-12)


def test_a_token_the_choices_force_is_free() -> None:
    index, ledger, decoder = build(["rare", "plain"])
    from dp_icl_plugin.decoding.choices import AnswerChoices

    choices = AnswerChoices.of(decoder.backend, ["a b", "a c"])  # "a" is forced: one decision
    paid = KNNExpertDecoder(decoder.knn, template=decoder.template, choices=choices, pay_per_token=True)
    before = len(ledger.history())
    answer = paid.generate("q", rng=np.random.default_rng(0))
    assert answer.token_ids[0] == ID["a"] and len(answer.token_ids) == 2
    assert len(ledger.history()) == before + 1
    np.testing.assert_allclose(index.filter.spent(np.array([1]))[0][0], token_curve(paid, 1), rtol=1e-12)


def test_sparse_decoding_and_bad_settings_are_refused_before_any_charge() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    data = PrivateDataset.from_pairs(["q"] * 4, ["rare"] * 4)
    common = {"budget": ledger, "epsilon": 2.0, "n_queries": 10, "uses": 2, "embedder": BagEmbedder()}
    with pytest.raises(ConfigurationError, match="sparse"):
        build_expert_decoder(backend(), data, paid_tokens=2, pay_per_token=True, **common)
    with pytest.raises(ConfigurationError, match="bool"):
        build_expert_decoder(backend(), data, pay_per_token="yes", **common)
    assert ledger.history() == []
    sparse = KNNConfig(k=8, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=3, expert_paid_tokens=1)
    _, _, decoder = build(["rare"], config=sparse)
    with pytest.raises(ConfigurationError, match="sparse"):
        KNNExpertDecoder(decoder.knn, pay_per_token=True)
    built = build_expert_decoder(backend(), data, pay_per_token=True, template=TEMPLATE, **common)
    assert built.pay_per_token and len(built.generate("q", rng=np.random.default_rng(0), max_tokens=2).token_ids) == 2


def test_paid_per_token_it_serves_the_langchain_chat_model_and_the_llama_index_llm() -> None:
    pytest.importorskip("langchain_dp_icl")
    pytest.importorskip("llama_index.llms.dp_icl")
    from langchain_dp_icl import ChatDPICL
    from llama_index.llms.dp_icl import DPICL

    _, ledger, decoder = per_token(["rare"] * 4 + ["plain"] * 4)
    before = len(ledger.history())
    message = ChatDPICL(decoder=decoder, seed=0, max_tokens=2).invoke("q")
    releases = ledger.history()[before:]
    assert message.response_metadata["ledger_entry"] == releases[0].id and len(releases) == 2  # one per token
    assert isinstance(DPICL(decoder=decoder, seed=0, max_tokens=3).complete("q").text, str)
    assert sum(e.label.startswith("knn-decode:") for e in ledger.history()) == 5


def test_an_answer_holds_the_index_turn_so_no_other_release_charges_between_its_tokens() -> None:
    """Cold review: two answers' token steps interleaved by how fast each computed, so who got a shared record's
    last budget depended on the records. An answer paid per token now holds the index's release turn from its first
    charge to its last; another thread's release waits for it and charges after all of its tokens, and the answer
    is delivered in one piece."""
    import threading

    index, _, decoder = per_token(["rare"] * 3 + ["plain"] * 3)
    stream = decoder.stream("q", rng=np.random.default_rng(0), max_tokens=3)
    order: list[str] = []
    started = threading.Event()
    real = decoder.knn._charge_candidates

    def slow(*args, **kw):
        out = real(*args, **kw)
        order.append("answer")
        if len(order) == 1:
            started.set()
            threading.Event().wait(0.2)  # the other release asks for the turn meanwhile
        return out

    decoder.knn._charge_candidates = slow  # type: ignore[method-assign]

    def other() -> None:
        started.wait()
        index.charge(
            Candidates(np.array([1]), np.array([1.0], dtype=np.float32)), lambda c: decoder.knn._cost("decode", c, 8, 1)
        )
        order.append("other")

    thread = threading.Thread(target=other)
    thread.start()
    pieces = list(stream)
    thread.join()
    assert order == ["answer", "answer", "answer", "other"] and len(pieces) == 1


def test_an_index_in_postgresql_is_refused_before_any_charge() -> None:
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-3, neighbouring="add_remove"))
    data = PrivateDataset.from_pairs(["q"] * 4, ["rare"] * 4)
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        build_expert_decoder(
            backend(),
            data,
            budget=ledger,
            epsilon=2.0,
            n_queries=10,
            uses=2,
            embedder=BagEmbedder(),
            pay_per_token=True,
            index_path="postgresql://nobody@127.0.0.1:9/none",
        )
    assert ledger.history() == []


def test_a_latency_window_and_the_turn_are_taken_in_one_order_so_concurrent_answers_finish() -> None:
    """Re-review: a per-token answer took the turn then its latency window, a per-answer one the window then the
    turn (at its charge): with one shared FixedLatency the two deadlocked. Every holder now takes the turn first."""
    import threading

    from dp_icl_plugin.retrieval import PrivateKNN

    index, _, decoder = build(["rare"] * 3 + ["plain"] * 3)
    timed = PrivateKNN(
        index,
        budget=decoder.knn.budget,
        backend=decoder.backend,
        config=decoder.knn.config,
        fixed_latency=0.05,
        releases=("decode",),
    )
    paid = KNNExpertDecoder(timed, template=TEMPLATE, pay_per_token=True)
    upfront = KNNExpertDecoder(timed, template=TEMPLATE)
    done: list[str] = []

    def run(name: str, dec: KNNExpertDecoder) -> None:
        for seed in range(3):
            dec.generate("q", rng=np.random.default_rng(seed), max_tokens=2)
        done.append(name)

    threads = [threading.Thread(target=run, args=(n, d), daemon=True) for n, d in (("paid", paid), ("up", upfront))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(done) == ["paid", "up"]


def test_removing_records_waits_for_an_answers_turn() -> None:
    """Re-review: a removal landed between a per-token answer's tokens, at a point set by compute speed."""
    import threading

    index, _, decoder = per_token(["rare"] * 3 + ["plain"] * 3)
    order: list[str] = []
    real = decoder.knn._charge_candidates
    started = threading.Event()

    def slow(*args, **kw):
        out = real(*args, **kw)
        order.append("token")
        if len(order) == 1:
            started.set()
            threading.Event().wait(0.2)
        return out

    decoder.knn._charge_candidates = slow  # type: ignore[method-assign]

    def remove() -> None:
        started.wait()
        index.remove([2])
        order.append("removed")

    thread = threading.Thread(target=remove)
    thread.start()
    decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    thread.join(60)
    assert order == ["token", "token", "token", "removed"]


def test_after_a_refusal_the_token_reads_what_it_would_read_without_that_record(monkeypatch) -> None:
    """D (record 1, with one token left, then records 2 and 3) against D′ (records 2 and 3): with the same released
    tokens (forced here), token 1 reads record 1's row on D, and tokens 2 and 3 read bit-identical rows on both."""
    config = KNNConfig(k=1, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=3)
    forced = [ID["a"], ID["c"], ID["b"]]

    def rows_read(labels: list[str], spent_first: int) -> list[np.ndarray]:
        index, _, decoder = per_token(labels, config=config)
        knn = decoder.knn
        if spent_first:
            first = Candidates(np.array([1]), np.array([1.0], dtype=np.float32))
            index.charge(first, lambda c: knn._cost("decode", c, 1, spent_first), release_tag=knn._release_tag)
        read: list[np.ndarray] = []

        def draw(mechanism, logprobs, generated, rule):  # the public history fixed: record what the token reads
            read.append(np.array(logprobs))
            return forced[len(generated)]

        monkeypatch.setattr(decoder, "_draw", draw)
        assert list(decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3).token_ids) == forced
        return read

    with_u = rows_read(["rare", "plain", "plain"], spent_first=5)  # 1 of its 6 tokens left
    without = rows_read(["plain", "plain"], spent_first=0)
    assert not np.array_equal(with_u[0], without[0])  # token 1: record 1 is the expert on D
    for t in (1, 2):
        np.testing.assert_array_equal(with_u[t], without[t])


def test_with_fixed_latency_each_tokens_charge_is_committed_on_a_public_schedule(monkeypatch) -> None:
    """The ledger commits an entry a token, so its timestamps would show each token's private compute time (how
    many experts, a record moving up and its replay). With fixed_latency the charges of tokens 2 and 3 wait for
    their slots of the answer's window (here 1 s apart on a fake clock), on D (record 1 refused before token 3,
    record 2's row replayed) as on D′ (no refusal); without it the gaps differ."""
    from dp_icl_plugin import timing as timing_module

    clock = FakeClock()
    monkeypatch.setattr(timing_module, "time", clock)
    real_rows = knn_experts._ExpertRows.rows

    def rows(self, ids, records):  # compute time that depends on the records: a new row replays every token
        clock.now += 0.01 + 0.2 * sum(int(i) not in self.place for i in ids) * len(self.released)
        return real_rows(self, ids, records)

    monkeypatch.setattr(knn_experts._ExpertRows, "rows", rows)
    config = KNNConfig(k=1, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=3)

    def gaps(spent_first: int, latency: float | None) -> list[float]:
        index, _, base = per_token(["rare", "plain"], config=config)
        knn = base.knn
        if spent_first:
            first = Candidates(np.array([1]), np.array([1.0], dtype=np.float32))
            index.charge(first, lambda c: knn._cost("decode", c, 1, spent_first), release_tag=knn._release_tag)
        decoder = KNNExpertDecoder(knn, template=base.template, pay_per_token=True, fixed_latency=latency)
        times: list[float] = []
        real_charge = knn._charge_candidates

        def charge(*args, **kw):
            times.append(clock.now)
            return real_charge(*args, **kw)

        monkeypatch.setattr(knn, "_charge_candidates", charge)
        decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
        return [b - a for a, b in itertools.pairwise(times)]

    assert gaps(4, None) != gaps(0, None)  # unpaced: the replay shows between the entries
    paced = [gaps(4, 3.0), gaps(0, 3.0)]  # from the answer's first charge, then tokens 2 and 3
    assert paced[0] == pytest.approx(paced[1], abs=1e-12) and paced[0] == pytest.approx([1.0, 1.0], abs=1e-12)


def test_a_late_token_counts_one_overrun_and_the_answer_still_takes_its_window(monkeypatch) -> None:
    """Token 1's rows take 1.5 s of a 3 s window cut in 3: token 2's charge is late (it goes at once), token 3's
    waits for its slot, and the answer returns at 3 s with one overrun for the release, not one per late token."""
    from dp_icl_plugin import timing as timing_module
    from dp_icl_plugin.timing import FixedLatency

    clock = FakeClock()
    monkeypatch.setattr(timing_module, "time", clock)
    real_rows, slow = knn_experts._ExpertRows.rows, [1.5]

    def rows(self, ids, records):
        clock.now += slow.pop() if slow else 0.01
        return real_rows(self, ids, records)

    monkeypatch.setattr(knn_experts._ExpertRows, "rows", rows)
    _, _, base = per_token(["rare", "plain"], config=KNNConfig(k=1, shards=1, min_similarity=0.5, max_answer_tokens=3))
    policy = FixedLatency(3.0)
    decoder = KNNExpertDecoder(base.knn, template=base.template, pay_per_token=True, fixed_latency=policy)
    started = clock.now
    decoder.generate("q", rng=np.random.default_rng(0), max_tokens=3)
    assert clock.now - started == pytest.approx(3.0, abs=1e-12)
    assert policy.releases == 1 and policy.overruns == 1
