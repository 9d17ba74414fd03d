"""Tang et al.'s Gaussian aggregation for public inputs (:class:`TangAnswerSynthesizer`): the charge, the sampling,
the prompts and the refusals before any charge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from dp_icl_plugin import (
    BudgetManager,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    TangAnswerSynthesizer,
)
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.calibration import calibrate_subsampled_gaussian
from dp_icl_plugin.backends.base import Prompt
from dp_icl_plugin.errors import BudgetExhaustedError, CalibrationError, ConfigurationError
from dp_icl_plugin.synthesis.tang import tang_noise
from dp_icl_plugin.templates.answer import AnswerTemplate

VOCAB = ["/", *[f"w{i}" for i in range(40)]]
LAYOUT = AnswerTemplate(header="/ ", example="{text} {label} / ", query="{input}", stop=None, stop_at_eos=False)
INPUTS = ["w1 w2 w3", "w4 w5"]


def dataset(n: int = 40) -> PrivateDataset:
    rng = np.random.default_rng(7)
    records = [
        PrivateRecord(" ".join(f"w{int(t)}" for t in rng.integers(0, 30, size=3)), f"w{30 + i % 5}") for i in range(n)
    ]
    return PrivateDataset(records)


def ledger(epsilon: float = 20.0, **kw: Any) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon, 1e-3, **kw))


def method(**overrides: Any) -> TangAnswerSynthesizer:
    settings: dict[str, Any] = {
        "n_prompts": 4,
        "records_per_prompt": 2,
        "max_tokens": 3,
        "top_k": 10,
        "epsilon": 8.0,
        "template": LAYOUT,
    }
    settings.update(overrides)
    return TangAnswerSynthesizer(**settings)


class RecordingBackend(FakeBackend):
    """FakeBackend that keeps every batch of prompts it was asked about."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[list[int]]] = []

    def next_token_logprobs(self, prompts: Sequence[Prompt] | np.ndarray) -> np.ndarray:
        self.batches.append([[int(t) for t in p] for p in prompts])
        return super().next_token_logprobs(prompts)


def test_the_charge_is_tangs_event_over_every_token_of_every_input() -> None:
    data, budget = dataset(), ledger()
    m = method()
    demos = m.synthesize(
        data, public_inputs=INPUTS, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0)
    )
    (entry,) = budget.history()
    sigma = demos.provenance.extra["noise_multiplier"]
    # q = M·N/|D| (|D| public under replace-one), steps = inputs × T
    assert entry.event == me.tang_event(noise_multiplier=sigma, sampling_rate=8 / 40, steps=2 * 3)
    assert entry.event == m.event(data, public_inputs=INPUTS, ledger_delta=1e-3)
    assert demos.provenance.method == "tang_answers" and demos.provenance.ledger_entry_id == entry.id
    assert demos.provenance.epsilon == pytest.approx(budget.spent().epsilon) and demos.provenance.epsilon <= 8.0
    assert demos.provenance.extra["n_public_inputs"] == 2 and "public_inputs" not in demos.provenance.extra
    assert [d.input for d in demos] == INPUTS and all(d.label == d.text for d in demos)
    assert all(len(d.token_ids) == 3 for d in demos)  # no stop in this layout: T tokens each


def test_sigma_is_the_smallest_on_the_grid_that_meets_the_target() -> None:
    """The golden value: what ``calibrate_subsampled_gaussian`` (``dp-icl calibrate subsampled-gaussian``) gives."""
    plan = method(epsilon=2.0, max_tokens=20).plan(dataset(400), public_inputs=INPUTS, ledger_delta=1e-5)
    expected = calibrate_subsampled_gaussian(epsilon=2.0, delta=1e-5, sampling_rate=8 / 400, steps=40)
    assert plan.params["noise_multiplier"] == expected.value
    assert plan.params["calibrated_epsilon"] == pytest.approx(expected.epsilon) and expected.epsilon <= 2.0
    assert tang_noise(
        epsilon=None, noise_multiplier=1.7, delta=1e-5, sampling_rate=0.1, steps=3, neighbouring="replace_one"
    ) == (1.7, None)


def test_add_remove_needs_a_declared_population_and_samples_at_its_rate() -> None:
    data = dataset()
    with pytest.raises(ConfigurationError, match="population"):
        method().plan(data, public_inputs=INPUTS, neighbouring="add_remove")
    budget = ledger(neighbouring="add_remove")
    with pytest.raises(ConfigurationError, match="population"):
        method().synthesize(
            data, public_inputs=INPUTS, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0)
        )
    assert budget.history() == []
    declared = method(population=100)
    plan = declared.plan(data, public_inputs=INPUTS, neighbouring="add_remove", ledger_delta=1e-3)
    assert plan.params["sampling_rate"] == 8 / 100  # the declared size, never the observed 40
    assert plan.event == me.tang_event(
        noise_multiplier=plan.params["noise_multiplier"], sampling_rate=0.08, steps=6, neighbouring="add_remove"
    )
    declared.synthesize(
        data, public_inputs=INPUTS, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0)
    )
    assert budget.history()[0].event == plan.event


