"""Tang et al. (B1/BA2) and PTA (P1/PA2/PA3) synthesis on FakeBackend, and end to end on a tiny real GPT-2."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests_support import steps_of

from dp_icl_plugin import (
    PRESETS,
    AdaDPSynSynthesizer,
    BudgetManager,
    ClipBlendSynthesizer,
    DemoSet,
    FakeBackend,
    PrivacyBudget,
    PrivateDataset,
    PrivateRecord,
    PromptTemplate,
    PTASynthesizer,
    TangSynthesizer,
)
from dp_icl_plugin.accounting import calibrate_subsampled_gaussian
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.errors import BackendError, BudgetExhaustedError, ConfigurationError
from dp_icl_plugin.templates.prompting import poisson_prompts

VOCAB = ["/", *[f"w{i}" for i in range(40)]]
TEMPLATE = PromptTemplate(header="/ ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False)
CANARY = "w39 w39 w39 w38"


def _dataset(n_per_label: int = 60) -> PrivateDataset:
    rng = np.random.default_rng(7)
    records = [
        PrivateRecord(" ".join(f"w{int(t)}" for t in rng.integers(0, 30, size=6)), label)
        for label in ("a", "b")
        for _ in range(n_per_label)
    ]
    return PrivateDataset(records, labels=["a", "b"], public_label_counts="observed")


def _budget(epsilon: float = 10.0) -> BudgetManager:
    return BudgetManager(PrivacyBudget(epsilon=epsilon, delta=1e-3))


def _pta(**overrides: object) -> PTASynthesizer:
    settings = {
        "n_prompts": 4,
        "records_per_prompt": 3,
        "max_tokens": 6,
        "shots_per_label": 2,
        "top_k": 8,
        "epsilon": 2.0,
        "delta": 1e-3,
        "alpha": 2.0,
        "template": TEMPLATE,
    }
    settings.update(overrides)
    return PTASynthesizer(**settings)


class RecordingBackend(FakeBackend):
    """FakeBackend that keeps every batch of log-probabilities it returned."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[np.ndarray] = []

    def next_token_logprobs(self, prompts: Sequence[object]) -> np.ndarray:  # type: ignore[override]
        out = super().next_token_logprobs(prompts)  # type: ignore[arg-type]
        self.calls.append(out.copy())
        return out


# ---------------------------------------------------------------------------- accounting


@pytest.mark.slow  # over 1 s: the full suite, not the unit layer
def test_charged_event_is_the_planned_event_and_provenance_says_so() -> None:
    data, budget = _dataset(), _budget()
    method = _pta()
    demos = method.synthesize(data, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0))
    (entry,) = budget.history()
    assert entry.event == method.event(data)
    assert entry.event == me.tang_event(
        noise_multiplier=demos.provenance.extra["noise_multiplier"], sampling_rate=12 / 60, steps=2 * 6
    )
    assert demos.provenance.ledger_entry_id == entry.id and demos.provenance.method == "pta"
    assert demos.provenance.epsilon == pytest.approx(budget.spent().epsilon)
    assert demos.provenance.epsilon <= 2.0
    assert len(demos) == 4 and demos.labels == ("a", "b")


@pytest.mark.parametrize(
    "make",
    [
        lambda: _pta(delta=None, epsilon=2.0),
        lambda: TangSynthesizer(
            n_prompts=4, records_per_prompt=3, max_tokens=6, shots_per_label=2, top_k=8, epsilon=2.0, template=TEMPLATE
        ),
        lambda: AdaDPSynSynthesizer(
            n_prompts=2, records_per_prompt=2, max_tokens=2, shots_per_label=1, top_k=8, epsilon=2.0, template=TEMPLATE
        ),
        lambda: ClipBlendSynthesizer(max_tokens=4, shots_per_label=1, epsilon=2.0, template=TEMPLATE),
    ],
)
@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_a_target_epsilon_without_delta_is_met_at_the_ledgers_delta(make: Any) -> None:
    # PTASynthesizer(epsilon=2.0) charged 3.84 on a ledger with δ 1e-4: its target δ defaulted to 1/min_y n_y
    data, budget = _dataset(), BudgetManager(PrivacyBudget(epsilon=10.0, delta=1e-4))
    method = make()
    assert method.plan(data).params["target_delta"] == pytest.approx(1 / (60 if method.name != "adadpsyn" else 120))
    demos = method.synthesize(data, backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0))
    assert demos.provenance.extra["target_delta"] == 1e-4
    assert 1.9 < budget.spent().epsilon <= 2.0 + 1e-9


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_sigma_is_what_the_calibrate_command_returns() -> None:
    """σ for a target ε is `dp-icl calibrate subsampled-gaussian` at q = M·N/min|D_y|, steps = shots × T."""
    data = _dataset(n_per_label=80)
    plan = _pta(epsilon=1.0, delta=1 / 80).plan(data)
    expected = calibrate_subsampled_gaussian(epsilon=1.0, delta=1 / 80, sampling_rate=12 / 80, steps=12)
    assert plan.params["noise_multiplier"] == expected.value


