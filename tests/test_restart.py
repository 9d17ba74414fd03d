"""An app started again on the same durable ledger charges only its answers (issue 41): every component that charges
a cover or a share keeps it where the app reopens it, and a refusal caused by a second cover says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from postgres_server import PostgresServer, postgres_database_fixture, postgres_server_fixture  # noqa: F401
from test_knn_experts import TEMPLATE, backend
from test_knn_retriever import BagEmbedder

from dp_icl_plugin import (
    BudgetExhaustedError,
    BudgetManager,
    ConfigurationError,
    MozoDecoder,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    build_expert_decoder,
)
from dp_icl_plugin.accounting import IndividualBudget
from dp_icl_plugin.decoding import BudgetShare
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN, index_beside, kept_index

LEDGER_BUDGET = PrivacyBudget(6.0, 1e-4, neighbouring="add_remove")


def data(n: int = 6, extra: int = 0) -> PrivateDataset:
    return PrivateDataset.from_pairs(["q"] * n + ["q u"] * extra, ["rare"] * n + ["plain"] * extra)


def start(ledger: Path | str, dataset: PrivateDataset, **settings):  # type: ignore[no-untyped-def]
    """One start of the app: open the ledger, build the decoder."""
    budget = BudgetManager(LEDGER_BUDGET, ledger=ledger)
    decoder = build_expert_decoder(
        backend(),
        dataset,
        budget=budget,
        epsilon=settings.pop("epsilon", 4.0),
        n_queries=4,
        uses=2,
        max_tokens=2,
        k=8,
        min_similarity=0.5,
        embedder=BagEmbedder(),
        template=TEMPLATE,
        **settings,
    )
    return budget, decoder


def kinds(budget: BudgetManager) -> list[str]:
    return [entry.label.split(":")[0] for entry in budget.history()]


def test_a_second_start_on_a_file_ledger_reopens_the_index_and_charges_only_its_answers(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    budget, decoder = start(ledger, data())
    decoder.generate("q", rng=np.random.default_rng(0))
    spent = decoder.knn.index.filter.epsilon_spent(np.arange(1, 7))
    assert kinds(budget) == ["knn-filter", "knn-decode"] and np.all(spent > 0)
    assert (tmp_path / "ledger.db.indexes" / "knn-experts" / "records.sqlite").is_file()
    budget.close()

    again, decoder = start(ledger, data())  # the restart
    assert kinds(again) == ["knn-filter", "knn-decode"]  # no second cover
    np.testing.assert_array_equal(decoder.knn.index.filter.epsilon_spent(np.arange(1, 7)), spent)  # spend kept
    decoder.generate("q", rng=np.random.default_rng(1))
    assert kinds(again) == ["knn-filter", "knn-decode", "knn-decode"]
    # without the kept index this ledger could not afford the second cover (ε = 4 of 6 each): the old behaviour
    assert not again.would_fit(again.history()[0].event)


def test_records_added_since_join_the_kept_index_under_its_cover(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    budget, decoder = start(ledger, data())
    before = len(decoder.knn.index)
    budget.close()
    again, decoder = start(ledger, data(extra=2))
    assert len(decoder.knn.index) == before + 2 and kinds(again) == ["knn-filter"]
    again.close()
    third, decoder = start(ledger, data(extra=2))  # nothing new: nothing added twice
    assert len(decoder.knn.index) == before + 2 and kinds(third) == ["knn-filter"]


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"dataset": data(n=5)}, "not among those given"),  # a record the app no longer passes
        ({"epsilon": 3.0}, "gives each unit"),
    ],
    ids=["a record dropped", "another budget"],
)
def test_a_kept_index_that_does_not_match_is_refused_before_any_charge(
    tmp_path: Path, changed: dict, message: str
) -> None:
    ledger = tmp_path / "ledger.db"
    budget, _ = start(ledger, data())
    budget.close()
    dataset = changed.pop("dataset", data())
    reopened = BudgetManager.open(ledger)
    with pytest.raises(ConfigurationError, match=message) as caught:
        start(ledger, dataset, **changed)
    assert "index_name" in str(caught.value)
    assert kinds(reopened) == ["knn-filter"]


def test_another_index_name_is_a_new_index_with_its_own_cover(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    budget, _ = start(ledger, data(), epsilon=2.0)
    budget.close()
    again, decoder = start(ledger, data(), epsilon=2.0, index_name="second")
    assert kinds(again) == ["knn-filter", "knn-filter"]
    assert decoder.knn.index.path == tmp_path / "ledger.db.indexes" / "second"


def test_an_in_memory_ledger_keeps_its_index_in_memory(tmp_path: Path) -> None:
    budget = BudgetManager(LEDGER_BUDGET)
    assert index_beside(budget) is None
    decoder = build_expert_decoder(
        backend(), data(), budget=budget, epsilon=2.0, n_queries=4, uses=2, embedder=BagEmbedder()
    )
    assert decoder.knn.index.path is None


def test_a_second_cover_refused_says_why_and_names_the_fix() -> None:
    budget = BudgetManager(LEDGER_BUDGET)
    config = KNNConfig(k=8, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=2)

    def new_core() -> PrivateKNN:  # the records indexed again in memory, as a restarted app did
        index = PrivateIndex(budget=IndividualBudget(epsilon=4.0, delta=1e-5), embedder=BagEmbedder())
        index.add(["q"] * 4, labels=["rare"] * 4)
        return PrivateKNN(index, budget=budget, backend=backend(), config=config, releases=("decode",))

    new_core()
    with pytest.raises(BudgetExhaustedError, match="already covers 1 other index") as caught:
        new_core()
    assert "PrivateIndex.open" in str(caught.value) and caught.value.requested_epsilon > 0
    assert kinds(budget) == ["knn-filter"]


def test_a_restart_on_postgresql_keeps_the_index_in_the_ledgers_database(pg_dsn: str) -> None:
    budget, decoder = start(pg_dsn, data())
    decoder.generate("q", rng=np.random.default_rng(0))
    spent = decoder.knn.index.filter.epsilon_spent(np.arange(1, 7))
    budget.close()
    again, decoder = start(pg_dsn, data())
    assert kinds(again) == ["knn-filter", "knn-decode"] and decoder.knn.index.path is None
    np.testing.assert_array_equal(decoder.knn.index.filter.epsilon_spent(np.arange(1, 7)), spent)


def test_a_person_grouped_index_is_reused_only_for_the_same_people(tmp_path: Path) -> None:
    def people(owner_of_last: str) -> PrivateDataset:
        owners = ["ann", "ann", "bob", "bob", "cy", owner_of_last]
        return PrivateDataset(
            [PrivateRecord("q", "rare", unit=o) for o in owners],
            public_label_counts="observed",
            public_unit_counts="observed",
        )

    unit_ledger = PrivacyBudget(6.0, 1e-4, neighbouring="add_remove", privacy_unit="unit")
    ledger = tmp_path / "ledger.db"

    def build(dataset: PrivateDataset):  # type: ignore[no-untyped-def]
        budget = BudgetManager(unit_ledger, ledger=ledger)
        build_expert_decoder(
            backend(), dataset, budget=budget, epsilon=2.0, n_queries=4, uses=2, embedder=BagEmbedder()
        )
        return budget

    build(people("cy")).close()
    assert kinds(build(people("cy"))) == ["knn-filter"]
    with pytest.raises(ConfigurationError, match="groups them into other people"):
        build(people("dan"))  # the last record moved to another person


def test_kept_index_builds_a_directory_all_or_nothing(tmp_path: Path) -> None:
    budget = IndividualBudget(epsilon=1.0, delta=1e-6)

    class Failing(BagEmbedder):
        def __call__(self, texts: list[str]) -> np.ndarray:
            if any("boom" in t for t in texts):
                raise RuntimeError("embedder failed")
            return super().__call__(texts)

    with pytest.raises(RuntimeError):
        kept_index(tmp_path / "idx", budget=budget, texts=["a", "boom"], embedder=Failing())
    assert not (tmp_path / "idx").exists()  # nothing half-built left to be reopened
    index = kept_index(tmp_path / "idx", budget=budget, texts=["a", "b"], embedder=BagEmbedder())
    assert len(index) == 2


def test_a_mozo_decoder_charges_nothing_until_it_answers() -> None:
    """DPS-MOZO and clip-blend decoders hold no cover: each answer is charged when it is made, so a restart
    (a new decoder on the same ledger) pays nothing to start."""
    budget = BudgetManager(PrivacyBudget(6.0, 1e-4))
    MozoDecoder.with_epsilon(
        PrivateDataset.from_pairs(["a b"] * 8, ["c"] * 8),
        BudgetShare(epsilon=5.0, n_queries=1, max_tokens=2),
        backend=backend(),
        budget=budget,
    )
    assert budget.history() == []


FRUIT = ["apples", "oranges", "bananas"]


def fruit_data() -> PrivateDataset:
    return PrivateDataset.from_pairs([f"who likes {FRUIT[i % 3]} number {i}" for i in range(12)], FRUIT * 4)


def fruit_embedder():  # type: ignore[no-untyped-def]
    def embed(batch: list[str]) -> np.ndarray:
        return np.array([[1.0 + t.count("apples"), t.count("oranges"), t.count("bananas")] for t in batch])

    embed.dp_icl_name = "fruit3"  # type: ignore[attr-defined]
    return embed


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from adapter_fixtures import CORPUS
    from tests_support import tiny_text_gpt2

    return str(tiny_text_gpt2(tmp_path_factory.mktemp("model") / "gpt2", CORPUS * 5 + FRUIT * 5, n_positions=256))


@pytest.mark.parametrize("adapter", ["langchain", "llama-index"])
def test_an_adapters_knn_experts_model_restarts_without_a_second_cover(
    tmp_path: Path, tiny_model: str, adapter: str
) -> None:
    ledger = tmp_path / "ledger.db"

    def start_and_answer() -> BudgetManager:
        budget = BudgetManager(LEDGER_BUDGET, ledger=ledger)
        settings = dict(method="knn-experts", epsilon=2.0, n_queries=4, uses=2, k=4, max_tokens=2, seed=0)
        if adapter == "langchain":
            from langchain_dp_icl import ChatDPICL

            chat = ChatDPICL.from_model_id(
                tiny_model, fruit_data(), budget=budget, embedder=fruit_embedder(), **settings
            )
            chat.invoke("who likes apples")
        else:
            from llama_index.llms.dp_icl import DPICL

            llm = DPICL.from_model_id(tiny_model, fruit_data(), budget=budget, embedder=fruit_embedder(), **settings)
            llm.complete("who likes apples")
        return budget

    start_and_answer().close()
    assert kinds(start_and_answer()) == ["knn-filter", "knn-decode", "knn-decode"]


@pytest.mark.parametrize("adapter", ["langchain", "llama-index"])
def test_a_retriever_over_a_kept_index_restarts_without_a_second_cover(
    tmp_path: Path, tiny_model: str, adapter: str
) -> None:
    from dp_icl_plugin import HFBackend

    ledger = tmp_path / "ledger.db"
    model = HFBackend.from_pretrained(tiny_model, device="cpu", dtype="float32")

    def start_and_retrieve() -> BudgetManager:
        budget = BudgetManager(LEDGER_BUDGET, ledger=ledger)
        index = kept_index(
            index_beside(budget, "tickets"),
            budget=IndividualBudget(epsilon=2.0, delta=1e-6),
            texts=[f"who likes {FRUIT[i % 3]} number {i}" for i in range(12)],
            answers=FRUIT * 4,
            embedder=fruit_embedder(),
        )
        config = KNNConfig(k=4, shards=1, min_similarity=0.5, uses=2, max_answer_tokens=2)
        core = PrivateKNN(index, budget=budget, backend=model, config=config, releases=("decode",))
        if adapter == "langchain":
            from langchain_dp_icl import DPICLRetriever

            DPICLRetriever(knn=core, seed=0).invoke("who likes apples")
        else:
            from llama_index.retrievers.dp_icl import DPICLRetriever as LlamaRetriever

            LlamaRetriever(core, seed=0).retrieve("who likes apples")
        return budget

    start_and_retrieve().close()
    assert kinds(start_and_retrieve()) == ["knn-filter", "knn-decode", "knn-decode"]


def test_synthesis_saved_to_a_file_is_served_at_the_next_start_without_a_charge(tmp_path: Path) -> None:
    from adapter_fixtures import backend as tiny_backend
    from adapter_fixtures import dataset as canary_dataset

    from dp_icl_plugin import TangSynthesizer

    ledger = tmp_path / "ledger.db"
    saved = tmp_path / "demos.jsonl"

    def start_and_synthesize():  # type: ignore[no-untyped-def]
        budget = BudgetManager(LEDGER_BUDGET, ledger=ledger)
        method = TangSynthesizer(
            epsilon=2.0, delta=1e-5, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
        )
        demos = method.synthesize(
            canary_dataset().with_public_label_counts("observed"),
            backend=tiny_backend(),
            budget=budget,
            rng=np.random.default_rng(0),
            save_to=saved,
        )
        return budget, demos

    budget, first = start_and_synthesize()
    assert saved.is_file() and kinds(budget) == ["tang"]
    budget.close()
    again, second = start_and_synthesize()
    assert kinds(again) == ["tang"] and [d.text for d in second] == [d.text for d in first]


class SlowBag(BagEmbedder):
    """Embeds slowly: two workers that both looked before either added would both add (without the lock)."""

    def __call__(self, texts: list[str]) -> np.ndarray:
        import time

        time.sleep(0.3)
        return super().__call__(texts)


def _start_worker(location: str, barrier, texts: list[str]) -> None:  # type: ignore[no-untyped-def]
    barrier.wait()
    kept_index(location, budget=IndividualBudget(epsilon=1.0, delta=1e-6), texts=texts, embedder=SlowBag(), name="t")


@pytest.mark.parametrize("where", ["directory", "postgresql"])
def test_workers_starting_together_add_a_missing_record_once(tmp_path: Path, where: str, request) -> None:  # type: ignore[no-untyped-def]
    """Cold review of issue 41: kept_index looked, then added; two workers starting together both found the new
    records missing and both added them, so each had two filters (twice its budget). Looking and adding are now
    one locked step."""
    import multiprocessing

    location = str(tmp_path / "idx") if where == "directory" else request.getfixturevalue("pg_dsn")
    old = [f"ticket {i}" for i in range(4)]
    budget = IndividualBudget(epsilon=1.0, delta=1e-6)
    kept_index(location, budget=budget, texts=old, embedder=BagEmbedder(), name="t")
    grown = [*old, "ticket new one", "ticket new two"]
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    workers = [context.Process(target=_start_worker, args=(location, barrier, grown)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    assert len(PrivateIndex.open(location, embedder=BagEmbedder(), name="t")) == 6


def test_a_removed_record_given_again_is_not_added_with_a_fresh_budget(tmp_path: Path) -> None:
    """Cold review of issue 41: kept_index matched records by content, so a record removed from a per-record index
    and still passed by the app came back as a new row with an unused filter (twice its budget in all)."""
    location = tmp_path / "idx"
    budget = IndividualBudget(epsilon=1.0, delta=1e-6)
    texts = ["alice secret", "bob note", "carol memo"]
    index = kept_index(location, budget=budget, texts=texts, embedder=BagEmbedder())
    records, _ = index.all_records()
    index.remove([r.id for r in records if r.text == "alice secret"])
    with pytest.raises(ConfigurationError, match="removed record coming back"):
        kept_index(location, budget=budget, texts=texts, embedder=BagEmbedder())
    reopened = kept_index(location, budget=budget, texts=texts[1:], embedder=BagEmbedder())  # nothing to add: fine
    assert sorted(r.text for r in reopened.all_records()[0]) == ["bob note", "carol memo"]


def test_save_to_never_serves_a_set_made_without_a_charge_or_with_other_settings(tmp_path: Path) -> None:
    """Cold review of issue 41: synthesize(save_to=) served any file of the method's name as DP output."""
    from adapter_fixtures import backend as tiny_backend
    from adapter_fixtures import dataset as canary_dataset

    from dp_icl_plugin import TangSynthesizer

    def method(epsilon: float) -> TangSynthesizer:
        return TangSynthesizer(
            epsilon=epsilon, delta=1e-5, n_prompts=2, records_per_prompt=2, max_tokens=3, shots_per_label=1, top_k=5
        )

    data = canary_dataset().with_public_label_counts("observed")
    nonprivate = method(2.0).synthesize_nonprivate(data, backend=tiny_backend(), rng=np.random.default_rng(0))
    saved = nonprivate.save(tmp_path / "demos.jsonl")
    budget = BudgetManager(LEDGER_BUDGET)
    with pytest.raises(ConfigurationError, match="without a DP charge"):
        method(2.0).synthesize(data, backend=tiny_backend(), budget=budget, rng=np.random.default_rng(0), save_to=saved)
    saved.unlink()
    method(2.0).synthesize(data, backend=tiny_backend(), budget=budget, rng=np.random.default_rng(0), save_to=saved)
    with pytest.raises(ConfigurationError, match="other settings"):  # asked for ε = 1 now: not the ε = 2 set
        method(1.0).synthesize(data, backend=tiny_backend(), budget=budget, rng=np.random.default_rng(0), save_to=saved)
    assert kinds(budget) == ["tang"]


def test_index_beside_a_named_postgresql_ledger_is_that_ledgers_own(pg_dsn: str) -> None:
    from dp_icl_plugin.accounting import PostgresStore

    default = BudgetManager(LEDGER_BUDGET, ledger=pg_dsn)
    tenant = BudgetManager(LEDGER_BUDGET, ledger=PostgresStore(pg_dsn, ledger="tenant-b"))
    assert index_beside(default).name == "knn-experts"
    assert index_beside(tenant).name == "tenant-b/knn-experts"
    assert pg_dsn not in repr(index_beside(tenant)) or "@" not in pg_dsn


def test_keep_index_false_keeps_the_records_in_memory(tmp_path: Path) -> None:
    _, decoder = start(tmp_path / "ledger.db", data(), keep_index=False)
    assert decoder.knn.index.path is None and not (tmp_path / "ledger.db.indexes").exists()
