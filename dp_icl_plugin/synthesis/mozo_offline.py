"""DPS-MOZO+Off (Flemings et al., App. C, Algorithm 3): DP outputs for public inputs, used as demonstrations.

The caller supplies public, unlabeled inputs (PATE-style, §4.2). For each one, DPS-MOZO (Algorithm 1,
:mod:`dp_icl_plugin.mechanisms.mozo_mixing`) generates an output token by token: per token, n_shots records are
drawn uniformly without replacement from the whole private dataset D, each gives a one-shot prompt (the
record as an input→output example, the public input, the output so far), the zero-shot prompt is the public
input and the output so far, and the token is sampled from the product of the mixed distributions. The
pairs (public input, DP output) are the demonstrations; anything done with them afterwards is free
(post-processing).

Privacy: replace-one neighbours only (|D| is then public; an add/remove ledger refuses it); each token is
(α, 4βα)-RDP, amplified by sampling n_shots of |D| records
without replacement (q = n_shots/|D|; Wang, Balle & Kasiviswanathan 2019, Thm 9), composed over every token
that can be generated, ``len(public_inputs) × max_tokens``
(:func:`~dp_icl_plugin.accounting.method_events.mozo_event`), converted with Balle et al. 2020; δ defaults to
1/|D|. Algorithm 3 line 6 divides the budget by n_test·T̃_max, but the tokens generated offline are
|D_pub|·T̃_max: we charge what is generated. β for a target ε is the largest meeting it
(:func:`~dp_icl_plugin.accounting.calibration.calibrate_mozo`). Records are drawn from all of D, so labels
partition nothing here.

Per unit (a unit-level ledger, :mod:`~dp_icl_plugin.data.units`): replace all records of one unit (the number of
units |U| fixed, so public). Per token n_shots *units* are drawn without replacement (q = n_shots/|U|), and each
drawn unit's one-shot prompt shows at most ``records_per_unit`` of its records (drawn afresh) as its examples:
one unit is one row, and the per-token bound holds whatever the row, so the event is ``mozo_event`` at that q,
tagged ``privacy_unit="unit"``; δ defaults to 1/|U|.

The per-token bound is the paper's (Theorem B.3), but its proof does not hold for the published mechanism
(a one-order Rényi ball and a normalised product; counterexamples in ``tests/test_mozo.py``). This method
therefore always releases through the *projected* mechanism (:func:`~dp_icl_plugin.mechanisms.mozo_mixing.
project_output`): the paper's λ_i and product, shrunk towards the public zero-shot centre until Hölder's
inequality proves D_α ≤ 4βα between any two datasets, so the same event accounts for it soundly. When the
paper's output already lies in that ball, the two release the same distribution.

Prompt layout (:class:`AnswerTemplate`, input→output, unlike the label→text synthesis templates)::

    {header}                          (instruction; public)
    {example}  one private record     Text: <record.text>\\nLabel: <record.label>\\n\\n
    {query}    the public input       Text: <public input>\\nLabel:<output generated so far>

The zero-shot prompt is ``header + query``; a one-shot prompt is ``header + example + query``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.calibration import calibrate_mozo
from dp_icl_plugin.accounting.neighbouring import PER_RECORD, REPLACE_ONE
from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.backends.shared_rows import public_suffix
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import all_elements
from dp_icl_plugin.errors import ConfigurationError, DPICLError
from dp_icl_plugin.mechanisms.mozo_mixing import LAMBDA_MAX
from dp_icl_plugin.steps.mozo_step import MozoStep
from dp_icl_plugin.steps.token_step import TokenStep
from dp_icl_plugin.synthesis.method import DemoSlot, Plan, check_privacy_target
from dp_icl_plugin.synthesis.public_inputs import PublicInputsMethod, check_answer_settings, check_public_inputs
from dp_icl_plugin.templates.answer import AnswerTemplate

__all__ = ["MozoOfflineConfig", "MozoOfflineSynthesizer", "check_public_inputs"]


@dataclass(frozen=True)
class MozoOfflineConfig:
    """DPS-MOZO+Off's settings (defaults: the paper's Table 4 and §4.1 where it has one).

    Attributes:
        n_shots: records drawn per token (one one-shot prompt each); q = n_shots/|D|.
        max_tokens: T̃_max, tokens per output (all charged; generation may stop early).
        top_k: k of the public top-k support of the zero-shot output.
        order: the Rényi order α the mixing constraint is fitted at (the paper: 14, 8, 5 for ε = 1, 2, 4).
        lambda_max: the upper limit of each λ_i.
        epsilon: target ε of the whole run (β calibrated), or None when ``beta`` is given.
        beta: target leakage β itself, instead of a target ε.
        delta: δ of the target (default: the ledger's δ; without a ledger 1/|D|).
        template: the prompt layout (see ``ANSWER_PRESETS``).
        demo_label: the ``label`` of every demonstration; None (default) puts the DP output there too,
            which is what a classification task wants (the output is the label).

    Raises:
        ConfigurationError: a setting out of range, both or neither of ``epsilon`` and ``beta``, or a bad
            template or ``demo_label``.
    """

    n_shots: int = 4
    max_tokens: int = 20
    top_k: int = 100
    order: float = 8.0
    lambda_max: float = LAMBDA_MAX
    epsilon: float | None = None
    beta: float | None = None
    delta: float | None = None
    template: AnswerTemplate = field(default_factory=AnswerTemplate)
    demo_label: str | None = None

    def __post_init__(self) -> None:
        for name in ("n_shots", "max_tokens", "top_k"):
            check.positive_int(name, getattr(self, name))
        object.__setattr__(self, "order", check.order("order", self.order))
        object.__setattr__(self, "lambda_max", check.positive_finite("lambda_max", self.lambda_max))
        check_privacy_target(self.epsilon, self.delta, self.beta, "beta")
        check_answer_settings(self.template, self.demo_label)


class MozoOfflineSynthesizer(PublicInputsMethod):
    """DP demonstrations for public inputs by DPS-MOZO (Flemings et al., Algorithm 3); see the module docstring.

    ``plan``, ``event``, ``synthesize`` and ``synthesize_nonprivate`` take the public inputs as the
    keyword ``public_inputs`` (required; ``labels`` is not used: records are drawn from all of D).

    Example::

        method = MozoOfflineSynthesizer(epsilon=2.0, order=8, max_tokens=5)
        demos = method.synthesize(dataset, public_inputs=["a public text", ...], backend=backend,
                                  budget=budget, rng=np.random.default_rng())
    """

    supports_privacy_units: ClassVar[bool] = True  # samples units per the ledger (module docstring)
    name: ClassVar[str] = "mozo_offline"
    config_type: ClassVar[type] = MozoOfflineConfig
    config: MozoOfflineConfig

    @property
    def step_rows(self) -> int:
        """``n_shots``: a token's one-shot prompts in one forward (its zero-shot row goes in one of its own);
        4 rows instead of the backend's default 8 took DPS-MOZO offline from 2.1× to 1.7× its floor
        (``benchmarks/decoding_floor.md``, from ``benchmarks/synthesis_floor.py``)."""
        return self.config.n_shots

    # -- planning -----------------------------------------------------------------------------------
    def _check_relation(self, neighbouring: str) -> str:
        """Replace-one only (|D| is then public): an add/remove ledger is refused."""
        me.require_replace_one("DPS-MOZO", neighbouring)
        return REPLACE_ONE

    def _plan_inputs(
        self,
        dataset: PrivateDataset,
        inputs: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        """β calibrated for ``inputs`` (a target ε at the config's δ, else ``ledger_delta``, else 1/|D|): per unit,
        units are drawn at q = n_shots/|U| (at most ``records_per_unit`` of a drawn unit's records in its prompt).

        Raises:
            ConfigurationError: ``n_shots`` above |D| (or |U|).
            CalibrationError: no β meets the target ε.
        """
        unit, c = privacy_unit, self.config
        # public: replace-one neighbours have the same number of records (per unit: of units)
        size = len(all_elements(dataset, unit))
        if c.n_shots > size:
            what = "records (q = n_shots/|D|" if unit == PER_RECORD else "units (q = n_shots/|U|"
            raise ConfigurationError(f"n_shots = {c.n_shots} exceeds the {size} {what} ≤ 1)")
        rate = c.n_shots / size
        steps = len(inputs) * c.max_tokens  # the tokens generated offline (Algorithm 3 writes n_test·T̃_max)
        delta = self._target_delta(ledger_delta, 1.0 / size)
        if c.beta is not None:
            beta, target = float(c.beta), None
        else:
            assert c.epsilon is not None
            result = calibrate_mozo(epsilon=c.epsilon, delta=delta, sampling_rate=rate, steps=steps, order=c.order)
            beta, target = result.value, result.epsilon
        event = me.mozo_event(beta=beta, order=c.order, sampling_rate=rate, steps=steps)
        params = {
            "beta": beta,
            "sampling_rate": rate,
            "steps": steps,
            "target_delta": delta,
            "calibrated_epsilon": target,
            "public_inputs": inputs,
            "neighbouring": REPLACE_ONE,
            "privacy_unit": unit,
        }
        if unit != PER_RECORD:
            params["records_per_unit"] = dataset.records_per_unit
        return Plan(dataset.labels, event, params)

    # -- generation ---------------------------------------------------------------------------------
    def _demonstrations(
        self, dataset: PrivateDataset, plan: Plan, backend: NextTokenBackend, rng: np.random.Generator, *, private: bool
    ) -> Iterator[tuple[DemoSlot, AbstractContextManager[TokenStep]]]:
        c = self.config
        elements = all_elements(dataset, plan.params["privacy_unit"])  # records, or units' records (data.units)
        inputs: tuple[str, ...] = plan.params["public_inputs"]
        for public_input in inputs:
            zero_shot = backend.encode(c.template.zero_shot_prompt(public_input), add_special_tokens=True)

            def one_shot(records: list[PrivateRecord], public_input: str = public_input) -> list[int]:
                return backend.encode(c.template.one_shot_prompt(records, public_input), add_special_tokens=True)

            step = MozoStep(
                backend,
                elements,
                records_per_element=dataset.records_per_unit,
                n_shots=c.n_shots,
                zero_shot=zero_shot,
                one_shot=one_shot,
                suffix=_public_suffix(backend, c.template, public_input, zero_shot),
                beta=plan.params["beta"] if private else None,
                order=c.order,
                top_k=c.top_k,
                lambda_max=c.lambda_max,
            )
            yield DemoSlot(label="", input=public_input), closing(step)  # its zero-shot session dropped


def _public_suffix(
    backend: NextTokenBackend, template: AnswerTemplate, public_input: str, zero_shot: list[int]
) -> list[int]:
    """The query part every row of a step may end with, from public inputs only: the zero-shot prompt against a
    one-shot prompt whose record is the public input itself (never a private record)."""
    probe = PrivateRecord(public_input, public_input)  # public text in a record's place
    try:
        ids = backend.encode(template.one_shot_prompt(probe, public_input), add_special_tokens=True)
    except DPICLError:  # the public probe does not encode: every row is sent whole
        return []
    return public_suffix(zero_shot, ids)