@pytest.mark.parametrize(("epsilon", "sigma"), [(1.0, 0.70), (2.0, 0.59), (4.0, 0.47), (8.0, 0.37)])
def test_pta_gets_the_published_ginc_sigma(epsilon: float, sigma: float) -> None:
    """PTA Table 4, GINC: |D_y| = 1,600, M = 5, N = 4, 4 shots per label, 36 compositions (T − 1 = 9 each)."""
    records = [PrivateRecord("w1 w2", "c") for _ in range(1600)]
    method = PTASynthesizer(
        n_prompts=5, records_per_prompt=4, max_tokens=9, shots_per_label=4, epsilon=epsilon, template=TEMPLATE
    )
    data = PrivateDataset(records, public_label_counts={"c": 1600})
    paper = method.plan(data, neighbouring="add_remove")  # PLD: at most PTA's PRV σ, within the 0.01 grid
    assert sigma - 0.01 - 1e-9 <= paper.params["noise_multiplier"] <= sigma + 1e-9
    assert paper.params["target_delta"] == 1 / 1600
    default = method.plan(data)  # replace-one, the ledger default: never less noise, at most 0.02 more
    assert paper.params["noise_multiplier"] <= default.params["noise_multiplier"] <= sigma + 0.02 + 1e-9


def test_sampling_rate_comes_from_the_declared_size_not_the_records() -> None:
    """Regression (issue 14, defect 3): with |D_y| = M·N read from the data, q went from 1 to M·N/(M·N + 1) when a
    record was added, dropping another record with probability ≈ 0.63 (two rows changed). The rate is now
    fixed by the declared size, so adding a record leaves every other record's coin alone."""
    per_token = 4 * 3
    base = [PrivateRecord(f"w{i % 30}", "a") for i in range(per_token)]
    d = PrivateDataset(base, public_label_counts={"a": per_token})
    d_plus = PrivateDataset([*base, PrivateRecord("w31", "a")], public_label_counts={"a": per_token})
    method = _pta(noise_multiplier=1.0, epsilon=None)
    assert method.plan(d).params["sampling_rate"] == method.plan(d_plus).params["sampling_rate"] == 1.0
    # Coupled draws (same seed): the records of D are dealt exactly as before; only the new one can differ.
    for seed in range(50):
        on_d = poisson_prompts(
            [(r,) for r in d.records("a")], sampling_rate=1.0, n_prompts=4, rng=np.random.default_rng(seed)
        )
        on_plus = poisson_prompts(
            [(r,) for r in d_plus.records("a")], sampling_rate=1.0, n_prompts=4, rng=np.random.default_rng(seed)
        )
        kept = sum(r is not d_plus.records("a")[-1] for p in on_plus for r in p)
        assert kept == sum(len(p) for p in on_d) == per_token  # no record of D dropped
    # Undeclared sizes are refused before anything runs: nothing is read from the records instead.
    with pytest.raises(ConfigurationError, match="public_label_counts"):
        method.plan(PrivateDataset(base))


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_a_rate_beyond_ptas_grid_calibrates_above_it() -> None:
    """q = 12/30 over 12 steps at ε = 1 needs σ > 3 (the top of PTA's grid): the search goes on in [3, 100]
    rather than refusing a small label, and the σ found meets the target while 0.01 less does not."""
    data = PrivateDataset([PrivateRecord(f"w{i}", "a") for i in range(30)], public_label_counts={"a": 30})
    params = _pta(epsilon=1.0).plan(data).params
    sigma, q, steps = params["noise_multiplier"], params["sampling_rate"], params["steps"]
    assert sigma > 3.0 and params["calibrated_epsilon"] <= 1.0

    def epsilon_at(s: float) -> float:
        return tightest().epsilon(me.tang_event(noise_multiplier=s, sampling_rate=q, steps=steps), delta=1e-3)

    assert epsilon_at(sigma) <= 1.0 < epsilon_at(sigma - 0.01)


