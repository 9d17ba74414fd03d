"""Privacy units (user-level DP): records name their unit, ledgers and events state theirs, and every method run
against a unit-level ledger samples units and bounds each unit's contribution (``dp_icl_plugin.data.units``)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin import (
    AdaDPSynSynthesizer,
    BudgetManager,
    ClipBlendDecoder,
    ClipBlendSynthesizer,
    FakeBackend,
    MozoDecoder,
    MozoOfflineSynthesizer,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PromptTemplate,
    PTASynthesizer,
    TangSynthesizer,
)
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.data.units import all_elements, label_elements, labels_charged, records_of
from dp_icl_plugin.errors import BudgetMismatchError, ConfigurationError, UnsupportedEventError
from dp_icl_plugin.templates.answer import AnswerTemplate
from dp_icl_plugin.templates.prompting import fixed_size_subsets, poisson_prompts, slot_placement

VOCAB = ["/", "a", "b", "c", *[f"w{i}" for i in range(30)], "<eos>"]
TEMPLATE = PromptTemplate(header="/ ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False)
ANSWERS = AnswerTemplate(header="/ ", example="{text} {label} / ", query="{input}", stop=None, stop_at_eos=False)


def units_dataset(sizes: list[int] | None = None, *, labels: tuple[str, ...] = ("a", "b"), **kw: Any) -> PrivateDataset:
    """Units of the given sizes, their records spread over ``labels`` in turn; unit counts declared observed."""
    rng = np.random.default_rng(5)
    sizes = sizes if sizes is not None else [1, 2, 3, 8, 1, 1, 2, 5, 1, 1, 3, 1] * 2
    records = [
        PrivateRecord(" ".join(f"w{int(t)}" for t in rng.integers(0, 30, size=4)), labels[(u + j) % len(labels)], u)
        for u, size in enumerate(sizes)
        for j in range(size)
    ]
    settings_ = {"public_label_counts": "observed", "public_unit_counts": "observed", **kw}
    return PrivateDataset(records, labels=list(labels), **settings_)


def unit_ledger(epsilon: float = 50.0, **kw: Any) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon, 1e-3, privacy_unit="unit", **kw))


def record_ledger(epsilon: float = 50.0) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon, 1e-3))


def backend() -> FakeBackend:
    return FakeBackend(VOCAB, eos_token="<eos>", seed=3)


# -- events and ledgers -------------------------------------------------------------------------------------
def test_record_events_keep_their_stored_keys_and_unit_events_round_trip() -> None:
    record = me.tang_event(noise_multiplier=1.0, sampling_rate=0.1, steps=3)
    assert "privacy_unit" not in ev.event_key(record)  # ledgers written before units read the same keys
    unit = ev.with_privacy_unit(record, "unit")
    assert unit != record and all(a.privacy_unit == "unit" for a in ev.atoms(unit))
    assert ev.event_from_dict(unit.to_dict()) == unit
    assert tightest().epsilon(unit, delta=1e-5) == tightest().epsilon(record, delta=1e-5)  # the same analysis
    with pytest.raises(UnsupportedEventError, match="per record"):
        ev.with_privacy_unit(unit, "record")  # removing one record of a unit changes its element: no conversion


def test_record_and_unit_events_never_compose_into_one_guarantee() -> None:
    g = ev.GaussianEvent(2.0, neighbouring="add_remove")
    with pytest.raises(ConfigurationError, match="privacy units"):
        ev.compose(g, ev.with_privacy_unit(ev.PureDPEvent(0.5, neighbouring="add_remove"), "unit"))


def test_a_unit_conversion_to_replace_one_keeps_the_unit() -> None:
    converted = to_relation(
        ev.with_privacy_unit(ev.GaussianEvent(2.0, neighbouring="add_remove"), "unit"), "replace_one"
    )
    assert converted.privacy_unit == "unit" and converted.neighbouring == "replace_one"
    assert isinstance(converted, ev.GaussianEvent) and converted.sensitivity == 2.0


def test_a_ledger_refuses_a_charge_of_another_unit_and_commits_nothing() -> None:
    event = ev.PureDPEvent(0.1, neighbouring="replace_one")
    per_unit = unit_ledger()
    with pytest.raises(UnsupportedEventError, match="unit-level ledger"):
        per_unit.spend(event, label="x")
    per_record = record_ledger()
    with pytest.raises(UnsupportedEventError, match="record-level ledger"):
        per_record.spend(ev.with_privacy_unit(event, "unit"), label="x")
    assert per_unit.history() == [] and per_record.history() == []
    assert per_unit.spend(ev.with_privacy_unit(event, "unit"), label="x").id == 1


def test_a_unit_ledger_file_keeps_its_unit_and_refuses_a_record_budget(tmp_path: Any) -> None:
    path = tmp_path / "ledger.db"
    BudgetManager(PrivacyBudget(2.0, 1e-5, privacy_unit="unit"), ledger=path).close()
    reopened = BudgetManager.open(path)
    assert reopened.privacy_unit == "unit" and reopened.neighbouring == "replace_one"
    assert "privacy_unit='unit'" in repr(reopened)
    reopened.close()
    with pytest.raises(BudgetMismatchError, match="replace_one per unit"):
        BudgetManager(PrivacyBudget(2.0, 1e-5), ledger=path)
    old = tmp_path / "records.db"
    BudgetManager(PrivacyBudget(2.0, 1e-5), ledger=old).close()
    assert BudgetManager.open(old).privacy_unit == "record"


def test_a_budget_refuses_an_unknown_unit() -> None:
    with pytest.raises(ConfigurationError, match="privacy_unit"):
        PrivacyBudget(1.0, 1e-5, privacy_unit="person")


# -- records and datasets ---------------------------------------------------------------------------------
def test_a_records_unit_is_private_and_checked() -> None:
    record = PrivateRecord("secret", "a", unit="patient-17")
    assert "patient" not in repr(record) and "patient" not in str(record)
    for bad in ("", " ", 1.5, True):
        with pytest.raises(ConfigurationError, match="record 0"):
            PrivateDataset([PrivateRecord("x", "a", unit=bad)])  # type: ignore[arg-type]


def test_unit_counts_are_declared_or_observed_and_never_read_silently() -> None:
    data = PrivateDataset(
        [PrivateRecord("x", "a", 1), PrivateRecord("y", "a", 1), PrivateRecord("z", "b", 2)], labels=["a", "b"]
    )
    with pytest.raises(ConfigurationError, match="public_unit_counts"):
        data.public_unit_count("a")
    assert data.with_units(public_unit_counts="observed").public_unit_counts == {"a": 1, "b": 1}
    declared = data.with_units(public_unit_counts={"a": 10, "b": 10}, records_per_unit=2, labels_per_unit=1)
    assert declared.public_unit_count("a") == 10 and declared.records_per_unit == 2 and declared.labels_per_unit == 1
    with pytest.raises(ConfigurationError, match="records_per_unit"):
        data.with_units(records_per_unit=0)
    from_columns = PrivateDataset.from_pairs(["x", "y"], ["a", "a"], units=["p", "q"], public_unit_counts="observed")
    assert from_columns.public_unit_counts == {"a": 2}


def test_a_unit_level_run_refuses_a_record_without_a_unit_before_any_charge() -> None:
    data = PrivateDataset(
        [PrivateRecord("w1 w2", "a", 1), PrivateRecord("w3 w4", "a")],
        labels=["a"],
        public_label_counts="observed",
        public_unit_counts={"a": 2},
    )
    ledger = unit_ledger()
    with pytest.raises(ConfigurationError, match=r"record 1 .*names no unit"):
        _tang().synthesize(data, backend=backend(), budget=ledger, rng=np.random.default_rng(0))
    assert ledger.history() == []


# -- contribution bounding: hypothesis over unit sizes -------------------------------------------------------
unit_sizes = st.lists(st.integers(1, 30), min_size=2, max_size=12)


@settings(max_examples=40, deadline=None)
@given(sizes=unit_sizes, k=st.integers(1, 3), c=st.one_of(st.none(), st.integers(1, 2)), seed=st.integers(0, 2**16))
def test_a_unit_enters_one_prompt_of_a_step_with_at_most_k_records_in_at_most_c_labels(
    sizes: list[int], k: int, c: int | None, seed: int
) -> None:
    data = units_dataset(sizes, labels=("a", "b", "c"), records_per_unit=k, labels_per_unit=c)
    rng = np.random.default_rng(seed)
    elements = label_elements(data, data.labels, "unit", rng)
    labels_of: dict[object, set[str]] = {}
    for label, members in elements.items():
        for element in members:
            assert len({r.unit for r in element}) == 1 and all(r.label == label for r in element)
            labels_of.setdefault(element[0].unit, set()).add(label)
        assert len({e[0].unit for e in members}) == len(members)  # one element per unit and label
    assert max(len(v) for v in labels_of.values()) <= labels_charged(data, data.labels, "unit")
    for members in elements.values():
        for prompts in (
            poisson_prompts(members, sampling_rate=0.7, n_prompts=4, rng=rng, records_per_element=k),
            fixed_size_subsets(
                members,
                placement=slot_placement(len(members), max(len(members), 4), rng),
                n_prompts=2,
                per_prompt=2,
                rng=rng,
                records_per_element=k,
            ),
        ):
            where = Counter()
            for prompt in prompts:
                per_unit = Counter(r.unit for r in prompt)
                assert max(per_unit.values(), default=0) <= k
                where.update(per_unit.keys())
            assert max(where.values(), default=0) <= 1  # a unit's records sit in one prompt of the step


@settings(max_examples=25, deadline=None)
@given(sizes=unit_sizes, big=st.integers(1, 60), seed=st.integers(0, 2**16))
def test_a_unit_with_many_records_moves_a_step_by_no_more_than_one_record_and_pays_the_same(
    sizes: list[int], big: int, seed: int
) -> None:
    """Tang's step on D against D minus one unit of ``big`` records, coupled (the other units' draws fixed): the
    noiseless sum of the prompts' distributions moves by at most √2 (one prompt, any size of the unit), and the
    charge depends on the declared counts only, not on the unit's size."""
    with_unit = units_dataset([*sizes, big], labels=("a",))
    declared = {"public_unit_counts": {"a": 20}}  # at least the 13 units there can be
    data = with_unit.with_units(**declared)
    rng = np.random.default_rng(seed)
    members = label_elements(data, ["a"], "unit", rng)["a"]
    prompts = poisson_prompts(members, sampling_rate=0.8, n_prompts=4, rng=rng, records_per_element=1)
    target = len(sizes)  # the big unit's id
    without = [[r for r in p if r.unit != target] for p in prompts]  # D′ under the coupling

    def distribution(prompt: list[PrivateRecord]) -> np.ndarray:  # any model: a prompt's point on the simplex
        weights = np.array([1.0 + sum(r.text.count(f"w{i}") for r in prompt) for i in range(5)])
        return weights / weights.sum()

    moved = sum(distribution(p) for p in prompts) - sum(distribution(p) for p in without)
    assert np.linalg.norm(moved) <= math.sqrt(2) + 1e-12
    small = units_dataset([*sizes, 1], labels=("a",)).with_units(**declared)
    method = _tang(epsilon=None, noise_multiplier=1.5)
    assert method.event(data, privacy_unit="unit") == method.event(small, privacy_unit="unit")


