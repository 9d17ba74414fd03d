"""AdaDPSyn (Gao et al., ICLR 2025): DP synthetic demonstrations with data-adaptive aggregation.

Per generated token, for label y (Gao et al., Algorithm 1 with Algorithm 3): draw M·N of the n_y
slots the records of D_y were placed in (n_y the declared public size; :func:`~.prompting.slot_placement`)
uniformly without replacement and cut them into M prompts of N (:func:`~.prompting.fixed_size_subsets`);
p_i = next-token distribution of prompt i restricted to V_pub = top-K of the public prompt's distribution
and renormalised (each token gets its own model probability, however small); aggregate p_1..p_M with
GoodRadius, a noisy mean, and up to T̂ coverage-checked projected means
(:func:`~dp_icl_plugin.mechanisms.adadpsyn_aggregation.release_token`); emit the argmax. Records and noise are drawn
afresh for every token from the one ``rng`` (the public code's seed reset inside the token loop, which
reuses the subset and the noise of the first token, is not repeated).

Privacy claim. Replace-one neighbours (D and D' differ in one record, text and label; |D| is the same). The records
of each label sit in n_y slots, n_y declared public (``PrivateDataset(public_label_counts=...)``) and never read
from the records (:func:`~.prompting.slot_placement`: a uniformly random arrangement; if a label has more records
than its declared size, a uniformly random n_y of them take part and nothing tells which case holds). A replacement
within label y changes the record in one slot of y's run; one that changes the label changes one slot of y's run
(emptied, or refilled by a record that had none) and one of y''s. Per token the M·N prompt slots are a uniform draw
without replacement from the n_y slots, and changing one slot changes at most one prompt, hence one p_i: the token's
release is an RDP mechanism of the draw made of 2⌈log2(√2/(2θ))⌉ GoodRadius queries (sensitivity 2, noise std 2σ0),
at most T̂ + 1 projected means (sensitivity 2R, std 2Rσ1) and at most T̂ coverage counts (sensitivity 1, std σ2).
Its RDP is amplified by sampling without replacement at γ_y = M·N/n_y (Wang, Balle & Kasiviswanathan 2019, Theorem
9; the paper's Theorem 7), composed over shots_per_label × T tokens and converted to (ε, δ) by the RDP accountant
(Balle et al. 2020): :func:`~dp_icl_plugin.accounting.method_events.adadpsyn_event` (App. B, Theorem 3). Labels
partition the data and generation for y reads only D_y, so a replacement within a label costs one label's run at γ =
M·N/min_y n_y; a replacement across labels touches two independent runs, whose RDP adds up: with two or more labels
generated, the event is two runs' worth (``labels_touched=2``), which the paper's analysis (label-preserving swaps
only, ``labels_touched=1``, what reproduces its σ1) omits. T tokens are charged even when a demonstration stops
early at EOS. σ1 for a target ε is the smallest on a 0.01 grid (``calibrate_adadpsyn``, what ``dp-icl calibrate
adadpsyn`` prints); δ defaults to 1/|D| (the paper; public under replace-one). There is no add/remove analysis: an
add/remove ledger refuses it.

Per unit (a unit-level ledger, :mod:`~dp_icl_plugin.data.units`). Relation: replace all records of one unit (the
number of units fixed). The *units* of D_y are placed in u_y slots (u_y the declared number of units of y,
``public_unit_counts``), M·N slots are drawn per token at γ_y = M·N/u_y, and a drawn unit puts at most
``records_per_unit`` of its records (drawn afresh) into its slot's prompt: a replacement changes one slot of each
run it touches, one p_i, with the sensitivities above. A unit takes part in at most c = ``labels_per_unit``
labels' runs, so a replacement touches at most min(2c, labels) runs (``labels_touched``) and δ's default is 1/Σ_y
u_y. The event is tagged ``privacy_unit="unit"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.calibration import calibrate_adadpsyn
from dp_icl_plugin.accounting.neighbouring import PER_RECORD
from dp_icl_plugin.backends.base import NextTokenBackend
from dp_icl_plugin.data.records import PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import Element, label_elements, labels_charged, population
from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.mechanisms.adadpsyn_aggregation import release_token
from dp_icl_plugin.mechanisms.gaussian_aggregation import restrict
from dp_icl_plugin.steps.aggregation_step import AggregationStep
from dp_icl_plugin.steps.token_step import TokenStep
from dp_icl_plugin.synthesis.method import DemoSlot, Plan, SynthesisMethod, check_privacy_target
from dp_icl_plugin.templates.demonstration import PromptTemplate
from dp_icl_plugin.templates.prompting import PromptIds, fixed_size_subsets, slot_placement

__all__ = ["AdaDPSynConfig", "AdaDPSynSynthesizer"]


@dataclass(frozen=True)
class AdaDPSynConfig:
    """AdaDPSyn's parameters (defaults: the paper's AG News setting, Table 13, with λ = 0.2).

    Attributes:
        n_prompts: M, prompts per token.
        records_per_prompt: N, records per prompt (M·N drawn without replacement per token).
        max_tokens: T (the paper's T_max), tokens per demonstration (all charged; generation may stop at EOS).
        shots_per_label: demonstrations generated per label (each costs T compositions).
        top_k: K, the public vocabulary's size.
        t_hat: T̂, the maximum number of radius-reduction rounds per token.
        sigma0: GoodRadius's noise multiplier (std 2σ0 on each score).
        sigma2: the coverage counts' noise std.
        theta: GoodRadius's tolerance θ (⌈log2(√2/(2θ))⌉ search steps).
        rho: the fraction ρ of prompts GoodRadius's ball should hold (t = ⌈ρM⌉; the paper's 0.8).
        mu: the coverage threshold μ (the paper's 0.55).
        lam: λ in the margin 2λRσ1√K/M (the paper searches {0.15, 0.2, 0.25}; Tables 13–17 use 0.1–0.35).
        epsilon: target ε of the whole run (σ1 calibrated), or None when ``sigma1`` is given.
        sigma1: the projected means' noise multiplier (std 2Rσ1 on the sum), instead of a target ε.
        delta: δ of the target (default: the ledger's δ; without a ledger 1/|D|, as in the paper).
        template: the prompt layout (public; see ``templates.PRESETS``).

    Raises:
        ConfigurationError: a setting out of range, both or neither of ``epsilon`` and ``sigma1``, or a
            bad template.
    """

    n_prompts: int = 10
    records_per_prompt: int = 2
    max_tokens: int = 100
    shots_per_label: int = 1
    top_k: int = 100
    t_hat: int = 1
    sigma0: float = 10.0
    sigma2: float = 3.0
    theta: float = 0.1
    rho: float = 0.8
    mu: float = 0.55
    lam: float = 0.2
    epsilon: float | None = None
    sigma1: float | None = None
    delta: float | None = None
    template: PromptTemplate = field(default_factory=PromptTemplate)

    def __post_init__(self) -> None:
        for name in ("n_prompts", "records_per_prompt", "max_tokens", "shots_per_label", "top_k", "t_hat"):
            check.positive_int(name, getattr(self, name))
        for name in ("sigma0", "sigma2", "theta"):
            check.positive_finite(name, getattr(self, name))
        for name in ("rho", "mu"):
            if not 0.0 < check.real(name, getattr(self, name)) <= 1.0:
                raise ConfigurationError(f"{name} must lie in (0, 1], got {getattr(self, name)!r}")
        check.non_negative_finite("lam", self.lam)
        check_privacy_target(self.epsilon, self.delta, self.sigma1, "sigma1")
        if not isinstance(self.template, PromptTemplate):
            raise ConfigurationTypeError("template must be a PromptTemplate")


class AdaDPSynSynthesizer(SynthesisMethod):
    """DP synthetic demonstrations by AdaDPSyn (Gao et al. 2025); the privacy claim is in the module docstring.

    Example::

        method = AdaDPSynSynthesizer(epsilon=1.0, lam=0.1, template=PRESETS["agnews"])
        demos = method.synthesize(dataset, backend=backend, budget=budget, rng=np.random.default_rng())
    """

    supports_privacy_units: ClassVar[bool] = True  # samples units per the ledger (module docstring)
    name: ClassVar[str] = "adadpsyn"
    config_type: ClassVar[type] = AdaDPSynConfig
    config: AdaDPSynConfig

    def _plan(
        self,
        dataset: PrivateDataset,
        labels: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        c = self.config
        me.require_replace_one("AdaDPSyn", neighbouring)
        rate, _, steps = self._sampling(dataset, labels, privacy_unit, drawn="are drawn without replacement per token")
        # a replacement empties one slot in each label the old record (unit) had and fills one in each the new has
        touched = min(2 * labels_charged(dataset, labels, privacy_unit), len(labels))
        # δ's default 1/|D| (the paper); per unit 1/(the declared units), |D| being no public count then
        size = len(dataset) if privacy_unit == PER_RECORD else sum(dataset.public_unit_count(y) for y in labels)
        delta = self._target_delta(ledger_delta, 1.0 / max(size, 1))
        if c.sigma1 is not None:
            sigma1, target = float(c.sigma1), None
        else:
            assert c.epsilon is not None
            result = calibrate_adadpsyn(
                epsilon=float(c.epsilon),
                delta=float(delta),
                sampling_rate=rate,
                steps=steps,
                t_hat=c.t_hat,
                sigma0=float(c.sigma0),
                sigma2=float(c.sigma2),
                theta=float(c.theta),
                labels_touched=touched,
            )
            sigma1, target = result.value, result.epsilon
        event = me.adadpsyn_event(
            sigma0=float(c.sigma0),
            sigma1=sigma1,
            sigma2=float(c.sigma2),
            sampling_rate=rate,
            steps=steps,
            t_hat=c.t_hat,
            theta=float(c.theta),
            labels_touched=touched,
        )
        params = {
            "sigma0": float(c.sigma0),
            "sigma1": sigma1,
            "sigma2": float(c.sigma2),
            "sampling_rate": rate,
            "steps": steps,
            "target_delta": delta,
            "calibrated_epsilon": target,
            "labels_touched": touched,
            "neighbouring": neighbouring,
            **self._unit_params(dataset, labels, privacy_unit),
        }
        return Plan(labels, event, params)

    def _demonstrations(
        self, dataset: PrivateDataset, plan: Plan, backend: NextTokenBackend, rng: np.random.Generator, *, private: bool
    ) -> Iterator[tuple[DemoSlot, AbstractContextManager[TokenStep]]]:
        c = self.config
        # private=False: the same computation with every noise multiplier (and so the margin) at 0
        sigmas = {name: plan.params[name] if private else 0.0 for name in ("sigma0", "sigma1", "sigma2")}
        ids = PromptIds(backend, c.template)

        def aggregate(rows: np.ndarray, vocabulary: np.ndarray, rng: np.random.Generator) -> int:
            # each prompt's own probabilities on V_pub, renormalised (a token it finds unlikely stays so)
            candidates = restrict(np.exp(rows[1:].astype(np.float64)), vocabulary, renormalize=True)
            release = release_token(
                candidates, t_hat=c.t_hat, theta=c.theta, rho=c.rho, mu=c.mu, lam=c.lam, rng=rng, **sigmas
            )
            return int(release.index)

        unit = plan.params["privacy_unit"]
        elements = label_elements(dataset, plan.labels, unit, rng)  # records, or units' records (data.units)
        for label in plan.labels:
            placement = slot_placement(len(elements[label]), population(dataset, label, unit), rng)

            def draw(
                rng: np.random.Generator,
                elements: Sequence[Element] = elements[label],
                placement: np.ndarray = placement,
            ) -> list[list[PrivateRecord]]:
                return fixed_size_subsets(
                    elements,
                    placement=placement,
                    n_prompts=c.n_prompts,
                    per_prompt=c.records_per_prompt,
                    rng=rng,
                    records_per_element=dataset.records_per_unit,
                )

            step = AggregationStep(
                backend, ids, label, draw=draw, base=False, top_k=c.top_k, top_p=None, aggregate=aggregate
            )
            for _ in range(c.shots_per_label):
                yield DemoSlot(label), nullcontext(step)