def test_labels_compose_in_parallel_at_the_smallest_label() -> None:
    records = [PrivateRecord("w1", "a") for _ in range(40)] + [PrivateRecord("w2", "b") for _ in range(100)]
    data = PrivateDataset(records, public_label_counts="observed")
    method = _pta(noise_multiplier=1.0, epsilon=None)
    assert method.event(data).event.sampling_rate == pytest.approx(12 / 40)
    assert method.event(data, labels=["b"]).event.sampling_rate == pytest.approx(12 / 100)


# ---------------------------------------------------------------------------- determinism and reductions


def test_fixed_seed_gives_identical_demonstrations() -> None:
    data, backend = _dataset(), FakeBackend(VOCAB, seed=3)
    runs = [_pta().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(42)) for _ in "ab"]
    assert [d.token_ids for d in runs[0]] == [d.token_ids for d in runs[1]]
    other = _pta().synthesize(data, backend=backend, budget=_budget(), rng=np.random.default_rng(43))
    assert [d.token_ids for d in other] != [d.token_ids for d in runs[0]]


def _replay(calls: list[np.ndarray], pick: object) -> list[int]:
    return [int(pick(batch)) for batch in calls]  # type: ignore[operator]


def test_noiseless_tang_is_the_argmax_of_the_renormalised_sum() -> None:
    backend = RecordingBackend(VOCAB, seed=5, context_window=3)
    method = TangSynthesizer(
        n_prompts=4,
        records_per_prompt=3,
        max_tokens=5,
        shots_per_label=1,
        top_k=6,
        top_p=0.6,
        noise_multiplier=1.0,
        template=TEMPLATE,
    )
    demos = method.synthesize_nonprivate(_dataset(), labels=["a"], backend=backend, rng=np.random.default_rng(0))
    calls = steps_of(backend.calls[1:], public=1)  # the first call is the public pre-flight

    def pick(batch: np.ndarray) -> int:
        p = np.exp(batch.astype(np.float64))
        order = np.lexsort((np.arange(p.shape[1]), -p[0]))[:6]
        mass = np.cumsum(p[0, order]) / p[0].sum()
        vocab = order[: int(np.searchsorted(mass, 0.6 - 1e-12)) + 1]
        rows = p[1:, vocab] / p[1:, vocab].sum(axis=1, keepdims=True)
        return int(vocab[np.argmax(rows.sum(axis=0))])

    assert list(demos[0].token_ids) == _replay(calls, pick)
    assert demos.provenance.epsilon == math.inf and demos.provenance.ledger_entry_id is None


def test_noiseless_pta_with_alpha_zero_follows_the_base_prompt() -> None:
    backend = RecordingBackend(VOCAB, seed=9, context_window=2)
    demos = _pta(alpha=0.0, top_k=10).synthesize_nonprivate(
        _dataset(), labels=["b"], backend=backend, rng=np.random.default_rng(1)
    )

    def pick(batch: np.ndarray) -> int:
        order = np.lexsort((np.arange(batch.shape[1]), -batch[0]))[:10]
        return int(order[np.argmax(batch[1, order])])  # row 1 is the base prompt

    first_demo = steps_of(backend.calls[1 : 1 + 2 * 6], public=2)  # public + base apart
    assert list(demos[0].token_ids) == _replay(first_demo, pick)


@pytest.mark.slow  # over 1 s: the full suite, not the unit layer
def test_pta3_drops_the_base_prompt() -> None:
    backend = RecordingBackend(VOCAB, seed=9)
    _pta(use_base=False, max_tokens=2, shots_per_label=1).synthesize_nonprivate(
        _dataset(), labels=["a"], backend=backend, rng=np.random.default_rng(1)
    )
    assert [c.shape[0] for c in backend.calls[1:3]] == [1, 4]  # the public row apart, then M private; no base row


# ---------------------------------------------------------------------------- sampling as accounted