def test_records_of_draws_at_most_k_uniformly_and_leaves_a_single_record_alone() -> None:
    element = tuple(PrivateRecord(f"w{i}", "a", 0) for i in range(6))
    rng = np.random.default_rng(0)
    counts = Counter(r.text for _ in range(3000) for r in records_of(element, 2, rng))
    assert set(counts) == {r.text for r in element}
    assert max(counts.values()) / min(counts.values()) < 1.2  # each 1000 ± ~30 (seeded)
    state = rng.bit_generator.state
    assert records_of(element[:1], 1, rng) == [element[0]] and rng.bit_generator.state == state


# -- every method, record level unchanged and unit level charged per unit --------------------------------------
def _tang(**kw: Any) -> TangSynthesizer:
    settings_ = {
        "n_prompts": 3,
        "records_per_prompt": 2,
        "max_tokens": 4,
        "top_k": 6,
        "epsilon": 8.0,
        "template": TEMPLATE,
    }
    return TangSynthesizer(**{**settings_, **kw})


def _methods() -> dict[str, Any]:
    common = {"max_tokens": 4, "top_k": 6, "epsilon": 8.0, "template": TEMPLATE}
    return {
        "tang": _tang(),
        "pta": PTASynthesizer(n_prompts=3, records_per_prompt=2, **common),
        "adadpsyn": AdaDPSynSynthesizer(n_prompts=3, records_per_prompt=2, **common),
        "clip-blend": ClipBlendSynthesizer(max_tokens=4, epsilon=8.0, template=TEMPLATE, subset_size=3),
    }


