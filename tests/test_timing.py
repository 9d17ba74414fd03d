"""The timing side channel: with ``fixed_latency`` a release's duration no longer depends on private data.

Durations are measured on a fake clock that the backend advances by a cost proportional to the private
prompts' lengths (so the tests are exact and do not depend on the machine's load); one test checks the real
clock's padding.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from dp_icl_plugin import BudgetManager, ConfigurationError, FakeBackend, PrivacyBudget, PrivateDataset, PrivateRecord
from dp_icl_plugin import timing as timing_module
from dp_icl_plugin.accounting.individual_filter import IndividualBudget
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN
from dp_icl_plugin.timing import FixedLatency, as_fixed_latency
from tests.test_knn_retriever import LABELS, BagEmbedder, fake_backend, records

WORDS = ["a", "b", "c", "d", "e", "zzsecretzz", "Text:", "Label:", "<eos>"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing_module, "time", fake)
    return fake


def slow(backend: FakeBackend, clock: FakeClock, per_token: float) -> FakeBackend:
    """Make ``backend``'s forward passes take ``per_token`` seconds per prompt token on ``clock``."""
    forward, start = backend.next_token_logprobs, backend.start

    def next_token_logprobs(prompts):
        clock.now += per_token * sum(len(backend.encode(p) if isinstance(p, str) else p) for p in prompts)
        return forward(prompts)

    def start_session(prompts):
        clock.now += per_token * sum(len(p) for p in prompts)
        return start(prompts)

    backend.next_token_logprobs = next_token_logprobs  # type: ignore[method-assign]
    backend.start = start_session  # type: ignore[method-assign]
    return backend


def dataset(words_per_record: int) -> PrivateDataset:
    rng = np.random.default_rng(0)
    return PrivateDataset(
        [PrivateRecord(" ".join(rng.choice(list("abcde"), words_per_record)), "ab"[i % 2]) for i in range(20)]
    )


def decoder(kind: str, data: PrivateDataset, clock: FakeClock, **kw):
    backend = slow(FakeBackend(WORDS, eos_token="<eos>", seed=3), clock, 1e-3)
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    common = {"backend": backend, "budget": ledger, "n_queries": 12, "max_tokens": 4, "epsilon": 8.0, **kw}
    if kind == "mozo":
        return MozoDecoder(data, top_k=6, **common)
    return ClipBlendDecoder(data, subset_size=8, rng_subset=np.random.default_rng(1), **common)


def duration(clock: FakeClock, call) -> float:
    start = clock.now
    call()
    return clock.now - start


@pytest.mark.parametrize("kind", ["mozo", "clip-blend"])
def test_decoders_take_the_fixed_time_whatever_the_private_records(kind: str, clock: FakeClock) -> None:
    short, long = dataset(1), dataset(30)
    answers = [decoder(kind, data, clock) for data in (short, long)]
    exposed = [duration(clock, lambda d=d: d.generate("a b", rng=np.random.default_rng(0))) for d in answers]
    assert exposed[1] > 2 * exposed[0]  # without the policy, longer private records take longer
    policy = FixedLatency(5.0)
    answers = [decoder(kind, data, clock, fixed_latency=policy) for data in (short, long)]
    hidden = [duration(clock, lambda d=d: d.generate("a b", rng=np.random.default_rng(0))) for d in answers]
    assert hidden == pytest.approx([5.0, 5.0], abs=1e-9) and policy.overruns == 0 and policy.releases == 2


@pytest.mark.parametrize("kind", ["mozo", "clip-blend"])
def test_a_hidden_stream_is_one_piece_with_the_same_text(kind: str, clock: FakeClock) -> None:
    plain = decoder(kind, dataset(3), clock).generate("a b", rng=np.random.default_rng(4))
    hidden = decoder(kind, dataset(3), clock, fixed_latency=1.0)
    pieces = list(hidden.stream("a b", rng=np.random.default_rng(4)))
    assert pieces == ([plain.text] if plain.text else [])
    assert len(hidden.budget.history()) == 1  # charged once, as without the policy