def test_every_token_draws_fresh_prompts_each_record_in_one_and_the_public_row_alone() -> None:
    data = dataset(12)
    backend = RecordingBackend(VOCAB, seed=3)
    demos = method(records_per_prompt=1, noise_multiplier=0.5, epsilon=None).synthesize(
        data, public_inputs=INPUTS[:1], backend=backend, budget=ledger(), rng=np.random.default_rng(5)
    )
    generated = list(demos[0].token_ids)
    zero_shot = backend.encode(LAYOUT.zero_shot_prompt(INPUTS[0]))
    records = [r for y in data.labels for r in data.records(y)]
    example = {f"{r.text} {r.label}": i for i, r in enumerate(records)}
    assert len(example) == len(records)
    public_calls = [b for b in backend.batches if len(b) == 1 and b[0] == zero_shot + generated[: len(b[0]) - 4]]
    assert len(public_calls) == 4  # the pre-flight, then one public call a token, never beside a record's row
    private_calls = [b for b in backend.batches if b not in public_calls]
    assert len(private_calls) == 3
    draws = []
    for t, batch in enumerate(private_calls):
        assert len(batch) == 4  # M prompts (an empty one is the zero-shot prompt)
        used: list[int] = []
        for prompt in batch:
            assert prompt[:1] == zero_shot[:1] and prompt[-3 - t :] == zero_shot[1:] + generated[:t]
            pieces = backend.decode(prompt[1 : len(prompt) - 3 - t]).split(" / ")  # the examples between them
            used += [example[p.strip(" /")] for p in pieces if p.strip(" /")]
        assert len(used) == len(set(used))  # a record joins at most one prompt of a token
        draws.append(tuple(sorted(used)))
    assert len(set(draws)) > 1  # Poisson-sampled afresh each token


def test_a_fixed_seed_gives_the_same_outputs_and_noise_changes_them() -> None:
    data, backend = dataset(), FakeBackend(VOCAB, seed=3)

    def run(seed: int, sigma: float) -> list[tuple[int, ...]]:
        m = method(epsilon=None, noise_multiplier=sigma, max_tokens=4)
        demos = m.synthesize(
            data, public_inputs=INPUTS, backend=backend, budget=ledger(1e6), rng=np.random.default_rng(seed)
        )
        return [d.token_ids for d in demos]

    assert run(42, 0.5) == run(42, 0.5)
    assert len({tuple(run(seed, 50.0)) for seed in range(6)}) > 1  # σ = 50 swamps a sum of 4 probabilities


def test_without_noise_a_token_is_the_argmax_of_the_prompts_summed_distributions() -> None:
    only = np.zeros(len(VOCAB))
    only[VOCAB.index("w7")] = 1.0
    backend = FakeBackend(VOCAB, table={(): only})
    demos = method().synthesize_nonprivate(
        dataset(), public_inputs=INPUTS, backend=backend, rng=np.random.default_rng(0)
    )
    assert all(d.token_ids == (VOCAB.index("w7"),) * 3 for d in demos)
    assert demos.provenance.ledger_entry_id is None


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m, d: m.plan(d, ["w30"], public_inputs=INPUTS), "labels"),
        (lambda m, d: m.plan(d), "public_inputs"),
        (lambda m, d: m.plan(d, public_inputs=["w1", " "]), "public input 1"),
        (lambda m, d: method(n_prompts=30).plan(d, public_inputs=INPUTS), "exceeds the 40 records"),
    ],
)
def test_bad_input_is_refused_before_any_charge(call: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        call(method(), dataset())


@pytest.mark.parametrize(
    "settings",
    [{"template": "not a template"}, {"population": 0}, {"top_p": 1.5}, {"demo_label": 3}, {"noise_multiplier": 1.0}],
)
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        method(**settings)


def test_a_run_the_ledger_cannot_afford_charges_nothing() -> None:
    budget = ledger(epsilon=1.0)
    with pytest.raises(BudgetExhaustedError):
        method(epsilon=4.0).synthesize(
            dataset(),
            public_inputs=INPUTS,
            backend=FakeBackend(VOCAB, seed=3),
            budget=budget,
            rng=np.random.default_rng(0),
        )
    assert budget.history() == []


def test_a_target_no_sigma_meets_is_refused() -> None:
    with pytest.raises(CalibrationError, match="no noise multiplier"):
        method(epsilon=1e-4, max_tokens=50).plan(dataset(), public_inputs=INPUTS, ledger_delta=1e-6)


def test_units_are_drawn_and_the_event_is_per_unit() -> None:
    records = [PrivateRecord(f"w{i % 30}", f"w{30 + i % 5}", unit=f"u{i // 2}") for i in range(40)]
    data = PrivateDataset(records, records_per_unit=2)
    budget = ledger(privacy_unit="unit")
    m = method()
    plan = m.plan(data, public_inputs=INPUTS, privacy_unit="unit", ledger_delta=1e-3)
    assert plan.params["sampling_rate"] == 8 / 20 and plan.event.privacy_unit == "unit"
    m.synthesize(
        data, public_inputs=INPUTS, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0)
    )
    assert budget.history()[0].event == plan.event


def test_a_saved_set_serves_its_own_inputs_only(tmp_path) -> None:
    """``save_to`` keeps the set across restarts; asked for other public inputs, the file is refused instead of
    served (it compared the method's settings only; found by the cold review)."""
    data, budget, path = dataset(), ledger(), tmp_path / "demos.jsonl"
    backend = FakeBackend(VOCAB, seed=3)
    first = method().synthesize(
        data, public_inputs=INPUTS, backend=backend, budget=budget, rng=np.random.default_rng(0), save_to=path
    )
    again = method().synthesize(
        data, public_inputs=INPUTS, backend=backend, budget=budget, rng=np.random.default_rng(1), save_to=path
    )
    assert [d.token_ids for d in again] == [d.token_ids for d in first] and len(budget.history()) == 1
    with pytest.raises(ConfigurationError, match="other public inputs"):
        method().synthesize(
            data, public_inputs=INPUTS[:1], backend=backend, budget=budget, rng=np.random.default_rng(0), save_to=path
        )
    assert len(budget.history()) == 1