@pytest.mark.slow  # calibrates each method's noise twice: over 1 s
@pytest.mark.parametrize("name", ["tang", "pta", "adadpsyn", "clip-blend"])
def test_label_methods_charge_per_unit_and_stay_bit_identical_per_record(name: str) -> None:
    method = _methods()[name]
    data = units_dataset()
    plain = PrivateDataset(
        [PrivateRecord(r.text, r.label) for y in data.labels for r in data.records(y)],
        labels=list(data.labels),
        public_label_counts="observed",
    )
    runs = [
        method.synthesize(d, backend=backend(), budget=record_ledger(), rng=np.random.default_rng(1))
        for d in (data, plain)
    ]
    assert [x.token_ids for x in runs[0]] == [x.token_ids for x in runs[1]]  # units ignored per record
    ledger = unit_ledger()
    demos = method.synthesize(data, backend=backend(), budget=ledger, rng=np.random.default_rng(1))
    (entry,) = ledger.history()
    assert entry.event.privacy_unit == "unit" and demos.provenance.extra["privacy_unit"] == "unit"
    assert demos.provenance.extra["labels_charged"] == 2  # units span both labels: two labels' runs
    assert entry.event == method.event(data, privacy_unit="unit", ledger_delta=1e-3)


def test_a_unit_in_fewer_labels_pays_for_fewer_runs() -> None:
    method = _tang(epsilon=None, noise_multiplier=2.0)
    every = tightest().epsilon(method.event(units_dataset(), privacy_unit="unit"), delta=1e-5)
    one = tightest().epsilon(method.event(units_dataset(labels_per_unit=1), privacy_unit="unit"), delta=1e-5)
    per_record = tightest().epsilon(method.event(units_dataset()), delta=1e-5)
    # 18 units of each label against 28 records of the smallest: a higher rate over units, and two labels' runs
    assert per_record < one < every


