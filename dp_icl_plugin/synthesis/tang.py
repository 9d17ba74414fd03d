"""Tang et al. 2024 (ICLR), DP few-shot generation: the Gaussian-aggregation baseline ("B1"; "BA2" with top-p).

Per generated token, for label y: Poisson-sample D_y at rate q_y = M·N/n_y (n_y the label's declared
public size, ``PrivateDataset(public_label_counts=...)``; never the observed count) and deal the sample to M
prompts S_priv^(i) (instruction, the records as examples, the label and the tokens generated so far); take
each prompt's next-token distribution restricted to V_pub = top-k (∩ top-p) of the public prompt's
distribution, renormalised; release argmax over V_pub of Σ_i p_i + N(0, 2σ²) (Tang et al. 2024;
Gao et al., Algorithms 2 and 3, restate it).

Privacy: each token is a Poisson-subsampled Gaussian mechanism (one record's presence moves one p_i: ℓ2
contribution √2, noise multiplier σ) at a fixed rate, and T × shots-per-label of them are composed
(:func:`~dp_icl_plugin.accounting.method_events.tang_event`). Neighbouring relation: the ledger's. Add/remove is
the papers' analysis; replace-one is analysed directly (the replaced record keeps the other's coin, prompt and
place: ``dp-accounting``'s replace-one pair; a replacement that moves a record between labels is a removal in one
run beside an addition in another, which that charge covers on every grid point checked numerically: see
:func:`~dp_icl_plugin.accounting.method_events.tang_event`). Labels partition the data, so the run costs the label
with the largest rate q = M·N/min_y n_y. σ for a target ε is the smallest on a 0.01 grid in [0.3, 3.0] (PTA App.
D.3), or in [3, 100] when none there fits (small labels), under the ledger's relation with the tightest accountant,
what ``dp-icl calibrate subsampled-gaussian`` prints (``--neighbouring add_remove --accountant prv`` gives PTA's
Table 4). The rate must not come from the observed counts: with |D_y| = M·N, adding a record would move q from 1 to
M·N/(M·N+1) and drop another record with probability ≈ 0.63, changing two rows. Unlike the public code of the
baseline (fixed-size subsets accounted as Poisson), records are Poisson-sampled here, the way they are accounted.
Noise is added only on V_pub's coordinates: the argmax over V_pub does not depend on the others (post-processing).

Per unit (a unit-level ledger, :mod:`~dp_icl_plugin.data.units`). Relation: add/remove or replace all records of
one unit (the ledger's). Per token the *units* of D_y are Poisson-sampled at q_y = M·N/u_y (u_y the declared
number of units of y, ``public_unit_counts``) and dealt to the M prompts; a drawn unit puts at most
``records_per_unit`` of its records, drawn afresh, into its one prompt. One unit then moves one p_i: ℓ2
sensitivity √2 as for a record, whatever its size. A unit takes part in at most c = ``labels_per_unit`` labels'
runs (default: every label generated), so the event is ``tang_event`` at q = M·N/min_y u_y over c × T ×
shots-per-label steps (c runs composed; replace-one pairs each removal with an addition, as across labels above),
tagged ``privacy_unit="unit"``; σ is calibrated for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.calibration import calibrate_subsampled_gaussian
from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import Element, label_elements, labels_charged, population
from dp_icl_plugin.errors import CalibrationError, ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.mechanisms.gaussian_aggregation import noisy_argmax, restrict
from dp_icl_plugin.steps.aggregation_step import AggregationStep
from dp_icl_plugin.steps.token_step import TokenStep
from dp_icl_plugin.synthesis.method import DemoSlot, Plan, SynthesisMethod, check_privacy_target
from dp_icl_plugin.templates.demonstration import PromptTemplate
from dp_icl_plugin.templates.prompting import PromptIds, poisson_prompts

__all__ = ["TangConfig", "TangSynthesizer", "tang_calibrated", "tang_noise"]


@dataclass(frozen=True)
class TangConfig:
    """Tang et al.'s generation (and the fields PTA shares).

    Attributes:
        n_prompts: M, prompts per token.
        records_per_prompt: N, expected records per prompt (q_y = M·N/|D_y|).
        max_tokens: T, tokens per demonstration (all charged; generation may stop early at EOS).
        shots_per_label: demonstrations generated per label (each costs T compositions).
        top_k: the public vocabulary's static limit k.
        top_p: the adaptive limit p ("BA2"/"PA2"), or None.
        epsilon: target ε of the whole run (σ calibrated for the ledger's relation), or None when
            ``noise_multiplier`` is given.
        delta: δ of the target (default: the ledger's δ; without a ledger 1/min_y n_y over the declared sizes, as in
            the papers).
        noise_multiplier: σ itself, instead of a target ε.
        template: the prompt layout (public; see ``templates.PRESETS``).

    Raises:
        ConfigurationError: a setting out of range, both or neither of ``epsilon`` and ``noise_multiplier``, or a
            bad template.
    """

    n_prompts: int = 10
    records_per_prompt: int = 2
    max_tokens: int = 100
    shots_per_label: int = 1
    top_k: int = 100
    top_p: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    noise_multiplier: float | None = None
    template: PromptTemplate = field(default_factory=PromptTemplate)

    def __post_init__(self) -> None:
        for name in ("n_prompts", "records_per_prompt", "max_tokens", "shots_per_label", "top_k"):
            check.positive_int(name, getattr(self, name))
        if self.top_p is not None and not 0 < check.real("top_p", self.top_p) <= 1:
            raise ConfigurationError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        check_privacy_target(self.epsilon, self.delta, self.noise_multiplier, "noise_multiplier")
        if not isinstance(self.template, PromptTemplate):
            raise ConfigurationTypeError("template must be a PromptTemplate")


def tang_noise(
    *,
    epsilon: float | None,
    noise_multiplier: float | None,
    delta: float,
    sampling_rate: float,
    steps: int,
    neighbouring: str,
) -> tuple[float, float | None]:
    """σ of Tang et al.'s aggregation: the config's ``noise_multiplier``, or the smallest on a 0.01 grid in
    [0.3, 3.0] (PTA App. D.3), else in [3, 100], that meets ``epsilon`` over ``steps`` tokens at ``delta`` (the
    tightest accountant, under ``neighbouring``).

    Args:
        epsilon: the target ε, or None when σ is given.
        noise_multiplier: σ itself, or None.
        delta: the target's δ.
        sampling_rate: q, each element's probability of joining a token's sample.
        steps: the tokens composed.
        neighbouring: the ledger's relation.

    Returns:
        ``(σ, the ε it reaches)``, the ε None when σ was given.

    Raises:
        CalibrationError: no σ in [0.3, 100] meets the target.
    """
    if noise_multiplier is not None:
        return float(noise_multiplier), None
    assert epsilon is not None
    common = {
        "epsilon": epsilon,
        "delta": delta,
        "sampling_rate": sampling_rate,
        "steps": steps,
        "neighbouring": neighbouring,
    }
    try:
        result = calibrate_subsampled_gaussian(**common)  # PTA's grid, [0.3, 3.0]
    except CalibrationError:  # a high rate (small labels) needs more noise than PTA's grid holds
        try:
            result = calibrate_subsampled_gaussian(**common, lo=3.0, hi=100.0)
        except CalibrationError:
            raise CalibrationError(
                f"no noise multiplier in [0.3, 100] meets epsilon={epsilon} at delta={delta} over {steps} "
                f"tokens at rate {sampling_rate:.3g}: use fewer tokens, fewer records per token, larger declared "
                "sizes or a larger epsilon"
            ) from None
    return result.value, result.epsilon


def tang_calibrated(
    epsilon: float | None,
    noise_multiplier: float | None,
    *,
    delta: float,
    sampling_rate: float,
    steps: int,
    neighbouring: str,
) -> tuple[ev.DPEvent, dict[str, Any]]:
    """The event of ``steps`` Tang tokens at σ (:func:`tang_noise`) and the plan's parameters that state it.

    Args:
        epsilon: the target ε, or None when σ is given.
        noise_multiplier: σ itself, or None.
        delta: the target's δ.
        sampling_rate: q.
        steps: the tokens composed.
        neighbouring: the ledger's relation.

    Raises:
        CalibrationError: no σ in [0.3, 100] meets the target.
    """
    sigma, target = tang_noise(
        epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        sampling_rate=sampling_rate,
        steps=steps,
        neighbouring=neighbouring,
    )
    event = me.tang_event(noise_multiplier=sigma, sampling_rate=sampling_rate, steps=steps, neighbouring=neighbouring)
    return event, {
        "noise_multiplier": sigma,
        "sampling_rate": sampling_rate,
        "steps": steps,
        "target_delta": delta,
        "calibrated_epsilon": target,
        "neighbouring": neighbouring,
    }


class TangSynthesizer(SynthesisMethod):
    """DP synthetic demonstrations by Gaussian aggregation (Tang et al. 2024); see the module docstring."""

    supports_privacy_units: ClassVar[bool] = True  # samples units per the ledger (module docstring)
    name: ClassVar[str] = "tang"
    config_type: ClassVar[type] = TangConfig
    config: TangConfig

    def _plan(
        self,
        dataset: PrivateDataset,
        labels: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        c = self.config
        rate, smallest, steps = self._sampling(
            dataset, labels, privacy_unit, drawn="need at least as many (q = M·N/n_y ≤ 1)"
        )
        steps *= labels_charged(dataset, labels, privacy_unit)  # a unit may take part in that many labels' runs
        delta = self._target_delta(ledger_delta, 1.0 / smallest)
        event, calibrated = tang_calibrated(
            c.epsilon, c.noise_multiplier, delta=delta, sampling_rate=rate, steps=steps, neighbouring=neighbouring
        )
        params = {**calibrated, **self._unit_params(dataset, labels, privacy_unit)}
        return Plan(labels, event, params)

    # -- one token ----------------------------------------------------------------------------------
    def _candidate_distributions(self, logprobs: np.ndarray, vocabulary: np.ndarray, has_base: bool) -> np.ndarray:
        """Tang et al.: each private distribution restricted to V_pub and renormalised."""
        private = logprobs[1 + has_base :]
        return restrict(np.exp(private.astype(np.float64)), vocabulary, renormalize=True)

    def _uses_base(self) -> bool:
        return False

    _clip_negative: ClassVar[bool] = False

    def _demonstrations(
        self, dataset: PrivateDataset, plan: Plan, backend: NextTokenBackend, rng: np.random.Generator, *, private: bool
    ) -> Iterator[tuple[DemoSlot, AbstractContextManager[TokenStep]]]:
        c = self.config
        sigma = plan.params["noise_multiplier"] if private else 0.0
        ids = PromptIds(backend, c.template)
        base = self._uses_base()

        def aggregate(rows: np.ndarray, vocabulary: np.ndarray, rng: np.random.Generator) -> int:
            candidates = self._candidate_distributions(rows, vocabulary, base)
            return noisy_argmax(candidates, noise_multiplier=sigma, rng=rng, clip_negative=self._clip_negative)

        unit = plan.params["privacy_unit"]
        elements = label_elements(dataset, plan.labels, unit, rng)  # records, or units' records (data.units)
        for label in plan.labels:
            rate = c.n_prompts * c.records_per_prompt / population(dataset, label, unit)  # a fixed, declared size

            def draw(
                rng: np.random.Generator, elements: Sequence[Element] = elements[label], rate: float = rate
            ) -> list[list[PrivateRecord]]:
                return poisson_prompts(
                    elements,
                    sampling_rate=rate,
                    n_prompts=c.n_prompts,
                    rng=rng,
                    records_per_element=dataset.records_per_unit,
                )

            step = AggregationStep(
                backend, ids, label, draw=draw, base=base, top_k=c.top_k, top_p=c.top_p, aggregate=aggregate
            )
            for _ in range(c.shots_per_label):
                yield DemoSlot(label), nullcontext(step)