def test_poisson_prompts_sample_each_record_at_the_rate_and_deal_uniformly() -> None:
    """Inclusion frequency q = 0.2 and prompt choice uniform over M = 4: 2,000 rounds of 100 records;
    tolerance 4.5 standard errors."""
    records = [PrivateRecord(f"w{i % 30}", "a") for i in range(100)]
    rng = np.random.default_rng(11)
    included = np.zeros(100)
    per_prompt = np.zeros(4)
    index = {id(r): i for i, r in enumerate(records)}
    for _ in range(2000):
        for slot, prompt in enumerate(
            poisson_prompts([(r,) for r in records], sampling_rate=0.2, n_prompts=4, rng=rng)
        ):
            per_prompt[slot] += len(prompt)
            for record in prompt:
                included[index[id(record)]] += 1
    rate = included / 2000
    assert abs(rate.mean() - 0.2) < 4.5 * math.sqrt(0.2 * 0.8 / 200_000)
    assert np.all(np.abs(rate - 0.2) < 4.5 * math.sqrt(0.2 * 0.8 / 2000) + 0.01)
    share = per_prompt / per_prompt.sum()
    assert np.all(np.abs(share - 0.25) < 4.5 * math.sqrt(0.25 * 0.75 / per_prompt.sum()))


# ---------------------------------------------------------------------------- bad input, nothing charged


class NaNBackend(FakeBackend):
    def next_token_logprobs(self, prompts: Sequence[object]) -> np.ndarray:  # type: ignore[override]
        out = super().next_token_logprobs(prompts)  # type: ignore[arg-type]
        out[:, 0] = np.nan
        return out


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: (_pta(n_prompts=30, records_per_prompt=3), _dataset(), {}), "declared size"),
        (lambda: (_pta(), _dataset(), {"labels": ["zzz"]}), "unknown label"),
        (lambda: (_pta(top_k=500), _dataset(), {}), "top_k"),
        (lambda: (_pta(epsilon=1e-6), _dataset(), {}), "meets"),
    ],
)
def test_bad_configuration_is_refused_before_any_charge(make: object, error: str) -> None:
    method, data, kwargs = make()  # type: ignore[operator]
    budget = _budget()
    with pytest.raises(ConfigurationError, match=error):
        method.synthesize(data, backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0), **kwargs)
    assert budget.history() == []


def test_budget_too_small_is_refused_and_nothing_is_charged() -> None:
    budget = _budget(epsilon=0.5)
    with pytest.raises(BudgetExhaustedError):
        _pta(epsilon=2.0).synthesize(
            _dataset(), backend=FakeBackend(VOCAB), budget=budget, rng=np.random.default_rng(0)
        )
    assert budget.history() == []


def test_nan_from_the_backend_is_caught_in_the_public_preflight() -> None:
    budget = _budget()
    with pytest.raises(BackendError, match="NaN"):
        _pta().synthesize(_dataset(), backend=NaNBackend(VOCAB), budget=budget, rng=np.random.default_rng(0))
    assert budget.history() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rng": 0},
        {"rng": np.random.RandomState(0)},
        {"backend": object()},
        {"budget": None},
    ],
)
def test_wrong_types_are_configuration_errors(kwargs: dict[str, object]) -> None:
    call = {"backend": FakeBackend(VOCAB), "budget": _budget(), "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(ConfigurationError):
        _pta().synthesize(_dataset(), **call)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [
        {"epsilon": None},  # neither ε nor σ
        {"noise_multiplier": 1.0},  # both
        {"top_p": 0.0},
        {"alpha": -1.0},
        {"alpha": math.nan},
        {"n_prompts": 0},
        {"delta": 1.0},
        {"template": "Text: {text}"},
    ],
)
def test_bad_config_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        _pta(**overrides)


def test_private_text_never_appears_in_reprs_or_errors() -> None:
    record = PrivateRecord(CANARY, "a")
    assert CANARY not in repr(record) and CANARY not in str(record)
    data = PrivateDataset([record, PrivateRecord("w1", "a")])
    assert CANARY not in repr(data)
    with pytest.raises(ConfigurationError) as info:
        PrivateDataset([record, PrivateRecord(CANARY, "unknown")], labels=["a"])
    assert CANARY not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        PrivateDataset([record, PrivateRecord("   ", "a")])
    assert "record 1" in str(info.value)


# ---------------------------------------------------------------------------- the demonstration store


def test_demoset_round_trip_charges_nothing(tmp_path: Path) -> None:
    budget = _budget()
    demos = _pta().synthesize(
        _dataset(), backend=FakeBackend(VOCAB, seed=3), budget=budget, rng=np.random.default_rng(0)
    )
    path = demos.save(tmp_path / "demos.jsonl")
    loaded = DemoSet.load(path)
    assert list(loaded) == list(demos) and loaded.provenance == demos.provenance
    assert len(budget.history()) == 1
    assert loaded.as_examples()[0] == {"label": demos[0].label, "text": demos[0].text}