def test_unit_level_methods_refuse_undeclared_unit_counts_before_any_charge() -> None:
    data = units_dataset().with_units()  # unit counts observed above: rebuild without them
    data = PrivateDataset(
        [r for y in data.labels for r in data.records(y)], labels=list(data.labels), public_label_counts="observed"
    )
    ledger = unit_ledger()
    with pytest.raises(ConfigurationError, match="public_unit_counts"):
        _tang().synthesize(data, backend=backend(), budget=ledger, rng=np.random.default_rng(0))
    assert ledger.history() == []


def test_mozo_offline_draws_units_at_n_shots_over_the_number_of_units() -> None:
    data = units_dataset(records_per_unit=2)
    method = MozoOfflineSynthesizer(n_shots=4, max_tokens=3, epsilon=8.0, top_k=6, template=ANSWERS)
    plan = method.plan(data, public_inputs=["w1 w2"], privacy_unit="unit")
    assert plan.params["sampling_rate"] == 4 / 24 and plan.event.privacy_unit == "unit"
    assert method.plan(data, public_inputs=["w1 w2"]).params["sampling_rate"] == 4 / len(data)
    ledger = unit_ledger()
    method.synthesize(data, public_inputs=["w1 w2"], backend=backend(), budget=ledger, rng=np.random.default_rng(0))
    assert ledger.history()[0].event.privacy_unit == "unit"


