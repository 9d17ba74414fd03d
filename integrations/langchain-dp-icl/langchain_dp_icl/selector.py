"""A drop-in few-shot example selector that serves DP synthetic demonstrations.

Few-shot templates call ``select_examples`` on every format, so per-call private selection would spend
budget on every prompt. This selector serves a :class:`~dp_icl_plugin.DemoSet` (DP already, so
serving and choosing among its demonstrations is free post-processing), or synthesizes one, charging the shared
ledger exactly once: up front with :meth:`DPICLExampleSelector.prepare` (a progress bar on a terminal), or on
the first selection, which then logs a warning that it is synthesizing (minutes on a CPU) inside a prompt's
first ``format()``. Ranking by similarity to the query is LangChain's own
(``SemanticSimilarityExampleSelector`` or ``MaxMarginalRelevanceExampleSelector`` over an in-memory vector
store of the demonstrations), post-processing of DP output like any other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.example_selectors import (
    BaseExampleSelector,
    MaxMarginalRelevanceExampleSelector,
    SemanticSimilarityExampleSelector,
)
from langchain_core.prompts.chat import BaseChatPromptTemplate
from langchain_core.prompts.string import StringPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore

from dp_icl_plugin import (
    BudgetManager,
    ConfigurationError,
    ConfigurationTypeError,
    Demonstration,
    DemoSet,
    PrivateDataset,
    SynthesisMethod,
)
from dp_icl_plugin.adapters import embed_texts, load_saved, noise_source

_log = logging.getLogger(__name__)

__all__ = ["DPICLExampleSelector", "LazySynthesis"]

DEMO_FIELDS = ("text", "label", "input")
TEMPLATE_FORMATS = ("f-string", "jinja2")
_LABEL = "_dp_icl_label"  # the vector store's label metadata, apart from the example's own variables
_JINJA2_LITERAL = {ord("{"): "{{ '{' }}", ord("}"): "{{ '}' }}"}


def _template_format(explicit: str | None, example_prompt: Any) -> str | None:
    """How the examples will be formatted: ``"f-string"`` or ``"jinja2"`` where a ``FewShotPromptTemplate``
    joins them into its template (whose formatter would read a brace in a demonstration as a variable), None
    where a chat few-shot template inserts them as message values (nothing to escape)."""
    if explicit != "auto":
        if explicit is not None and explicit not in TEMPLATE_FORMATS:
            raise ConfigurationError(f"template_format must be one of {TEMPLATE_FORMATS}, None or 'auto'")
        return explicit
    if isinstance(example_prompt, BaseChatPromptTemplate):
        return None
    if isinstance(example_prompt, StringPromptTemplate):
        fmt = getattr(example_prompt, "template_format", "f-string")
        if fmt not in TEMPLATE_FORMATS:  # FewShotPromptTemplate formats f-string or jinja2 only
            raise ConfigurationError(
                f"the example prompt's template_format {fmt!r} is not one FewShotPromptTemplate "
                f"formats {TEMPLATE_FORMATS}"
            )
        return str(fmt)
    return "f-string"  # FewShotPromptTemplate's default


def _escaped(value: str, template_format: str | None) -> str:
    """``value`` as literal text in a template of ``template_format`` (unchanged for None)."""
    if template_format == "f-string":
        return value.replace("{", "{{").replace("}", "}}")
    if template_format == "jinja2":
        return value.translate(_JINJA2_LITERAL)
    return value


_LAZY = ("synthesizer", "dataset", "backend", "budget", "rng", "seed", "save_to")


@dataclass(frozen=True)
class LazySynthesis:
    """What a selector synthesizes its demonstrations from on its first selection: charged once to ``budget`` by
    ``synthesizer``, then reused (and saved to ``save_to`` when given, reused on restart without a second charge).

    Attributes:
        synthesizer: the DP synthesis method.
        dataset: the private records.
        backend: the language model.
        budget: the shared ledger.
        rng: the synthesis's noise source (default a fresh OS-seeded Generator).
        seed: a seed instead of ``rng`` (tests and benchmarks only).
        save_to: a file the demonstrations are saved to and reloaded from.
    """

    synthesizer: SynthesisMethod
    dataset: PrivateDataset
    backend: Any
    budget: BudgetManager
    rng: Any = None
    seed: int | None = None
    save_to: str | None = None


class DPICLExampleSelector(BaseExampleSelector):
    """Few-shot examples from DP synthetic demonstrations, for ``FewShotPromptTemplate`` and
    ``FewShotChatMessagePromptTemplate``.

    Args:
        demos: a ready :class:`DemoSet` (no charge, ever), or None to synthesize lazily.
        synthesizer, dataset, backend, budget: for lazy synthesis on the first selection (all required
            then; the budget is charged once, by the synthesizer, before any private record is read).
        rng, seed: the lazy synthesis's noise source (default a fresh OS-seeded Generator; a seed for tests
            and benchmarks only).
        fields: example-prompt variable → demonstration field (``text``, ``label`` or ``input``); the default
            ``{"input": "text", "output": "label"}``.
        k: how many examples to return (default: all).
        example_prompt: the template's example prompt, to check its variables here rather than at format time.
        embeddings: any embedder ``PrivateIndex`` takes (a LangChain ``Embeddings``, a SentenceTransformer, a
            LlamaIndex embedding, a callable on a list of texts); when given, demonstrations are ranked by
            similarity to the query (``query_key`` of the input variables) with LangChain's own selectors.
        selection: ``"similarity"`` (the default with ``embeddings``), ``"mmr"`` (maximal marginal
            relevance over ``fetch_k`` candidates) or ``"round_robin"`` over labels (the default without).
        fetch_k: candidates MMR re-ranks (default 20).
        save_to: where to save a lazily synthesized DemoSet (JSONL). When the file already exists (a restart),
            it is loaded and served instead: nothing is synthesized or charged again, and the private dataset
            is not kept. Its method must be the synthesizer's.
        template_format: how the examples are escaped. ``FewShotPromptTemplate`` joins the formatted examples
            into its own template, so a brace in a synthetic demonstration (``"{numPlayers}"``) would be read as
            a variable and fail every format after the synthesis was charged: ``"f-string"`` doubles braces,
            ``"jinja2"`` writes them as literals; None leaves values as they are (chat templates, which insert
            values without reading them). ``"auto"`` (the default) follows ``example_prompt``: a chat prompt
            means None, a string prompt its own format; without one, ``"f-string"``.
        label_key: when set and present in the input variables, serve only the demonstrations of that label
            (e.g. the class a query is known to belong to, as in GINC's per-concept prompts).

    ``add_example`` raises ``NotImplementedError`` (LangChain's word for a selector that takes no examples):
    an example added by the app is not differentially private, and mixing it into DP demonstrations without
    saying so would mislead. Use :meth:`add_public_example` for examples that are public by nature (they are
    served as given, after the DP ones).

    Instantiate:
        ```python
        from langchain_dp_icl import DPICLExampleSelector

        selector = DPICLExampleSelector(DemoSet.load("demos.jsonl"), k=4, embeddings=embeddings)
        prompt = FewShotPromptTemplate(example_selector=selector, example_prompt=example_prompt,
                                       suffix="Text: {input}\nLabel:", input_variables=["input"])
        ```
    """

    @classmethod
    def from_demos(cls, demos: DemoSet, **selection: Any) -> DPICLExampleSelector:
        """A selector over ready demonstrations (DP already: nothing is ever charged).

        Args:
            demos: the demonstrations.
            **selection: how examples are chosen and laid out (``k``, ``embeddings``, ``selection``, ``fields``,
                ``example_prompt``, ...; as the constructor).

        Returns:
            The selector.

        Raises:
            ConfigurationTypeError: ``demos`` is not a :class:`~dp_icl_plugin.DemoSet`.
            ConfigurationError: a lazy synthesis setting among ``selection``, or what the constructor refuses.
        """
        if not isinstance(demos, DemoSet):
            raise ConfigurationTypeError("demos must be a DemoSet")
        _selection_only(selection)
        return cls(demos, **selection)

    @classmethod
    def synthesizing(cls, lazy: LazySynthesis, **selection: Any) -> DPICLExampleSelector:
        """A selector that synthesizes its demonstrations on its first selection (checked now, charged then).

        Args:
            lazy: what to synthesize from.
            **selection: how examples are chosen and laid out (as :meth:`from_demos`).

        Returns:
            The selector.

        Raises:
            ConfigurationTypeError: ``lazy`` is not a :class:`LazySynthesis`.
            ConfigurationError: a lazy synthesis setting among ``selection``, or what the constructor refuses
                (nothing is charged).
        """
        if not isinstance(lazy, LazySynthesis):
            raise ConfigurationTypeError("lazy must be a LazySynthesis")
        _selection_only(selection)
        return cls(**{name: getattr(lazy, name) for name in _LAZY}, **selection)

    def __init__(
        self,
        demos: DemoSet | None = None,
        *,
        synthesizer: SynthesisMethod | None = None,
        dataset: PrivateDataset | None = None,
        backend: Any = None,
        budget: BudgetManager | None = None,
        rng: Any = None,
        seed: int | None = None,
        fields: Mapping[str, str] | None = None,
        k: int | None = None,
        example_prompt: Any = None,
        embeddings: Embeddings | None = None,
        selection: Literal["similarity", "mmr", "round_robin"] | None = None,
        fetch_k: int = 20,
        query_key: str = "input",
        save_to: str | None = None,
        label_key: str | None = None,
        template_format: Literal["f-string", "jinja2", "auto"] | None = "auto",
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
        if embeddings is not None and not isinstance(embeddings, Embeddings):
            embeddings = _AnyEmbeddings.of(embeddings)
        selection = selection or ("similarity" if embeddings is not None else "round_robin")
        if selection not in ("similarity", "mmr", "round_robin"):
            raise ConfigurationError("selection must be 'similarity', 'mmr' or 'round_robin'")
        if selection != "round_robin" and embeddings is None:
            raise ConfigurationError(f"selection {selection!r} needs embeddings")
        if isinstance(fetch_k, bool) or not isinstance(fetch_k, int) or fetch_k < 1:
            raise ConfigurationError("fetch_k must be a positive integer")
        if save_to is not None and Path(save_to).is_dir():
            raise ConfigurationError("save_to must be a file path, not a directory")  # else it fails after the charge
        self.template_format = _template_format(template_format, example_prompt)
        self.k = k
        self.embeddings = embeddings
        self.selection = selection
        self.fetch_k = fetch_k
        self._store: InMemoryVectorStore | None = None
        self.query_key = query_key
        self.save_to = save_to
        self.label_key = label_key
        self._public: list[dict[str, str]] = []
        self._lock = threading.Lock()
        if demos is not None:
            if not isinstance(demos, DemoSet):
                raise ConfigurationTypeError("demos must be a DemoSet")
            self._demos: DemoSet | None = demos
        elif save_to is not None and Path(save_to).exists():
            self._demos = load_saved(Path(save_to), synthesizer, budget)  # a restart: DP output already paid for
            synthesizer = dataset = backend = budget = rng = None
        else:
            if synthesizer is None or dataset is None or backend is None:
                raise ConfigurationError("without demos, give synthesizer, dataset and backend to synthesize once")
            if not isinstance(synthesizer, SynthesisMethod):
                raise ConfigurationTypeError("synthesizer must be a SynthesisMethod (e.g. TangSynthesizer)")
            if not isinstance(budget, BudgetManager):
                raise ConfigurationError("lazy synthesis needs budget=BudgetManager (the app's shared ledger)")
            # everything the synthesis checks before its charge, now: a bad record is refused here, at set-up,
            # not on a user's first request (whose answer would then depend on it, uncharged)
            synthesizer.check(
                dataset,
                backend=backend,
                neighbouring=budget.neighbouring,
                ledger_delta=budget.budget.delta,
                privacy_unit=budget.privacy_unit,
            )
            rng = noise_source(rng, seed)
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
        """The DemoSet served (synthesized and charged once on first access when lazy and not prepared)."""
        return self._synthesized(up_front=False)

    def prepare(self, *, progress: bool | None = None) -> DemoSet:
        """Synthesize the demonstrations now (one charge), before a chain formats its first prompt; a selector
        that has them already (given, saved, or prepared before) returns them without a charge. A synthesis that
        failed after its charge (``ReleaseFailedError``) is charged again if tried again.

        Args:
            progress: show the synthesis's progress bar (None: only when stderr is a terminal).

        Returns:
            The DemoSet served.

        Raises:
            BudgetExhaustedError: the budget cannot afford the synthesis (nothing charged).
            ReleaseFailedError: the synthesis failed after its charge (see ``SynthesisMethod.synthesize``).
        """
        return self._synthesized(up_front=True, progress=progress)

    def _synthesized(self, *, up_front: bool, progress: bool | None = None) -> DemoSet:
        with self._lock:
            if self._demos is None:
                synthesizer, dataset, backend, budget, rng = self._lazy
                assert synthesizer is not None
                if not up_front:
                    _log.warning(
                        "synthesizing DP demonstrations (%s) inside the first selection, so inside a prompt's first "
                        "format(): one charge, minutes on a CPU; call selector.prepare() before the chain runs",
                        synthesizer.name,
                    )
                self._demos = synthesizer.synthesize(
                    dataset, backend=backend, budget=budget, rng=rng, progress=progress
                )
                if self.save_to is not None:
                    self._demos.save(self.save_to)
                self._lazy = (None, None, None, None, None)  # drop the private records
            return self._demos

    def add_example(self, example: dict[str, str]) -> Any:
        raise NotImplementedError(
            "add_example would mix an example that is not differentially private into DP demonstrations; "
            "use add_public_example for examples that are public by nature"
        )

    def add_public_example(self, example: Mapping[str, str]) -> None:
        """Serve ``example`` (a public example with every prompt variable) after the DP demonstrations."""
        if (
            not isinstance(example, Mapping)
            or set(example) != set(self.fields)
            or not all(isinstance(v, str) for v in example.values())
        ):
            raise ConfigurationError(f"a public example needs exactly the variables {sorted(self.fields)}")
        self._public.append(dict(example))

    def select_examples(self, input_variables: dict[str, str]) -> list[dict]:
        if not isinstance(input_variables, Mapping):
            raise ConfigurationError("input_variables must be a mapping of prompt variables to values")
        if self.selection != "round_robin" and not isinstance(input_variables.get(self.query_key), str):
            # before self.demos: a lazy selector's first access charges the synthesis
            raise ConfigurationError(f"similarity selection needs the input variable {self.query_key!r}")
        demos = list(self.demos)
        label = input_variables.get(self.label_key) if self.label_key is not None else None
        if label is not None:
            demos = [d for d in demos if d.label == label]
        if self.selection == "round_robin":
            chosen = [self._as_example(d) for d in _round_robin(demos)][: self.k]
        else:
            chosen = self._ranked(input_variables, label, len(demos))
        return self._formatted(chosen + [dict(e) for e in self._public])

    def _as_example(self, demo: Demonstration) -> dict[str, str]:
        return {var: str(getattr(demo, name) or "") for var, name in self.fields.items()}

    def _formatted(self, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The examples escaped for :attr:`template_format` (see the class docstring)."""
        return [
            {k: _escaped(v, self.template_format) if isinstance(v, str) else v for k, v in e.items()} for e in examples
        ]

    def _ranked(self, input_variables: Mapping[str, str], label: str | None, available: int) -> list[dict]:
        """The k demonstrations nearest the query, ranked by LangChain's similarity or MMR selector."""
        if available == 0:  # the query was checked by select_examples
            return []
        store = self._vector_store()
        k = min(self.k or available, available)
        search: dict[str, Any] = {} if label is None else {"filter": lambda doc: doc.metadata[_LABEL] == label}
        settings: dict[str, Any] = {
            "vectorstore": store,
            "k": k,
            "input_keys": [self.query_key],
            "example_keys": list(self.fields),
            "vectorstore_kwargs": search,
        }
        if self.selection == "mmr":
            selector: BaseExampleSelector = MaxMarginalRelevanceExampleSelector(
                fetch_k=max(self.fetch_k, k), **settings
            )
        else:
            selector = SemanticSimilarityExampleSelector(**settings)
        return selector.select_examples(dict(input_variables))

    def _vector_store(self) -> InMemoryVectorStore:
        demos = self.demos  # outside the lock: the first access synthesizes under it
        with self._lock:
            if self._store is None:
                assert self.embeddings is not None
                store = InMemoryVectorStore(self.embeddings)
                docs = [Document(page_content=d.text, metadata={**self._as_example(d), _LABEL: d.label}) for d in demos]
                if docs:
                    store.add_documents(docs)
                self._store = store
            return self._store


class _AnyEmbeddings(Embeddings):
    """A SentenceTransformer, a LlamaIndex embedding or a callable as LangChain ``Embeddings`` (what it embeds
    here, DP demonstrations and queries, is public: batched as the embedder likes)."""

    def __init__(self, embedder: object) -> None:
        self._embedder = embedder

    @classmethod
    def of(cls, embedder: object) -> _AnyEmbeddings:
        if not any(
            callable(getattr(embedder, name, None)) for name in ("encode", "get_text_embedding_batch")
        ) and not callable(embedder):
            raise ConfigurationError(
                "embeddings must be a LangChain Embeddings, a SentenceTransformer, a LlamaIndex "
                "embedding or a callable taking a list of texts"
            )
        return cls(embedder)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in embed_texts(self._embedder, texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


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


def _selection_only(selection: Mapping[str, Any]) -> None:
    given = sorted(set(selection) & {*_LAZY, "demos"})
    if given:
        raise ConfigurationError(f"{', '.join(given)}: give them in the LazySynthesis (or the DemoSet), not here")