@pytest.mark.parametrize(
    "content",
    ["", "not json\n", '{"format": "other"}\n', '{"format": "dp-icl-demoset", "version": 99, "provenance": {}}\n'],
)
def test_demoset_load_refuses_foreign_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigurationError):
        DemoSet.load(path)
    with pytest.raises(ConfigurationError):
        DemoSet.load(tmp_path / "missing.jsonl")


def test_presets_render_the_papers_layout() -> None:
    t = PRESETS["agnews"]
    assert t.public_prompt("World") == (
        "Given a label of news type, generate the chosen type of news accordingly.\n\nNews Type: World\nText:"
    )
    private = t.private_prompt("World", [PrivateRecord("Stocks fell.", "World")])
    assert private.endswith("News Type: World\nText: Stocks fell.\n\nNews Type: World\nText:")


# ---------------------------------------------------------------------------- a tiny real GPT-2


@pytest.mark.slow  # over 1.5 s: the full suite, not the unit layer
def test_end_to_end_on_a_tiny_gpt2(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    from dp_icl_plugin.backends.hf import HFBackend
    from dp_icl_plugin.ginc.language import symbol_names
    from dp_icl_plugin.ginc.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=50, n_positions=128, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    build_tokenizer(symbol_names(50), model_max_length=128).save_pretrained(tmp_path)
    backend = HFBackend.from_pretrained(tmp_path, device="cpu", dtype="float32")
    rng = np.random.default_rng(0)
    names = symbol_names(50)
    records = [PrivateRecord(" ".join(names[int(t)] for t in rng.integers(1, 50, size=9)), "c") for _ in range(40)]
    budget = _budget()
    method = PTASynthesizer(
        n_prompts=5,
        records_per_prompt=4,
        max_tokens=10,
        shots_per_label=2,
        top_k=10,
        epsilon=4.0,
        delta=1 / 40,
        alpha=1.5,
        template=PRESETS["ginc"],
    )
    demos = method.synthesize(
        PrivateDataset(records, public_label_counts={"c": 40}), backend=backend, budget=budget, rng=rng
    )
    assert len(demos) == 2 and all(len(d.token_ids) == 10 for d in demos)
    assert all(d.text == " ".join(names[t] for t in d.token_ids) for d in demos)
    assert budget.history()[0].event == method.event(PrivateDataset(records, public_label_counts={"c": 40}))


@pytest.mark.parametrize(
    ("q", "sigma", "steps"),
    [(20 / 1600, 0.72, 36), (0.1, 1.0, 36), (0.5, 2.0, 10), (1.0, 1.0, 1), (0.01, 0.5, 100), (0.3, 0.6, 5)],
)
def test_a_replacement_across_labels_is_covered_by_the_replace_one_charge(q: float, sigma: float, steps: int) -> None:
    """A swap that moves a record from label a to label b: the record in D and its replacement in D' share one
    coin (a coupling: an absent record's coin never affects its dataset), so token t of both runs is
    (1−q)N(0) + qN((u, 0)) against (1−q)N(0) + qN((0, w)) with independent noise per label, i.e. a removal in
    a's run beside an addition in b's: remove^T ⊗ add^T. ``tang_event`` charges the replace-one pair (centres
    ∓Δ) instead; dp-accounting's PLDs show the charge is at least the cross-label pair's ε (to the 1e-3
    discretisation)."""
    from dp_accounting import privacy_accountant
    from dp_accounting.pld import privacy_loss_distribution as pld

    relation = privacy_accountant.NeighboringRelation
    charged = pld.from_gaussian_mechanism(
        sigma, sampling_prob=q, neighboring_relation=relation.REPLACE_ONE, value_discretization_interval=1e-3
    ).self_compose(steps)
    one = pld.from_gaussian_mechanism(
        sigma, sampling_prob=q, neighboring_relation=relation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3
    )
    cross = pld.PrivacyLossDistribution(one._pmf_remove.self_compose(steps).compose(one._pmf_add.self_compose(steps)))
    for delta in (1e-3, 1e-5, 1e-7):
        assert charged.get_epsilon_for_delta(delta) >= cross.get_epsilon_for_delta(delta) - 1e-3
    # what a replace-one ledger charges for the run (std σ√2 over sensitivity √2: the same ratio) covers it too
    event = me.tang_event(noise_multiplier=sigma, sampling_rate=q, steps=steps)
    assert tightest().epsilon(event, delta=1e-5) >= cross.get_epsilon_for_delta(1e-5) - 1e-3