def test_the_decoders_draw_units_and_charge_per_unit() -> None:
    data = units_dataset(records_per_unit=2)
    ledger = unit_ledger()
    mozo = MozoDecoder(
        data, backend=backend(), budget=ledger, n_queries=2, max_tokens=3, epsilon=4.0, top_k=6, template=ANSWERS
    )
    assert mozo.sampling_rate == 4 / 24 and mozo.answer_event().privacy_unit == "unit"
    mozo.generate("w1 w2", rng=np.random.default_rng(0))
    clip = ClipBlendDecoder(
        data,
        backend=backend(),
        budget=ledger,
        n_queries=2,
        max_tokens=3,
        subset_size=6,
        epsilon=4.0,
        rng_subset=np.random.default_rng(2),
        template=ANSWERS,
    )
    assert all(len({r.unit for r in prompt}) == 1 and 1 <= len(prompt) <= 2 for prompt in clip._subset)
    clip.generate("w1 w2", rng=np.random.default_rng(0))
    assert [e.event.privacy_unit for e in ledger.history()] == ["unit", "unit"]
    with pytest.raises(ConfigurationError, match="number of units"):
        ClipBlendDecoder(
            data,
            backend=backend(),
            budget=unit_ledger(neighbouring="add_remove"),
            n_queries=2,
            subset_size=6,
            epsilon=4.0,
            rng_subset=np.random.default_rng(2),
        )


def test_all_elements_groups_a_units_records_across_labels() -> None:
    data = units_dataset([3, 1])
    assert [len(e) for e in all_elements(data, "unit")] == [3, 1]
    assert [len(e) for e in all_elements(data, "record")] == [1, 1, 1, 1]


# -- kNN: a per-person index covers a unit-level ledger with its filter's own (ε, δ) ---------------------------
def _knn_index(group_by_user: bool) -> Any:
    from test_knn_retriever import BagEmbedder

    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.retrieval import PrivateIndex

    index = PrivateIndex(
        budget=IndividualBudget(epsilon=2.0, delta=1e-6), embedder=BagEmbedder(), group_by_user=group_by_user
    )
    users = [f"u{i % 3}" for i in range(9)] if group_by_user else None
    index.add(["q w1"] * 9, labels=["a", "b", "a"] * 3, user_ids=users)
    return index


@pytest.mark.parametrize("relation", ["add_remove", "replace_one"])
def test_a_per_person_index_covers_a_unit_ledger_without_the_record_level_doubling(relation: str) -> None:
    from dp_icl_plugin.retrieval import KNNConfig, PrivateKNN

    ledger = unit_ledger(neighbouring=relation)
    knn = PrivateKNN(
        _knn_index(True), budget=ledger, labels=["a", "b"], config=KNNConfig(k=6, shards=1, min_similarity=0.1)
    )
    cover = ledger.history()[0].event
    assert isinstance(cover, ev.ApproxDPEvent) and (cover.epsilon, cover.delta) == (2.0, 1e-6)
    assert cover.privacy_unit == "unit" and cover.neighbouring == "add_remove"
    knn.vote("q w1", rng=np.random.default_rng(0))
    release = ledger.history()[1].event
    assert isinstance(release, ev.FilteredReleaseEvent) and release.privacy_unit == "unit"
    # on a record-level ledger the same index pays group privacy over two person steps
    per_record = record_ledger()
    PrivateKNN(_knn_index(True), budget=per_record, labels=["a", "b"])
    assert per_record.history()[0].event.epsilon == 4.0