def test_a_refused_answer_is_padded_too(clock: FakeClock) -> None:
    from dp_icl_plugin import BudgetExhaustedError

    hidden = decoder("mozo", dataset(3), clock, fixed_latency=2.0)
    hidden.budget = BudgetManager(PrivacyBudget(1e-3, 1e-2))
    start = clock.now
    with pytest.raises(BudgetExhaustedError):
        hidden.generate("a b", rng=np.random.default_rng(0))
    assert clock.now - start == pytest.approx(2.0, abs=1e-9)


def test_an_overrun_is_counted_and_logged_without_private_text(clock: FakeClock, caplog) -> None:
    data = PrivateDataset([PrivateRecord("a b c zzsecretzz", "ab"[i % 2]) for i in range(20)])
    policy = FixedLatency(1e-6)
    with caplog.at_level(logging.DEBUG):
        decoder("mozo", data, clock, fixed_latency=policy).generate("a b", rng=np.random.default_rng(0))
    assert policy.overruns == 1
    assert "overran its fixed latency window" in caplog.text and "zzsecretzz" not in caplog.text


def test_an_overrun_leaves_its_duration_nowhere(clock: FakeClock, caplog) -> None:
    """Regression (issue 27, defect 4): the overrun warning and ``FixedLatency.slowest`` carried the private
    duration the padding exists to hide. The warning is one fixed text; no attribute or repr holds a time."""
    policy = FixedLatency(1.5)
    durations = (7.25, 0.5)  # one overrun (by a duration that depends on private data), one padded release
    with caplog.at_level(logging.DEBUG, logger=timing_module.__name__):
        for took in durations:
            with policy.hold():
                clock.now += took
    assert policy.releases == 2 and policy.overruns == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and not any(ch.isdigit() for ch in messages[0])  # not even the public latency
    shown = [repr(policy), str(policy), *messages]
    state = [v for k, v in vars(policy).items() if k != "seconds"]
    for took in durations:
        assert all(str(took) not in text and f"{took:.3f}" not in text for text in shown)
        assert took not in [v for v in state if isinstance(v, float)]
    assert not hasattr(policy, "slowest")
    assert messages == [timing_module.OVERRUN_WARNING]


def knn(clock: FakeClock, **kw) -> PrivateKNN:
    texts, labels, answers = records(60)
    index = PrivateIndex(budget=IndividualBudget(epsilon=2.0, delta=1e-5), embedder=BagEmbedder())
    index.add(texts, labels=labels, answers=answers)
    return PrivateKNN(
        index,
        budget=BudgetManager(PrivacyBudget(10.0, 1e-4)),
        labels=LABELS,
        backend=slow(fake_backend(texts), clock, 1e-3),
        config=KNNConfig(k=8, shards=4, min_similarity=0.6, uses=4, keywords=2),
        **kw,
    )


QUERIES = ("red thing number1", "Answer:")  # many candidates; none


@pytest.mark.usefixtures("weak_keywords_allowed")
def test_knn_releases_take_the_fixed_time_and_the_ledger_names_no_count(clock: FakeClock) -> None:
    rng = np.random.default_rng(0)
    exposed = knn(clock)
    times = [duration(clock, lambda q=q: exposed.answer(q, rng=rng)) for q in QUERIES]
    assert times[0] > times[1]  # without the policy, more candidates take longer
    # Regression (issue 14, defect 4): labels carried units=N (how many records were near the query) unless
    # fixed_latency was set; now no label holds a count computed from the records, whatever the policy: only the
    # release's number under its cover (issue 40), which every release gets whatever it used.
    labels = [e.label for e in exposed.budget.history()[1:]]
    assert labels == [f"knn-answer:{exposed.index.id}#{n}" for n in range(1, len(QUERIES) + 1)]
    policy = FixedLatency(3.0)
    hidden = knn(clock, fixed_latency=policy)
    for query in QUERIES:
        assert duration(clock, lambda q=query: hidden.classify(q, rng=rng)) == pytest.approx(3.0, abs=1e-9)
        assert duration(clock, lambda q=query: hidden.answer(q, rng=rng)) == pytest.approx(3.0, abs=1e-9)
        assert duration(clock, lambda q=query: hidden.vote(q, rng=rng)) == pytest.approx(3.0, abs=1e-9)
    assert policy.overruns == 0 and policy.releases == 6
    assert all("units=" not in e.label for e in hidden.budget.history())


