"""A drop-in few-shot example selector that serves DP synthetic demonstrations.

Few-shot templates call ``select_examples`` on every format, so per-call private selection would spend
budget on every prompt. This selector serves a :class:`~dp_icl_plugin.methods.DemoSet` (DP already, so
serving and choosing among its demonstrations is free post-processing), or synthesizes one on first use,
charging the shared ledger exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.example_selectors import BaseExampleSelector

from dp_icl_plugin.accounting.budget import BudgetManager
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.methods import DemoSet, PrivateDataset, SynthesisMethod
from dp_icl_plugin.methods.data import Demonstration

__all__ = ["DPICLExampleSelector"]

DEMO_FIELDS = ("text", "label", "input")


class DPICLExampleSelector(BaseExampleSelector):
    """Few-shot examples from DP synthetic demonstrations, for ``FewShotPromptTemplate`` and
    ``FewShotChatMessagePromptTemplate``.

    Args:
        demos: a ready :class:`DemoSet` (no charge, ever), or None to synthesize lazily.
        synthesizer, dataset, backend, budget, rng: for lazy synthesis on the first selection (all
            required then; the budget is charged once, by the synthesizer, before any private record is read).
        fields: example-prompt variable → demonstration field (``text``, ``label`` or ``input``); the default
            ``{"input": "text", "output": "label"}``.
        k: how many examples to return (default: all), taken round-robin over labels.
        example_prompt: the template's example prompt, to check its variables here rather than at format time.
        embed: optional callable (texts → vectors); when given, the k demonstrations most similar to the
            query (``query_key`` of the input variables) are returned (post-processing of DP output).
        save_to: where to save a lazily synthesized DemoSet (JSONL), so that a restart reuses it.
        label_key: when set and present in the input variables, serve only the demonstrations of that label
            (e.g. the class a query is known to belong to, as in GINC's per-concept prompts).

    ``add_example`` refuses: an example added by the app is not differentially private, and mixing it into
    DP demonstrations without saying so would mislead. Use :meth:`add_public_example` for examples that are
    public by nature (they are served as given).
    """

    def __init__(
        self,
        demos: DemoSet | None = None,
        *,
        synthesizer: SynthesisMethod | None = None,
        dataset: PrivateDataset | None = None,
        backend: Any = None,
        budget: BudgetManager | None = None,
        rng: np.random.Generator | None = None,
        fields: Mapping[str, str] | None = None,
        k: int | None = None,
        example_prompt: Any = None,
        embed: Callable[[list[str]], Any] | None = None,
        query_key: str = "input",
        save_to: str | None = None,
        label_key: str | None = None,
    ) -> None:
        if fields is not None and not isinstance(fields, Mapping):
            raise ConfigurationError("fields must be a mapping of prompt variables to demonstration fields")
        self.fields = dict(fields) if fields is not None else {"input": "text", "output": "label"}
        bad = [f for f in self.fields.values() if f not in DEMO_FIELDS]
        if not self.fields or bad:
            raise ConfigurationError(f"fields must map prompt variables to {DEMO_FIELDS}; got {sorted(set(bad))}")
        if example_prompt is not None:
            needed = set(getattr(example_prompt, "input_variables", []))
            missing = needed - set(self.fields)
            if missing:
                raise ConfigurationError(f"the example prompt needs {sorted(missing)}, which fields does not provide")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigurationError("k must be a positive integer or None")
        if embed is not None and not callable(embed):
            raise ConfigurationError("embed must be a callable (texts -> vectors) or None")
        if save_to is not None and Path(save_to).is_dir():
            raise ConfigurationError("save_to must be a file path, not a directory")  # else it fails after the charge
        self.k = k
        self.embed = embed
        self.query_key = query_key
        self.save_to = save_to
        self.label_key = label_key
        self._public: list[dict[str, str]] = []
        self._lock = threading.Lock()
        if demos is not None:
            if not isinstance(demos, DemoSet):
                raise ConfigurationError("demos must be a DemoSet")
            self._demos: DemoSet | None = demos
        else:
            if synthesizer is None or dataset is None or backend is None:
                raise ConfigurationError("without demos, give synthesizer, dataset and backend to synthesize once")
            if not isinstance(synthesizer, SynthesisMethod):
                raise ConfigurationError("synthesizer must be a SynthesisMethod (e.g. TangSynthesizer)")
            if not isinstance(budget, BudgetManager):
                raise ConfigurationError("lazy synthesis needs budget=BudgetManager (the app's shared ledger)")
            if not isinstance(rng, np.random.Generator):
                raise ConfigurationError("lazy synthesis needs rng=numpy.random.Generator")
            self._demos = None
        self._lazy = (synthesizer, dataset, backend, budget, rng)

    def __repr__(self) -> str:
        state = "pending synthesis" if self._demos is None else f"{len(self._demos)} DP demonstrations"
        return f"DPICLExampleSelector({state}, k={self.k})"

    def __getstate__(self) -> dict[str, Any]:
        if self._demos is None:  # still holds the private dataset for its one synthesis
            raise TypeError("a selector that has not synthesized yet holds private records and cannot be pickled")
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def demos(self) -> DemoSet:
        """The DemoSet served (synthesized and charged once on first access when lazy)."""
        with self._lock:
            if self._demos is None:
                synthesizer, dataset, backend, budget, rng = self._lazy
                assert synthesizer is not None
                self._demos = synthesizer.synthesize(dataset, backend=backend, budget=budget, rng=rng)
                if self.save_to is not None:
                    self._demos.save(self.save_to)
                self._lazy = (None, None, None, None, None)  # drop the private records
            return self._demos

    def add_example(self, example: dict[str, str]) -> Any:
        raise ConfigurationError(
            "add_example would mix an example that is not differentially private into DP demonstrations; "
            "use add_public_example for examples that are public by nature"
        )

    def add_public_example(self, example: Mapping[str, str]) -> None:
        """Serve ``example`` (a public example with every prompt variable) after the DP demonstrations."""
        if not isinstance(example, Mapping) or set(example) != set(self.fields) \
                or not all(isinstance(v, str) for v in example.values()):  # fmt: skip
            raise ConfigurationError(f"a public example needs exactly the variables {sorted(self.fields)}")
        self._public.append(dict(example))

    def select_examples(self, input_variables: dict[str, str]) -> list[dict]:
        if not isinstance(input_variables, Mapping):
            raise ConfigurationError("input_variables must be a mapping of prompt variables to values")
        demos = list(self.demos)
        if self.label_key is not None and self.label_key in input_variables:
            demos = [d for d in demos if d.label == input_variables[self.label_key]]
        chosen = self._similar(demos, input_variables) if self.embed is not None else _round_robin(demos)
        if self.k is not None:
            chosen = chosen[: self.k]
        return [self._as_example(d) for d in chosen] + [dict(e) for e in self._public]

    def _as_example(self, demo: Demonstration) -> dict[str, str]:
        return {var: str(getattr(demo, name) or "") for var, name in self.fields.items()}

    def _similar(self, demos: Sequence[Demonstration], input_variables: Mapping[str, str]) -> list[Demonstration]:
        query = input_variables.get(self.query_key)
        if not isinstance(query, str):
            raise ConfigurationError(f"similarity selection needs the input variable {self.query_key!r}")
        assert self.embed is not None
        raw = self.embed([query] + [d.text for d in demos])
        try:
            vectors = np.asarray(raw, dtype=float)
        except (TypeError, ValueError):
            raise ConfigurationError("embed must return numbers") from None
        if vectors.ndim != 2 or len(vectors) != len(demos) + 1 or not np.all(np.isfinite(vectors)):
            raise ConfigurationError(f"embed must return {len(demos) + 1} finite vectors (one per text)")
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        order = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable")
        return [demos[i] for i in order]


def _round_robin(demos: Sequence[Demonstration]) -> list[Demonstration]:
    by_label: dict[str, list[Demonstration]] = {}
    for d in demos:
        by_label.setdefault(d.label, []).append(d)
    out: list[Demonstration] = []
    while any(by_label.values()):
        for label in list(by_label):
            if by_label[label]:
                out.append(by_label[label].pop(0))
    return out