def test_a_per_record_index_cannot_cover_a_unit_ledger() -> None:
    from dp_icl_plugin.retrieval import PrivateKNN

    ledger = unit_ledger()
    with pytest.raises(ConfigurationError, match="grouped by user"):
        PrivateKNN(_knn_index(False), budget=ledger, labels=["a", "b"])
    assert ledger.history() == []


def test_expert_decoding_over_a_unit_dataset_groups_its_index_by_unit() -> None:
    from test_knn_retriever import BagEmbedder

    from dp_icl_plugin.decoding.knn_experts import build_expert_decoder

    data = units_dataset([2, 3, 1, 4])
    ledger = unit_ledger()
    decoder = build_expert_decoder(
        backend(), data, budget=ledger, epsilon=2.0, n_queries=4, embedder=BagEmbedder(), template=ANSWERS
    )
    assert decoder.knn.index.group_by_user and decoder.knn.config.records_per_unit == data.records_per_unit
    assert decoder.knn.config.uses == math.ceil(4 * 40 / 4)  # answers per unit: n_queries·k over 4 units
    assert ledger.history()[0].event.privacy_unit == "unit"


def test_a_unit_spelled_as_text_and_as_a_number_is_one_unit() -> None:
    data = PrivateDataset(
        [PrivateRecord("w1", "a", 7), PrivateRecord("w2", "a", "7"), PrivateRecord("w3", "a", 8)],
        public_unit_counts="observed",
    )
    assert data.public_unit_counts == {"a": 2}
    assert sorted(len(e) for e in all_elements(data, "unit")) == [1, 2]


def test_a_method_that_does_not_sample_units_is_refused_a_unit_ledger() -> None:
    class RecordsOnly(TangSynthesizer):
        supports_privacy_units = False

    ledger = unit_ledger()
    with pytest.raises(ConfigurationError, match="does not sample privacy units"):
        RecordsOnly(**_tang().config.__dict__).synthesize(
            units_dataset(), backend=backend(), budget=ledger, rng=np.random.default_rng(0)
        )
    assert ledger.history() == []


def test_the_contribution_bounds_are_fixed_once_the_dataset_is_made() -> None:
    data = units_dataset(records_per_unit=2, labels_per_unit=1)
    with pytest.raises(AttributeError):
        data.records_per_unit = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        data.labels_per_unit = 2  # type: ignore[misc]


def test_a_stored_relation_reads_back_strictly() -> None:
    assert PrivacyBudget.from_stored(1.0, 1e-5, "add_remove/unit").privacy_unit == "unit"
    for foreign in ("replace_one/", "replace_one/record", "replace_one/person"):
        with pytest.raises(ConfigurationError):
            PrivacyBudget.from_stored(1.0, 1e-5, foreign)


def test_the_cli_declares_a_spend_per_record_unless_told_per_unit(tmp_path: Any, capsys: Any) -> None:
    from dp_icl_plugin.cli import main

    ledger = str(tmp_path / "people.db")
    assert (
        main(["budget", "init", "--ledger", ledger, "--epsilon", "4", "--delta", "1e-6", "--privacy-unit", "unit"]) == 0
    )
    spend = ["budget", "spend", "--ledger", ledger, "--epsilon", "0.5", "--label", "outside"]
    assert main(spend) == 2 and "unit-level ledger" in capsys.readouterr().err
    assert main([*spend, "--privacy-unit", "unit"]) == 0
    capsys.readouterr()
    assert main(["budget", "show", "--ledger", ledger]) == 0
    assert '"privacy_unit": "unit"' in capsys.readouterr().out and BudgetManager.open(ledger).history()[0].id == 1


