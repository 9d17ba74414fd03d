"""Clip-blend synthesis (Bhusal et al., "Privacy-Aware In-Context Learning for Large Language Models", Algorithm 1).

For each label y, the records of D_y are dealt once, before decoding, to the ``shots_per_label``
demonstrations (:func:`assign_groups`); demonstration k is generated from its own group's prompts (one
record each, ``template.private_prompt(y, [record])``) and the public prompt. Per token (the mechanism is
:mod:`dp_icl_plugin.mechanisms.clip_blend_sampling`): clip every prompt's logits (eq. 2), average the private ones
with the fixed divisor s, blend with the public row, sample from softmax(ẑ/τ). The prompts never change, so
decoding runs on the backend's incremental session (one KV cache per prompt, cost linear in T, §1); stopping
at EOS or at the template's stop string is post-processing.

Privacy claim. Neighbouring relation: the ledger's (replace-one by default; add/remove is the paper's).
Everything the analysis holds fixed is public and fixed before any record is read: the divisor s (given,
or ⌊min_y n_y / K⌋) and the population size n_y of each label are the sizes the caller declares public
(``PrivateDataset(public_label_counts=...)``), never the observed counts. (Reading them from the data broke
the claim: with s = |D_y| and τ calibrated from it, D and D ∪ {x} used s = 100 and 101, and a token's
log-probabilities moved by 0.379 against a charged ε0 of 0.203.)

- Assignment. Each record of D_y independently draws a uniform v in [0, n_y) and joins group ⌊v/s⌋ when
  v < K·s (each of the K = ``shots_per_label`` groups with probability s/n_y), no group otherwise. A
  record's group depends on its own draw only: adding or removing a record changes exactly one group (or
  none) and leaves the others as they were; a random permutation cut into chunks, or a rate s/|D_y| read
  from the data, would let one record move others.
- One assignment. Fix the draws of the records common to D and D' and the differing record's own draw
  (a replacement takes the replaced record's draw). Under add/remove the two runs differ in at most one
  private prompt of one group; that group's demonstration is T adaptively composed tokens, each an
  exponential mechanism that is ε0-DP and ε0-bounded-range with ε0 = c/(sτ), because ẑ divides by the fixed
  s and so moves by at most c/(2s) per entry (Lemma 2). Under replace-one one prompt of one group is
  swapped: ẑ moves by c/s, ε0 = 2c/(sτ); if the label changes too, one group loses a prompt and a group of
  another label gains one, and token t of both demonstrations together is again 2·c/(sτ)-DP and
  -bounded-range. Every other demonstration, of this label or another (labels partition D), is computed
  from identical inputs with its own randomness: parallel composition.
- Mixture. Each record's draw is independent of the others', so the runs on D and D' are mixtures over
  the same draws with the same weights; hockey-stick divergences are jointly convex, so the (ε, δ) the
  accountant certifies for T tokens holds for the whole run:
  :func:`~dp_icl_plugin.accounting.method_events.clip_blend_event` with ``steps = max_tokens``, whatever
  ``shots_per_label`` and the number of labels. (Amplification by the draw is not used.)

The paper composes T tokens with advanced composition and keeps only its leading term, c·√(2T ln(1/δ))/(sτ)
(Theorem 1): not a valid bound when ε0 is not small. It is reported in the provenance as ``paper_epsilon``,
next to the guarantee (``epsilon``, the tightest valid accounting of the same event), never instead of it.
τ for a target ε is :func:`~dp_icl_plugin.accounting.calibration.calibrate_clip_blend_temperature`.

Per unit (a unit-level ledger, :mod:`~dp_icl_plugin.data.units`). Relation: the ledger's, over all records of one
unit. The *units* of D_y are dealt to the groups (each unit its own draw over [0, u_y), u_y the declared number of
units of y, ``public_unit_counts``), and a unit's prompt shows at most ``records_per_unit`` of its records, chosen
once for the run: one unit is one private prompt of one group, so ε0 = c/(sτ) (2c/(sτ) replace-one) per token as
for a record, whatever its size. A unit takes part in at most c_u = ``labels_per_unit`` labels' runs, so the event
is ``clip_blend_event`` over c_u × T tokens, tagged ``privacy_unit="unit"``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting import method_events as me
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.calibration import calibrate_clip_blend_temperature
from dp_icl_plugin.accounting.neighbouring import PER_RECORD
from dp_icl_plugin.backends.base import NextTokenBackend, Prompt, check_logprobs, context_limit
from dp_icl_plugin.backends.recompute import RecomputingSession as ReencodingSession
from dp_icl_plugin.backends.shared_rows import start_prefix_rows
from dp_icl_plugin.data.records import PrivateDataset
from dp_icl_plugin.data.units import label_elements, labels_charged, population, records_of
from dp_icl_plugin.errors import BackendError, ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.steps.clip_blend_step import ClipBlendStep, assign_groups
from dp_icl_plugin.steps.token_step import TokenStep
from dp_icl_plugin.synthesis.method import DemoSlot, Plan, SynthesisMethod, check_privacy_target
from dp_icl_plugin.templates.demonstration import PromptTemplate, format_fields
from dp_icl_plugin.templates.prompting import PromptIds

__all__ = [
    "PAPER_PROMPTS",
    "ClipBlendConfig",
    "ClipBlendSynthesizer",
    "DecodingSpeedup",
    "ReencodingSession",
    "measure_decoding_speedup",
]


def _label_only(name: str, fmt: object) -> str:
    if not isinstance(fmt, str) or not fmt.strip():
        raise ConfigurationError(f"{name} must be a non-empty format string")
    names = format_fields(fmt)
    if names - {"label"}:
        raise ConfigurationError(f"{name} may only use {{label}}, not {sorted(names - {'label'})}")
    return fmt


@dataclass(frozen=True)
class ClipBlendConfig:
    """Clip-blend synthesis settings (defaults: the paper's c = 10; App. B).

    Attributes:
        clip: c, the clipping threshold of eq. 2.
        subset_size: s, the fixed divisor of z̄ and the expected number of prompts per demonstration (the
            group of label y has expected size s·|D_y|/n_y); None (default) = ⌊min_y n_y / shots_per_label⌋
            over the declared public sizes n_y.
        max_tokens: T, tokens per demonstration; every record is charged T tokens (generation may stop
            earlier at EOS or at ``template.stop``).
        shots_per_label: K, demonstrations per label, each from its own disjoint group of records.
        temperature: τ itself, or None when ``epsilon`` is given.
        epsilon: target ε of the run (τ calibrated with the tightest accounting for the ledger's relation:
            ε0 = c/(sτ) under add/remove, 2c/(sτ) under replace-one), or None.
        delta: δ of the target and of the reported figures (default: the ledger's δ; without a ledger 1/min_y n_y).
        template: the private prompt layout: ``template.private_prompt(label, [record])``.
        public_prompt: a format string with ``{label}`` for the public prompt (App. F words it differently
            from the private one); None = ``template.public_prompt(label)``.

    Raises:
        ConfigurationError: a setting out of range, both or neither of ``epsilon`` and ``temperature``, or a
            bad template or public prompt.
    """

    clip: float = 10.0
    subset_size: int | None = None
    max_tokens: int = 100
    shots_per_label: int = 1
    temperature: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    template: PromptTemplate = field(default_factory=PromptTemplate)
    public_prompt: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip", check.positive_finite("clip", self.clip))
        for name in ("max_tokens", "shots_per_label"):
            check.positive_int(name, getattr(self, name))
        if self.subset_size is not None:
            check.positive_int("subset_size", self.subset_size)
        check_privacy_target(self.epsilon, self.delta, self.temperature, "temperature")
        if not isinstance(self.template, PromptTemplate):
            raise ConfigurationTypeError("template must be a PromptTemplate")
        if self.public_prompt is not None:
            _label_only("public_prompt", self.public_prompt)

    def public_text(self, label: str) -> str:
        """The public prompt for ``label`` (no private data).

        Args:
            label: the demonstration's label.
        """
        if self.public_prompt is None:
            return self.template.public_prompt(label)
        return self.public_prompt.format(label=label)


# App. F, Figs. 6–11, as plain text (the figures' "# [User]" / "# [Assistant]" turns are a chat layout;
# apply the model's chat template yourself for instruction-tuned models).
PAPER_PROMPTS: dict[str, dict[str, Any]] = {
    "agnews": {
        "template": PromptTemplate(
            header="Here are texts with News Type: {label}.\n\n",
            example="{text}\n\n",
            query="Please give me another one.\n\nText:",
        ),
        "public_prompt": "Generate only a text of news type {label}.\n\nText:",
    },
    "dbpedia": {
        "template": PromptTemplate(
            header="Here are entries of Category: {label}.\n\n",
            example="{text}\n\n",
            query="Please give me another one.\n\nEntry:",
        ),
        "public_prompt": "Generate only a wiki entry of Category {label}.\n\nText:",
    },
    "trec": {
        "template": PromptTemplate(
            header="Here are questions with Answer Type: {label}.\n\n",
            example="{text}\n\n",
            query="Please give me another one.\n\nQuestion:",
        ),
        "public_prompt": "Generate only a question with Answer Type {label}.\n\nQuestion:",
    },
}
"""The paper's prompts (App. F): ``ClipBlendSynthesizer(**PAPER_PROMPTS["agnews"], epsilon=1.0, ...)``."""


class ClipBlendSynthesizer(SynthesisMethod):
    """DP synthetic demonstrations by clip-blend decoding (Bhusal et al., Algorithm 1); see the module docstring.

    Example::

        # ≥ 4 × 255 records per label; each demonstration blends ~255 one-record prompts with the public one
        method = ClipBlendSynthesizer(epsilon=1.0, max_tokens=64, shots_per_label=4, subset_size=255)
        demos = method.synthesize(dataset, backend=backend, budget=budget, rng=np.random.default_rng())
        demos.provenance.extra["epsilon"], demos.provenance.extra["paper_epsilon"]

    ``synthesize_nonprivate`` decodes greedily (argmax ẑ, the τ → 0 limit) from the same groups: ε = ∞.
    """

    supports_privacy_units: ClassVar[bool] = True  # samples units per the ledger (module docstring)
    name: ClassVar[str] = "clip_blend"
    config_type: ClassVar[type] = ClipBlendConfig
    config: ClipBlendConfig

    # -- planning -----------------------------------------------------------------------------------
    def _plan(
        self,
        dataset: PrivateDataset,
        labels: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        c = self.config
        k = c.shots_per_label
        size = {y: population(dataset, y, privacy_unit) for y in labels}  # declared (public): never observed counts
        label = min(labels, key=size.__getitem__)
        smallest = size[label]
        what = "size" if privacy_unit == PER_RECORD else "number of units"
        if smallest < k:
            raise ConfigurationError(
                f"label {label!r} has declared {what} {smallest}; shots_per_label = {k} "
                "demonstrations need at least one element each"
            )
        s = c.subset_size if c.subset_size is not None else smallest // k
        if k * s > smallest:
            raise ConfigurationError(
                f"label {label!r} has declared {what} {smallest}; shots_per_label × subset_size = {k * s} need at "
                "least as many"
            )
        # each element sits in one group: it takes part in T tokens (parallel composition); a unit in one group of
        # each of the labels it keeps, T tokens in each
        steps = c.max_tokens * labels_charged(dataset, labels, privacy_unit)
        delta = self._target_delta(ledger_delta, 1.0 / smallest)
        if c.temperature is not None:
            tau, target = float(c.temperature), None
        else:
            assert c.epsilon is not None
            result = calibrate_clip_blend_temperature(
                epsilon=c.epsilon, delta=delta, clip=c.clip, subset_size=s, steps=steps, neighbouring=neighbouring
            )
            tau, target = result.value, result.epsilon
        event = me.clip_blend_event(clip=c.clip, subset_size=s, temperature=tau, steps=steps, neighbouring=neighbouring)
        token_epsilon = me.clip_blend_token_epsilon(
            clip=c.clip, subset_size=s, temperature=tau, neighbouring=neighbouring
        )
        # the paper's figure (add/remove, leading term of advanced composition) only beside the guarantee
        paper = me.clip_blend_paper_epsilon(clip=c.clip, subset_size=s, temperature=tau, steps=steps, delta=delta)
        params = {
            "subset_size": s,
            "temperature": tau,
            "steps": steps,
            "target_delta": delta,
            "calibrated_epsilon": target,
            "token_epsilon": token_epsilon,
            "epsilon": tightest().epsilon(event, delta=delta),
            "paper_epsilon": paper,
            "neighbouring": neighbouring,
            **self._unit_params(dataset, labels, privacy_unit),
        }
        return Plan(labels, event, params)

    def _public_probe(self, label: str) -> str:
        return self.config.public_text(label)

    def _capacity(self, backend: NextTokenBackend) -> int | None:
        """Longest prompt (tokens) that leaves room for T − 1 appended tokens; None = unlimited."""
        max_length = context_limit(backend)
        return None if max_length is None else max_length - self.config.max_tokens + 1

    def _preflight(self, plan: Plan, backend: NextTokenBackend) -> None:
        """Public checks: the context fits T tokens, and the backend's incremental session works."""
        super()._preflight(plan, backend)
        capacity = self._capacity(backend)
        if capacity is not None and capacity < 1:
            raise ConfigurationError(f"max_tokens = {self.config.max_tokens} does not fit the model's context")
        ids = _fit(backend.encode(self.config.public_text(plan.labels[0]), add_special_tokens=True), capacity)
        with backend.start([ids]) as session:
            first = check_logprobs(session.logprobs)
            if first.shape != (1, backend.vocab_size):
                raise BackendError(f"the session returned shape {first.shape}; expected (1, {backend.vocab_size})")
            if self.config.max_tokens > 1:
                check_logprobs(session.append(int(np.argmax(first[0]))))

    # -- generation ---------------------------------------------------------------------------------
    _stops_at_text: ClassVar[bool] = True

    def _demonstrations(
        self, dataset: PrivateDataset, plan: Plan, backend: NextTokenBackend, rng: np.random.Generator, *, private: bool
    ) -> Iterator[tuple[DemoSlot, AbstractContextManager[TokenStep]]]:
        c = self.config
        s = plan.params["subset_size"]
        tau = plan.params["temperature"] if private else None
        capacity = self._capacity(backend)
        unit = plan.params["privacy_unit"]
        elements = label_elements(dataset, plan.labels, unit, rng)  # records, or units' records (data.units)
        for label in plan.labels:
            members = elements[label]
            public = _fit(backend.encode(c.public_text(label), add_special_tokens=True), capacity)
            instruction = PromptIds(backend, c.template).instruction(label)  # public: computed once per label
            groups = assign_groups(
                len(members),
                population=population(dataset, label, unit),
                n_groups=c.shots_per_label,
                subset_size=s,
                rng=rng,
            )
            for group in groups:
                # one prompt per element: a record, or a unit's (at most records_per_unit) records, fixed for the run
                private_prompts = [
                    backend.encode(
                        c.template.private_prompt(label, records_of(members[int(i)], dataset.records_per_unit, rng)),
                        add_special_tokens=True,
                    )
                    for i in group
                ]
                prompts = [public] + [_fit(ids, capacity) for ids in private_prompts]
                yield (
                    DemoSlot(label),
                    _opened(backend, prompts, instruction, clip=c.clip, subset_size=s, temperature=tau),
                )


@contextmanager
def _opened(
    backend: NextTokenBackend,
    prompts: list[list[int]],
    instruction: list[int],
    *,
    clip: float,
    subset_size: int,
    temperature: float | None,
) -> Iterator[ClipBlendStep]:
    """One demonstration's session (the public prompt apart) and its step, closed when it is done."""
    with start_prefix_rows(backend, prompts, instruction, public=1) as session:
        yield ClipBlendStep(session, clip=clip, subset_size=subset_size, temperature=temperature)


def _fit(ids: list[int], capacity: int | None) -> list[int]:
    """Keep the last ``capacity`` tokens (the query survives; the oldest text goes, as in ``PromptIds``)."""
    return ids if capacity is None or len(ids) <= capacity else ids[-capacity:]


@dataclass(frozen=True)
class DecodingSpeedup:
    """Wall-clock seconds of the same decoding with the KV cache and by re-encoding, and their agreement.

    Attributes:
        cached_seconds: ``backend.start`` + appends.
        reencode_seconds: :class:`ReencodingSession` (every prompt re-encoded at every step).
        max_logprob_difference: largest |difference| of any next-token log-probability over all steps
            (finite entries; both must agree on which are −inf).
    """

    cached_seconds: float
    reencode_seconds: float
    max_logprob_difference: float

    @property
    def speedup(self) -> float:
        """How many times faster the cached decoding was (``inf`` when it took no measurable time)."""
        return self.reencode_seconds / self.cached_seconds if self.cached_seconds > 0 else math.inf


def measure_decoding_speedup(
    backend: NextTokenBackend, prompts: Sequence[Prompt], *, tokens: Sequence[int]
) -> DecodingSpeedup:
    """Time appending ``tokens`` (one at a time, to every prompt) with the cache and by re-encoding.

    The benchmark's measure of §1's efficiency claim: pass the prompts of one clip-blend demonstration
    (public first, then the private ones, e.g. as token ids) and a token sequence (e.g. a released
    demonstration's ``token_ids``). No sampling, no privacy cost by itself (the logits are not returned).

    Args:
        backend: the model.
        prompts: the demonstration's prompts, public first.
        tokens: the tokens to append, one at a time.

    Returns:
        Both timings and the largest difference of their log-probabilities.
    """
    appended = [int(t) for t in tokens]
    traces: list[list[np.ndarray]] = []
    seconds: list[float] = []
    for make in (backend.start, lambda p: ReencodingSession(backend, p)):
        start = time.perf_counter()
        with make(list(prompts)) as session:
            trace = [session.logprobs]
            trace += [session.append(t) for t in appended]
        seconds.append(time.perf_counter() - start)
        traces.append(trace)
    worst = 0.0
    for cached, reencoded in zip(*traces, strict=True):
        finite = np.isfinite(cached)
        if not np.array_equal(finite, np.isfinite(reencoded)):
            return DecodingSpeedup(seconds[0], seconds[1], math.inf)
        worst = max(worst, float(np.max(np.abs(cached[finite].astype(np.float64) - reencoded[finite]), initial=0)))
    return DecodingSpeedup(seconds[0], seconds[1], worst)
