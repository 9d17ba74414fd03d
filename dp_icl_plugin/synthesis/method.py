"""The shape every synthesis method shares: validate, describe the cost, charge, then compute.

A method is a frozen, validated config plus three calls:

- ``event(dataset, labels=None, neighbouring="replace_one")``: the exact privacy event a run on ``dataset``
  will charge under that neighbouring relation (its noise calibrated from the config's target for it),
  before anything runs;
- ``synthesize(dataset, labels=..., backend=..., budget=..., rng=...)`` (plus ``public_inputs=...`` for methods
  that answer public inputs): validates everything (a public
  pre-flight pass through the backend included), charges ``event`` for the budget manager's relation,
  and only then reads private records; returns a :class:`DemoSet`;
- ``synthesize_nonprivate(...)``: the same computation without noise or charge (ε = ∞), for baselines and
  tests only; its output is *not* differentially private.

Labels partition the private data (each record has one label, generation for label y reads only D_y), so a
run over several labels costs what the costliest label costs (parallel composition): ``event`` is the
event of the label with the smallest declared size. Label-conditioned methods size their sampling by the
sizes the caller declares public (``PrivateDataset(public_label_counts=...)``), never by the records.

Privacy units (``privacy_unit``, the ledger's: :mod:`~dp_icl_plugin.data.units`): under ``"unit"`` every method
samples units where it sampled records, sized by the declared unit counts (``public_unit_counts``), each drawn
unit putting at most ``records_per_unit`` of its records into one prompt; one unit then moves a step as one
record did. Labels no longer partition the units: a unit takes part in at most ``labels_per_unit`` = c labels'
generation, and the event composes c labels' runs (Tang, PTA and clip-blend multiply their steps by c; AdaDPSyn
counts the runs a replacement touches, min(2c, labels)).
The event is tagged ``privacy_unit="unit"``, and only a unit-level ledger holds it. A method opts in with
``supports_privacy_units``; one that does not is refused a unit-level ledger.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin._progress import progress_bar
from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.accountants import tightest
from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.accounting.neighbouring import PER_RECORD, REPLACE_ONE, check_relation
from dp_icl_plugin.backends.base import NextTokenBackend, check_logprobs, check_top_k
from dp_icl_plugin.data.records import Demonstration, PrivateDataset, PrivateRecord
from dp_icl_plugin.data.units import labels_charged, population, require_units
from dp_icl_plugin.errors import BackendError, ConfigurationError, ConfigurationTypeError, after_charge
from dp_icl_plugin.steps.token_step import TokenStep, decode_tokens
from dp_icl_plugin.synthesis.demoset import DemoSet, Provenance
from dp_icl_plugin.templates.prompting import check_records_encode, demonstration_text

__all__ = [
    "DemoSlot",
    "Plan",
    "SynthesisMethod",
    "check_backend",
    "check_privacy_target",
    "check_rng",
    "config_dict",
    "load_saved",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoSlot:
    """What a demonstration is generated for: a label (label-conditioned synthesis) or a public input (DPS-MOZO
    offline, whose label comes from its output unless configured).

    Attributes:
        label: the demonstration's label.
        input: the public input it answers, if any.
    """

    label: str
    input: str | None = None


@dataclass(frozen=True)
class Plan:
    """A run's resolved parameters: the labels, the calibrated values, the event it charges.

    Attributes:
        labels: the labels of the run.
        event: the privacy event the run charges.
        params: the calibrated parameters (recorded in the provenance).
    """

    labels: tuple[str, ...]
    event: ev.DPEvent
    params: dict[str, Any]


def check_privacy_target(epsilon: float | None, delta: float | None, noise: float | None, noise_name: str) -> None:
    """Exactly one of a target ``epsilon`` or an explicit noise parameter; δ in (0, 1) when given.

    Args:
        epsilon: the target ε, or None.
        delta: the target δ, or None.
        noise: the explicit noise parameter, or None.
        noise_name: the noise parameter's name, for the message.

    Raises:
        ConfigurationError: both or neither of ``epsilon`` and ``noise`` are given, or a value is out of range.
    """
    if (epsilon is None) == (noise is None):
        raise ConfigurationError(f"give either epsilon (the noise is calibrated) or {noise_name}, not both or neither")
    if epsilon is not None:
        check.positive_finite("epsilon", epsilon)
    if noise is not None:
        check.positive_finite(noise_name, noise)
    if delta is not None:
        check.probability_open("delta", delta)


def check_rng(rng: object) -> np.random.Generator:
    """``rng``, checked to be a ``numpy.random.Generator``.

    Args:
        rng: the object to check.

    Raises:
        ConfigurationError: it is not one.
    """
    if not isinstance(rng, np.random.Generator):
        raise ConfigurationTypeError("rng must be a numpy.random.Generator (e.g. numpy.random.default_rng())")
    return rng


def check_backend(backend: object) -> NextTokenBackend:
    """``backend``, checked to implement :class:`~dp_icl_plugin.backends.base.NextTokenBackend`.

    Args:
        backend: the object to check.

    Raises:
        ConfigurationError: it does not.
    """
    if not isinstance(backend, NextTokenBackend):
        raise ConfigurationTypeError(f"backend must implement NextTokenBackend, got {type(backend).__name__}")
    return backend


def config_dict(config: object) -> dict[str, Any]:
    """A JSON-ready view of a config dataclass (nested dataclasses become dicts).

    Args:
        config: a dataclass instance.

    Raises:
        TypeError: ``config`` is not a dataclass instance.
    """
    if not is_dataclass(config) or isinstance(config, type):
        raise TypeError("config_dict needs a dataclass instance")
    out = {}
    for f in fields(config):
        value = getattr(config, f.name)
        out[f.name] = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
    return out


class SynthesisMethod(ABC):
    """Base of the DP synthetic-demonstration methods; subclasses define ``_plan`` and ``_demonstrations`` (each
    demonstration's token step), and every method's tokens run through one loop, :meth:`_generate`."""

    name: ClassVar[str]
    config_type: ClassVar[type]
    config: Any
    labels_in_prompts: ClassVar[bool] = False  # whether a record's label enters its prompts (checked then too)
    #: whether the method samples units under a unit-level ledger (its ``_plan`` and ``_demonstrations`` honour
    #: ``privacy_unit``); a method that does not is refused one, never certified per unit on trust
    supports_privacy_units: ClassVar[bool] = False

    @property
    def step_rows(self) -> int | None:
        """Rows per forward that fit one token step's records, from the method's public settings, for a backend
        built for this method (``dp-icl synthesize``; as ``decoding.factory.step_rows`` for the decoders), or
        None to keep the backend's default. On a CPU a forward's filler rows cost real compute."""
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give each method a signature and docstring that list its settings (its config's fields), so that
        ``help(PTASynthesizer)`` and editors show them instead of ``**overrides``."""
        super().__init_subclass__(**kwargs)
        config_type = cls.__dict__.get("config_type")
        if not isinstance(config_type, type) or not is_dataclass(config_type):
            return
        params = [inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
        for f in fields(config_type):
            default = f.default if f.default is not MISSING else inspect.Parameter.empty
            if f.default_factory is not MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default))
        cls.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        settings = f"Settings: a ``{config_type.__name__}`` as ``config``, or its fields as keywords"
        cls.__doc__ = f"{cls.__doc__ or ''}\n\n    {settings} (see :class:`{config_type.__name__}`)."

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        """Take a config object, or its fields as keywords (validated by the config).

        Args:
            config: the method's config object.
            **overrides: the config's fields, when no ``config`` is given.

        Raises:
            ConfigurationError: both are given, ``config`` is of the wrong type, or the config refuses a field.
        """
        if config is not None and overrides:
            raise ConfigurationError("pass a config or keyword settings, not both")
        self.config = config if config is not None else self.config_type(**overrides)
        if not isinstance(self.config, self.config_type):
            raise ConfigurationError(f"config must be a {self.config_type.__name__}")

    # -- what subclasses provide ------------------------------------------------------------------
    @abstractmethod
    def _plan(
        self,
        dataset: PrivateDataset,
        labels: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        """Check the data against the config and calibrate for ``neighbouring`` per ``privacy_unit`` (at the
        config's δ, else ``ledger_delta``, else the paper's default: :meth:`_target_delta`); raise before any
        charge. The event is built record-level (:meth:`plan` tags it); a unit-level plan samples units
        (:meth:`_sampling`) and composes :func:`~dp_icl_plugin.data.units.labels_charged` labels' runs."""

    def _target_delta(self, ledger_delta: float | None, paper_default: float) -> float:
        """The δ a target ε is calibrated at: the config's, else the ledger's (the δ at which the ledger certifies
        the charge, so that ``epsilon=2`` charges 2), else the paper's default (a plan with no ledger)."""
        configured = self.config.delta
        if configured is not None:
            return float(configured)
        return float(ledger_delta) if ledger_delta is not None else paper_default

    @abstractmethod
    def _demonstrations(
        self, dataset: PrivateDataset, plan: Plan, backend: NextTokenBackend, rng: np.random.Generator, *, private: bool
    ) -> Iterator[tuple[DemoSlot, AbstractContextManager[TokenStep]]]:
        """Each demonstration's slot and its token step, in generation order (a generator: whatever a label or
        a demonstration draws from ``rng`` before its tokens is drawn when it comes up). ``private=False``: the
        same computation without noise (ε = ∞)."""

    #: whether a demonstration also ends once its text holds ``template.stop`` (else it runs to T tokens or EOS
    #: and is cut at the stop afterwards; either way post-processing)
    _stops_at_text: ClassVar[bool] = False

    def _demonstration_count(self, plan: Plan) -> int:
        return len(plan.labels) * int(self.config.shots_per_label)

    def _demonstration(self, slot: DemoSlot, text: str, token_ids: tuple[int, ...]) -> Demonstration:
        return Demonstration(label=slot.label, text=text, token_ids=token_ids, input=slot.input)

    def _generate(
        self,
        dataset: PrivateDataset,
        plan: Plan,
        backend: NextTokenBackend,
        rng: np.random.Generator,
        *,
        private: bool,
        progress: bool | None,
    ) -> list[Demonstration]:
        """The demonstrations: every method's tokens through one loop (:func:`~.token_steps.decode_tokens`),
        T tokens charged per demonstration whatever stops it; ``private=False`` runs the same computation
        without noise (ε = ∞)."""
        template = self.config.template
        max_tokens = int(self.config.max_tokens)
        eos = backend.eos_token_id if template.stop_at_eos else None
        stop = template.stop
        ends = None if stop is None or not self._stops_at_text else (lambda ids: stop in backend.decode(ids))
        total = self._demonstration_count(plan) * max_tokens
        bar = progress_bar(total, desc=f"{self.name} synthesis", unit="token", enabled=progress)
        demos = []
        for slot, opened in self._demonstrations(dataset, plan, backend, rng, private=private):
            with opened as step:
                generated = decode_tokens(
                    step, max_tokens=max_tokens, rng=rng, eos_token_id=eos, stop=ends, progress=bar
                )
            demos.append(self._demonstration(slot, demonstration_text(backend, generated, stop), tuple(generated)))
        bar.close()
        return demos

    def _preflight(self, plan: Plan, backend: NextTokenBackend) -> None:
        """Public checks through the backend (no private data): subclasses extend."""
        probe = check_logprobs(backend.next_token_logprobs([self._public_probe(plan.labels[0])]))
        if probe.shape != (1, backend.vocab_size):
            raise BackendError(f"the backend returned shape {probe.shape}; expected (1, {backend.vocab_size})")
        check_top_k(getattr(self.config, "top_k", None), backend)

    def _sampling(
        self, dataset: PrivateDataset, labels: tuple[str, ...], privacy_unit: str, *, drawn: str
    ) -> tuple[float, int, int]:
        """(q = M·N/n_y at the smallest declared size n_y, that size, steps = shots × tokens) for methods that
        draw M·N elements (records, or units: :func:`~dp_icl_plugin.data.units.population`) per token; ``drawn``
        says how, for the error when a label is too small."""
        c = self.config
        per_token = c.n_prompts * c.records_per_prompt
        size = {y: population(dataset, y, privacy_unit) for y in labels}  # declared sizes: public
        label = min(labels, key=size.__getitem__)
        smallest = size[label]
        what = "size" if privacy_unit == PER_RECORD else "number of units"
        if smallest < per_token:
            raise ConfigurationError(
                f"label {label!r} has declared {what} {smallest}; M·N = n_prompts × "
                f"records_per_prompt = {per_token} {drawn}"
            )
        return per_token / smallest, smallest, c.shots_per_label * c.max_tokens

    @staticmethod
    def _unit_params(dataset: PrivateDataset, labels: tuple[str, ...], privacy_unit: str) -> dict[str, Any]:
        """The plan parameters that state the privacy unit and the declared counts the sampling used (per unit,
        with the contribution bounds)."""
        if privacy_unit == PER_RECORD:
            return {"public_label_counts": {y: dataset.public_count(y) for y in labels}, "privacy_unit": PER_RECORD}
        return {
            "privacy_unit": privacy_unit,
            "public_unit_counts": {y: dataset.public_unit_count(y) for y in labels},
            "records_per_unit": dataset.records_per_unit,
            "labels_charged": labels_charged(dataset, labels, privacy_unit),
        }

    def _records_read(self, dataset: PrivateDataset, plan: Plan) -> list[PrivateRecord]:
        """The records a run may put in a prompt: those of the planned labels (MOZO offline: all of them)."""
        return [r for y in plan.labels for r in dataset.records(y)]

    def _public_probe(self, label: str) -> str:
        return str(self.config.template.public_prompt(label))

    # -- the public calls -------------------------------------------------------------------------
    def event(
        self,
        dataset: PrivateDataset,
        labels: Sequence[str] | None = None,
        *,
        public_inputs: Sequence[str] | None = None,
        neighbouring: str = REPLACE_ONE,
        ledger_delta: float | None = None,
        privacy_unit: str = PER_RECORD,
    ) -> ev.DPEvent:
        """The privacy event a run on ``dataset`` (for ``labels``, default all) charges under ``neighbouring``
        (calibrated at ``ledger_delta`` when the config names no δ: see :meth:`plan`).

        Args:
            dataset: the private records.
            labels: the labels to synthesize for (default all).
            public_inputs: for methods that answer public inputs (MOZO offline); the others refuse it.
            neighbouring: the ledger's relation.
            ledger_delta: the ledger's δ (see :meth:`plan`).
            privacy_unit: the ledger's privacy unit (see :meth:`plan`).

        Raises:
            ConfigurationError: bad data, labels or parameters.
        """
        return self.plan(
            dataset,
            labels,
            public_inputs=public_inputs,
            neighbouring=neighbouring,
            ledger_delta=ledger_delta,
            privacy_unit=privacy_unit,
        ).event

    def plan(
        self,
        dataset: PrivateDataset,
        labels: Sequence[str] | None = None,
        *,
        public_inputs: Sequence[str] | None = None,
        neighbouring: str = REPLACE_ONE,
        ledger_delta: float | None = None,
        privacy_unit: str = PER_RECORD,
    ) -> Plan:
        """Validated labels, calibrated parameters and the event under ``neighbouring`` per ``privacy_unit`` (the
        relation of the ledger it will be charged to), without touching a backend.

        Args:
            dataset: the private records (only declared, public sizes are read).
            labels: the labels to synthesize for (default all).
            public_inputs: for methods that answer public inputs (MOZO offline); the others refuse it.
            neighbouring: the ledger's relation.
            ledger_delta: the ledger's δ: a target ε is calibrated at it when the config names no δ, so that the
                charge the ledger certifies is the ε asked for (:meth:`synthesize` passes it; without it the
                paper's default δ, e.g. 1/min_y n_y, is used).
            privacy_unit: the ledger's privacy unit: ``"record"`` (default) or ``"unit"`` (every record names its
                unit; units are sampled and bounded, see the module docstring).

        Raises:
            ConfigurationError: bad data, labels or parameters.
        """
        if not isinstance(dataset, PrivateDataset):
            raise ConfigurationTypeError("dataset must be a PrivateDataset")
        relation = check_relation(neighbouring)
        unit = self._check_privacy_unit(dataset, privacy_unit)
        if public_inputs is not None:
            raise ConfigurationError(f"{self.name} does not take public_inputs")
        if ledger_delta is not None:
            check.probability_open("ledger_delta", ledger_delta)
        chosen = dataset.labels if labels is None else dataset.check_labels(labels)
        return self._tagged(self._plan(dataset, chosen, relation, ledger_delta, unit), unit)

    def _check_privacy_unit(self, dataset: PrivateDataset, privacy_unit: str) -> str:
        """``privacy_unit``, checked: a method that samples units, and every record naming its unit."""
        unit = require_units(dataset, privacy_unit)
        if unit != PER_RECORD and not self.supports_privacy_units:
            raise ConfigurationError(f"{self.name} does not sample privacy units: use a record-level ledger")
        return unit

    @staticmethod
    def _tagged(plan: Plan, privacy_unit: str) -> Plan:
        """``plan`` with its event stated per ``privacy_unit`` (the analysis is the same; see the module)."""
        if privacy_unit == PER_RECORD:
            return plan
        return Plan(plan.labels, ev.with_privacy_unit(plan.event, privacy_unit), plan.params)

    def check(
        self,
        dataset: PrivateDataset,
        *,
        backend: NextTokenBackend,
        labels: Sequence[str] | None = None,
        public_inputs: Sequence[str] | None = None,
        neighbouring: str = REPLACE_ONE,
        ledger_delta: float | None = None,
        privacy_unit: str = PER_RECORD,
    ) -> Plan:
        """Everything :meth:`synthesize` checks before its charge, charging nothing: the plan, the backend's
        public pre-flight and every record it may read encoded by the backend's tokenizer.

        Call it when the synthesis itself runs later, on someone's request (a lazy example selector): a record
        that cannot be encoded is then refused at set-up, in front of the data holder, not in front of
        whoever made the request, whose answer would otherwise depend on it without a charge.

        Args:
            dataset: the private records.
            backend: the model the synthesis will read.
            labels: the labels to synthesize for (default all).
            public_inputs: for methods that answer public inputs (MOZO offline); the others refuse it.
            neighbouring: the ledger's relation.
            ledger_delta: the ledger's δ (see :meth:`plan`).
            privacy_unit: the ledger's privacy unit (see :meth:`plan`).

        Raises:
            ConfigurationError: what :meth:`synthesize` would refuse before its charge.
            BackendError: the public pre-flight failed.
        """
        plan = self.plan(
            dataset,
            labels,
            public_inputs=public_inputs,
            neighbouring=neighbouring,
            ledger_delta=ledger_delta,
            privacy_unit=privacy_unit,
        )
        check_backend(backend)
        self._preflight(plan, backend)
        check_records_encode(backend, self._records_read(dataset, plan), with_labels=self.labels_in_prompts)
        return plan

    def synthesize(
        self,
        dataset: PrivateDataset,
        *,
        labels: Sequence[str] | None = None,
        public_inputs: Sequence[str] | None = None,
        backend: NextTokenBackend,
        budget: BudgetManager,
        rng: np.random.Generator,
        ledger_label: str | None = None,
        progress: bool | None = None,
        save_to: str | os.PathLike[str] | None = None,
    ) -> DemoSet:
        """Charge ``event`` to ``budget``, then generate the demonstrations; or, when ``save_to`` holds the set a
        previous run saved, serve it (DP output, paid for once: nothing is read or charged).

        Args:
            dataset: the private records.
            labels: the labels to synthesize for (default all).
            public_inputs: for methods that answer public inputs (MOZO offline); the others refuse it.
            backend: the model.
            budget: the ledger the run is charged to.
            rng: the randomness (sampling and noise).
            ledger_label: the ledger entry's label (default ``"<method>:synthesize"``).
            progress: show a progress bar (None: only when stderr is a terminal).
            save_to: a JSONL file (:meth:`DemoSet.save`) that keeps the set across restarts: read when it exists
                (it must come from this method), written after a synthesis.

        Returns:
            The demonstrations and their provenance.

        Raises:
            ConfigurationError: bad data, labels, backend or parameters (nothing charged).
            BudgetExhaustedError: the budget cannot afford the run (nothing charged).
            BackendError: the model failed in the public pre-flight (nothing charged).
            ReleaseFailedError: anything failed after the charge (the charge stands, nothing is released; one
                fixed error whatever failed, since its cause could depend on the private records).
        """
        if not isinstance(budget, BudgetManager):
            raise ConfigurationTypeError("budget must be a BudgetManager (every synthesis is charged to one)")
        if save_to is not None and Path(save_to).exists():
            return self._check_saved(load_saved(Path(save_to), self, budget), Path(save_to), public_inputs)
        check_rng(rng)
        plan = self.check(
            dataset,
            backend=backend,
            labels=labels,
            public_inputs=public_inputs,
            neighbouring=budget.neighbouring,
            ledger_delta=budget.budget.delta,
            privacy_unit=budget.privacy_unit,
        )
        label = ledger_label or f"{self.name}:synthesize"
        entry = budget.spend(plan.event, label=label)
        # anything failing from here on read private records: one fixed error
        demos = after_charge(lambda: self._generate(dataset, plan, backend, rng, private=True, progress=progress))
        epsilon = tightest().epsilon(plan.event, delta=budget.budget.delta)  # the event is under the ledger's relation
        made = DemoSet(demos, self._provenance(plan, backend, epsilon, budget.budget.delta, entry.id, label))
        if save_to is not None:
            try:
                made.save(save_to)
            except OSError as exc:  # DP output already paid for: returned, never lost to a full disk
                _log.warning("the DP demonstrations could not be saved to %s (%s); keep the returned set", save_to, exc)
        return made

    def synthesize_nonprivate(
        self,
        dataset: PrivateDataset,
        *,
        labels: Sequence[str] | None = None,
        public_inputs: Sequence[str] | None = None,
        backend: NextTokenBackend,
        rng: np.random.Generator,
        progress: bool | None = None,
        privacy_unit: str = PER_RECORD,
    ) -> DemoSet:
        """The same algorithm without noise and without a charge: ε = ∞, NOT differentially private.

        For the ε = ∞ rows of benchmarks and for tests. Never release its output.

        Args:
            dataset: the private records.
            labels: the labels to synthesize for (default all).
            public_inputs: for methods that answer public inputs (MOZO offline); the others refuse it.
            backend: the model.
            rng: the randomness.
            progress: show a progress bar (None: only when stderr is a terminal).
            privacy_unit: ``"unit"`` runs the unit-level computation (units sampled and bounded) without noise:
                the ceiling of a unit-level run, and what contribution bounding alone costs.

        Raises:
            ConfigurationError: bad data, labels, backend, rng or parameters.
            BackendError: the model failed.
        """
        check_rng(rng)
        plan = self.plan(dataset, labels, public_inputs=public_inputs, privacy_unit=privacy_unit)
        check_backend(backend)
        self._preflight(plan, backend)
        demos = self._generate(dataset, plan, backend, rng, private=False, progress=progress)
        return DemoSet(demos, self._provenance(plan, backend, math.inf, 0.0, None, "nonprivate"))

    def _check_saved(self, demos: DemoSet, path: Path, public_inputs: Sequence[str] | None) -> DemoSet:
        """``demos`` (saved at ``path``), checked to be the set this call asks for beyond the method's settings
        (a method that answers public inputs compares them); nothing here is charged.

        Raises:
            ConfigurationError: the saved set was made for something else.
        """
        return demos

    def _provenance(
        self, plan: Plan, backend: NextTokenBackend, epsilon: float, delta: float, entry_id: int | None, label: str
    ) -> Provenance:
        return Provenance(
            method=self.name,
            config=config_dict(self.config),
            epsilon=epsilon,
            delta=delta,
            event=plan.event.to_dict(),
            ledger_entry_id=entry_id,
            ledger_label=label,
            model_id=backend.model_id,
            extra=dict(plan.params),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


def load_saved(path: Path, synthesizer: SynthesisMethod | None, budget: BudgetManager | None) -> DemoSet:
    """The DemoSet a previous run saved at ``path``: DP output, served without a charge.

    Args:
        path: the file :meth:`DemoSet.save` wrote.
        synthesizer: the method it must come from (None: any).
        budget: the app's ledger; a warning when it holds no charge for the set (DP output may be served anywhere,
            but a file paid for elsewhere, or stale, is worth a word).

    Raises:
        ConfigurationError: the file is not a demonstration set, holds no DP output (made without a charge, or at
            ε = inf), or comes from another method or other settings than ``synthesizer``'s (a lower ε asked for
            would otherwise keep serving a looser set).
    """
    demos = DemoSet.load(path)
    made = demos.provenance
    if made.ledger_entry_id is None or not math.isfinite(made.epsilon):
        raise ConfigurationError(
            f"save_to {path} holds demonstrations made without a DP charge (epsilon={made.epsilon}); they are no "
            "DP output and are never served as one: remove the file or point save_to elsewhere"
        )
    entry = demos.provenance.ledger_entry_id
    if isinstance(budget, BudgetManager) and not any(
        e.id == entry and e.label == demos.provenance.ledger_label for e in budget.history()
    ):
        _log.warning(
            "save_to %s holds demonstrations whose charge (ledger entry %s, %r) is not in this app's "
            "ledger: served as saved (DP output), but check it is the set you meant",
            path,
            entry,
            demos.provenance.ledger_label,
        )
    method = getattr(synthesizer, "name", None)
    if method is not None and demos.provenance.method != method:
        raise ConfigurationError(
            f"save_to {path} holds demonstrations from {demos.provenance.method!r}, not from this synthesizer "
            f"({method!r}); remove the file or point save_to elsewhere"
        )
    if synthesizer is not None and json.loads(json.dumps(config_dict(synthesizer.config))) != made.config:
        raise ConfigurationError(
            f"save_to {path} holds demonstrations made with other settings than this synthesizer's (its epsilon, "
            "delta or another setting differs): remove the file to synthesize with these, or point save_to elsewhere"
        )
    _log.info("serving the %d DP demonstrations saved at %s (nothing synthesized or charged)", len(demos), path)
    return demos