def test_knn_records_per_unit_makes_a_person_pay_for_its_nearest_record_only() -> None:
    from dp_icl_plugin.retrieval import KNNConfig, PrivateKNN

    spent = {}
    for limit in (None, 1):
        index = _knn_index(True)  # 3 people of 3 records, all equally near the query
        ledger = unit_ledger()
        config = KNNConfig(k=6, shards=1, min_similarity=0.1, records_per_unit=limit)
        PrivateKNN(index, budget=ledger, labels=["a", "b"], config=config).vote("q w1", rng=np.random.default_rng(0))
        people = np.unique(index.units_of(np.arange(10)))  # record ids 1..9 (0 is never a record)
        spent[limit] = index.filter.epsilon_spent(people[people >= 0])
    # uses = 1: a person's budget pays one single-record release; with 3 near records a person cannot pay and is
    # refused, bounded to its nearest record each person pays (and votes)
    assert np.all(spent[None] == 0) and np.all(spent[1] > 0)
    with pytest.raises(ConfigurationError, match="records_per_unit"):
        KNNConfig(records_per_unit=0)


def test_nearest_per_unit_keeps_each_units_first_candidates_in_order() -> None:
    from dp_icl_plugin.retrieval.index import Candidates

    candidates = Candidates(np.array([5, 3, 9, 1, 7]), np.array([0.9, 0.8, 0.7, 0.6, 0.5]))
    kept = candidates.nearest_per_unit(np.array([2, 1, 2, 2, 1]), 2)
    assert kept.ids.tolist() == [5, 3, 9, 7]
    shuffled = Candidates(np.array([7, 1, 3, 9, 5]), np.array([0.5, 0.6, 0.8, 0.7, 0.9]))  # any order: sorted inside
    assert shuffled.nearest_per_unit(np.array([1, 2, 1, 2, 2]), 2).ids.tolist() == [7, 3, 9, 5]
    removed = candidates.nearest_per_unit(np.array([-1, 1, -1, 2, 1]), 2)  # a record no longer stored is dropped
    assert removed.ids.tolist() == [3, 1, 7]


def test_knn_records_per_unit_lets_no_person_change_anothers_candidates_or_charge() -> None:
    """Person A's kept record and spend are the same with and without a person B whose records are nearer the
    query and interleave A's ids."""
    from test_knn_retriever import BagEmbedder

    from dp_icl_plugin.accounting import IndividualBudget
    from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN

    outcome = []
    for with_b in (False, True):
        index = PrivateIndex(
            budget=IndividualBudget(epsilon=4.0, delta=1e-6), embedder=BagEmbedder(), group_by_user=True
        )
        texts, users = ["q w1 w2 w3", "q w1 w2"], ["A", "A"]
        if with_b:
            texts, users = ["q w1", "q w1 w2 w3", "q w1", "q w1 w2"], ["B", "A", "B", "A"]
        ids = index.add(texts, labels=["a"] * len(texts), user_ids=users)
        config = KNNConfig(k=4, shards=1, min_similarity=0.1, uses=2, records_per_unit=1)
        knn = PrivateKNN(index, budget=unit_ledger(neighbouring="add_remove"), labels=["a", "b"], config=config)
        retrieval = knn.retrieve("q w1", release="vote")
        a_ids = [int(i) for i, u in zip(ids, users, strict=True) if u == "A"]
        a_unit = index.units_of(np.array(a_ids[:1]))
        kept = [a_ids.index(int(i)) for i in retrieval._candidates.ids if int(i) in a_ids]  # the charged set
        outcome.append((kept, float(index.filter.epsilon_spent(a_unit)[0])))
    assert outcome[0] == outcome[1] and len(outcome[0][0]) == 1
