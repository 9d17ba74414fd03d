"""What the synthesis methods that answer public inputs share: DPS-MOZO+Off (:mod:`.mozo_offline`) and Tang et al.'s
aggregation for answers (:mod:`.tang_answers`).

Such a method is given public, unlabeled inputs (PATE-style; Flemings et al. 2024, §4.2 and App. C) and generates a DP
output for each from the private records, which it draws from the whole dataset (labels partition nothing). Each
demonstration is the pair (public input, DP output): whatever is done with it afterwards is post-processing. Here:
the inputs' check, the plan's common checks (before any calibration), the public pre-flight through the backend,
and the demonstrations' shape.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from dp_icl_plugin import _validation as check
from dp_icl_plugin.accounting.neighbouring import PER_RECORD, REPLACE_ONE, check_relation
from dp_icl_plugin.backends.base import NextTokenBackend, check_logprobs, check_top_k
from dp_icl_plugin.data.records import Demonstration, PrivateDataset
from dp_icl_plugin.errors import BackendError, ConfigurationError, ConfigurationTypeError
from dp_icl_plugin.synthesis.demoset import DemoSet, Provenance
from dp_icl_plugin.synthesis.method import DemoSlot, Plan, SynthesisMethod
from dp_icl_plugin.templates.answer import AnswerTemplate

__all__ = ["PublicInputsMethod", "check_answer_settings", "check_public_inputs"]


def check_public_inputs(public_inputs: object) -> tuple[str, ...]:
    """A non-empty sequence of non-empty strings (public inputs; errors give positions only).

    Args:
        public_inputs: the public inputs.

    Raises:
        ConfigurationError: None, not a sequence of strings, empty, or an empty input.
    """
    if public_inputs is None:
        raise ConfigurationError("this method needs public_inputs=[...] (the public inputs to answer)")
    if isinstance(public_inputs, (str, bytes)) or not isinstance(public_inputs, Sequence):
        raise ConfigurationError("public_inputs must be a sequence of strings")
    result = tuple(public_inputs)
    if not result:
        raise ConfigurationError("public_inputs must not be empty")
    for i, text in enumerate(result):
        if not isinstance(text, str) or not text.strip():
            raise ConfigurationError(f"public input {i} is empty or not a string")
    return result


def check_answer_settings(template: object, demo_label: object) -> None:
    """The config fields every public-input method has: an answer layout and an optional fixed label.

    Args:
        template: the prompt layout (an :class:`~dp_icl_plugin.templates.answer.AnswerTemplate`).
        demo_label: every demonstration's ``label``, or None (the DP output is put there).

    Raises:
        ConfigurationError: ``template`` is not an AnswerTemplate, or ``demo_label`` not a string or None.
    """
    if not isinstance(template, AnswerTemplate):
        raise ConfigurationTypeError("template must be an AnswerTemplate")
    if demo_label is not None and not isinstance(demo_label, str):
        raise ConfigurationError("demo_label must be a string or None")


class PublicInputsMethod(SynthesisMethod):
    """A synthesis method that answers public inputs (see the module docstring).

    ``plan``, ``event``, ``synthesize`` and ``synthesize_nonprivate`` take the inputs as the keyword
    ``public_inputs`` (required); ``labels`` is refused (records are drawn from all of D). The config has a
    ``template`` (an :class:`~dp_icl_plugin.templates.answer.AnswerTemplate`), ``top_k`` and ``demo_label``.
    """

    labels_in_prompts: ClassVar[bool] = True  # a prompt holds its records' outputs ({label})
    _stops_at_text: ClassVar[bool] = True

    def _check_relation(self, neighbouring: str) -> str:
        """The ledger's relation, checked; a method that supports only some relations refuses the others here."""
        return check_relation(neighbouring)

    @abstractmethod
    def _plan_inputs(
        self,
        dataset: PrivateDataset,
        inputs: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        """The method's calibration and event for ``inputs`` (checked); the plan's params hold ``public_inputs``
        and ``privacy_unit``. Raise before any charge."""

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
        """Validated inputs, calibrated parameters and the event, without touching a backend (a target ε at the
        config's δ, else ``ledger_delta``, else the method's default).

        Args:
            dataset: the private records (only what the method declares public is read: see its module).
            labels: must be None.
            public_inputs: the public inputs to answer (required).
            neighbouring: the ledger's relation.
            ledger_delta: the ledger's δ.
            privacy_unit: the ledger's privacy unit (``"unit"``: units are drawn, as the method's module says).

        Raises:
            ConfigurationError: bad data or inputs, labels given, a relation the method does not support, or a
                setting the data cannot meet.
            CalibrationError: no noise meets the target ε.
        """
        if not isinstance(dataset, PrivateDataset):
            raise ConfigurationTypeError("dataset must be a PrivateDataset")
        if ledger_delta is not None:
            check.probability_open("ledger_delta", ledger_delta)
        relation = self._check_relation(neighbouring)
        if labels is not None:
            raise ConfigurationError(f"{self.name} draws records from the whole dataset; do not pass labels")
        inputs = check_public_inputs(public_inputs)
        unit = self._check_privacy_unit(dataset, privacy_unit)
        return self._tagged(self._plan_inputs(dataset, inputs, relation, ledger_delta, unit), unit)

    def _plan(
        self,
        dataset: PrivateDataset,
        labels: tuple[str, ...],
        neighbouring: str,
        ledger_delta: float | None,
        privacy_unit: str,
    ) -> Plan:
        raise ConfigurationError(f"{self.name} needs public inputs: call plan(dataset, public_inputs=[...])")

    def _check_saved(self, demos: DemoSet, path: Path, public_inputs: Sequence[str] | None) -> DemoSet:
        """The saved set, refused when it answers other inputs than ``public_inputs`` (its settings match: checked by
        :func:`~dp_icl_plugin.synthesis.method.load_saved`).

        Raises:
            ConfigurationError: the inputs differ, or none are given.
        """
        inputs = check_public_inputs(public_inputs)
        if [d.input for d in demos] != list(inputs):
            raise ConfigurationError(
                f"save_to {path} holds demonstrations for other public inputs than these: remove the file to "
                "synthesize for these, or point save_to elsewhere"
            )
        return demos

    def _provenance(
        self, plan: Plan, backend: NextTokenBackend, epsilon: float, delta: float, entry_id: int | None, label: str
    ) -> Provenance:
        provenance = super()._provenance(plan, backend, epsilon, delta, entry_id, label)
        extra = {k: v for k, v in provenance.extra.items() if k != "public_inputs"}  # they are in the demos
        extra["n_public_inputs"] = len(plan.params["public_inputs"])
        return Provenance(**{**provenance.to_dict(), "extra": extra})

    def _preflight(self, plan: Plan, backend: NextTokenBackend) -> None:
        """Public checks: every zero-shot prompt encodes, the model answers the first, top_k fits."""
        template = self.config.template
        prompts = [
            backend.encode(template.zero_shot_prompt(x), add_special_tokens=True) for x in plan.params["public_inputs"]
        ]
        for i, ids in enumerate(prompts):
            if not ids:
                raise ConfigurationError(f"the zero-shot prompt of public input {i} has no tokens")
        probe = check_logprobs(backend.next_token_logprobs([prompts[0]]))
        if probe.shape != (1, backend.vocab_size):
            raise BackendError(f"the backend returned shape {probe.shape}; expected (1, {backend.vocab_size})")
        check_top_k(self.config.top_k, backend)

    def _demonstration_count(self, plan: Plan) -> int:
        return len(plan.params["public_inputs"])

    def _demonstration(self, slot: DemoSlot, text: str, token_ids: tuple[int, ...]) -> Demonstration:
        label = self.config.demo_label if self.config.demo_label is not None else text
        return Demonstration(label=label, text=text, token_ids=token_ids, input=slot.input)