def test_real_clock_padding_and_bad_settings() -> None:
    policy = FixedLatency(0.05)
    started = time.monotonic()
    with pytest.raises(KeyError), policy.hold():
        raise KeyError("failure inside the release")
    assert time.monotonic() - started >= 0.05 and policy.releases == 1
    assert as_fixed_latency(None) is None and as_fixed_latency(policy) is policy
    assert as_fixed_latency(2).seconds == 2.0  # type: ignore[union-attr]
    for bad in (0, -1.0, float("nan"), float("inf"), "1", True):
        with pytest.raises(ConfigurationError):
            as_fixed_latency(bad)  # type: ignore[arg-type]


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
@pytest.mark.parametrize("kind", ["mozo", "clip-blend"])
def test_concurrent_answers_each_keep_their_own_window(kind: str) -> None:
    """Real clock: one answer alone takes ~0.32 s (8 backend calls of ≥ 40 ms: a step's public row and its
    records' rows in calls of their own), the window is 0.45 s. Four callers at once: answers interleaved token
    by token would each take ~1.3 s and all overrun their windows; run one at a time, each inside its own
    window, none does."""
    backend = FakeBackend(WORDS, eos_token="<eos>", seed=3)
    forward, start = backend.next_token_logprobs, backend.start

    def next_token_logprobs(prompts):
        time.sleep(0.04)
        return forward(prompts)

    class SlowSession:
        def __init__(self, session) -> None:
            self._session = session

        def __getattr__(self, name: str):  # n_prompts, lengths, logprobs, close
            return getattr(self._session, name)

        def append(self, token):
            time.sleep(0.04)
            return self._session.append(token)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self._session.close()

    def start_session(prompts):
        time.sleep(0.04)
        return SlowSession(start(prompts))

    backend.next_token_logprobs = next_token_logprobs  # type: ignore[method-assign]
    backend.start = start_session  # type: ignore[method-assign]
    policy = FixedLatency(0.45)
    ledger = BudgetManager(PrivacyBudget(100.0, 1e-2))
    common = {
        "backend": backend,
        "budget": ledger,
        "n_queries": 12,
        "max_tokens": 4,
        "epsilon": 8.0,
        "fixed_latency": policy,
    }
    if kind == "mozo":
        hidden = MozoDecoder(dataset(3), top_k=6, **common)
    else:
        hidden = ClipBlendDecoder(dataset(3), subset_size=8, rng_subset=np.random.default_rng(1), **common)
    threads = [
        threading.Thread(target=hidden.generate, args=("a b",), kwargs={"rng": np.random.default_rng(i)})
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert policy.releases == 4 and policy.overruns == 0, policy.overruns


def test_turns_are_first_come_first_served_and_a_nested_release_is_refused() -> None:
    policy = FixedLatency(0.02)
    served: list[int] = []
    gate = threading.Event()

    def release(i: int) -> None:
        with policy.hold():
            if i == 0:
                gate.wait(5)  # the first holds its window while the others queue, in order
            served.append(i)

    first = threading.Thread(target=release, args=(0,))
    first.start()
    time.sleep(0.05)
    queued = []
    for i in range(1, 8):
        t = threading.Thread(target=release, args=(i,))
        t.start()
        queued.append(t)
        time.sleep(0.02)  # arrival order 1, 2, ...
    gate.set()
    for t in [first, *queued]:
        t.join(timeout=30)
    assert served == list(range(8))
    with policy.hold(), pytest.raises(ConfigurationError, match="nested"), policy.hold():
        pass


def test_a_caller_cancelled_while_queued_leaves_at_once_without_a_window() -> None:
    from dp_icl_plugin.timing import ReleaseCancelled

    policy = FixedLatency(0.3)
    gone = threading.Event()
    with policy.hold():
        waited: list[float] = []

        def queued() -> None:
            started = time.monotonic()
            with pytest.raises(ReleaseCancelled), policy.hold(cancelled=gone):
                pass
            waited.append(time.monotonic() - started)

        t = threading.Thread(target=queued)
        t.start()
        time.sleep(0.05)
        gone.set()
        t.join(timeout=5)
        assert waited and waited[0] < 0.2  # it left before the holder's window ended
    assert policy.releases == 1  # no window was opened (or padded) for the cancelled caller
