"""How synthesis prompts are written: public parts from the developer, private parts from records.

The layout follows Tang et al. 2024 (Table 5), reused by PTA (Table 13) and AdaDPSyn::

    {instruction}               Given a label of news type, generate the chosen type of news accordingly.

    {example} per record        News Type: World
                                Text: <a private record>

    {query}                     News Type: World
                                Text:<generated tokens are appended here>

The public prompt S_pub is ``header + query`` (no record); PTA's base prompt is ``base`` followed by the
generated tokens only. Templates are format strings with ``{label}`` (and ``{text}`` in ``example``);
they are public and must not contain private data.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["PRESETS", "PromptTemplate", "format_fields"]


def format_fields(fmt: str) -> set[str]:
    """The ``{field}`` names of a format string; ConfigurationError if it is malformed.

    Args:
        fmt: a ``str.format`` string.

    Raises:
        ConfigurationError: ``fmt`` is malformed.
    """
    try:
        return {name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None}
    except ValueError as exc:
        raise ConfigurationError(f"bad format string: {exc}") from None


@dataclass(frozen=True)
class PromptTemplate:
    """Format strings of the synthesis prompts.

    Attributes:
        header: printed first in every prompt (the instruction and its separator); may use ``{label}``.
        example: one private record, using ``{text}`` and optionally ``{label}``.
        query: where the demonstration is generated; may use ``{label}``.
        base: PTA's base prompt before the generated tokens (no instruction, no private data); must not be
            empty, so that the first token has a context.
        stop: text that ends a demonstration once generated (post-processing; e.g. the blank line).
        stop_at_eos: end a demonstration at the model's EOS token (off for GINC, whose delimiter is EOS
            and may occur inside an example).

    Raises:
        ConfigurationError: a field is not a string, uses a field it may not, or leaves a required prompt empty.
    """

    header: str = ""
    example: str = "Label: {label}\nText: {text}\n\n"
    query: str = "Label: {label}\nText:"
    base: str = "Text:"
    stop: str | None = "\n\n"
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        for name in ("header", "example", "query", "base"):
            if not isinstance(getattr(self, name), str):
                raise ConfigurationError(f"template.{name} must be a string")
        if self.stop is not None and (not isinstance(self.stop, str) or not self.stop):
            raise ConfigurationError("template.stop must be a non-empty string or None")
        if "text" not in format_fields(self.example):
            raise ConfigurationError("template.example must contain {text}")
        for name in ("header", "query", "base"):
            extra = format_fields(getattr(self, name)) - {"label"}
            if extra:
                raise ConfigurationError(f"template.{name} may only use {{label}}, not {sorted(extra)}")
        if not self.base.strip():
            raise ConfigurationError("template.base must not be empty: the first token needs a context")
        if not (self.header + self.query).strip():
            raise ConfigurationError("the public prompt (header + query) must not be empty")

    def public_prompt(self, label: str) -> str:
        """S_pub: instruction and label, no private record.

        Args:
            label: the demonstration's label.
        """
        return self.header.format(label=label) + self.query.format(label=label)

    def private_prompt(self, label: str, records: Sequence[PrivateRecord]) -> str:
        """S_priv: instruction, the records as examples, then the query (a private string).

        Args:
            label: the demonstration's label.
            records: the records shown as examples.
        """
        examples = "".join(self.example.format(label=label, text=r.text) for r in records)
        return self.header.format(label=label) + examples + self.query.format(label=label)

    def base_prompt(self, label: str) -> str:
        """PTA's base prompt: what precedes the generated tokens without instruction or private data.

        Args:
            label: the demonstration's label.
        """
        return self.base.format(label=label)

    @classmethod
    def tang(cls, instruction: str, label_name: str) -> PromptTemplate:
        """The layout of Tang et al. 2024, Table 5: ``{label_name}: {label}`` then ``Text: ...``.

        Args:
            instruction: the instruction printed first (may be empty; no braces).
            label_name: what a label is called, e.g. ``"News Type"`` (no braces).

        Raises:
            ConfigurationError: an argument is empty or contains braces.
        """
        if not isinstance(label_name, str) or not label_name.strip() or "{" in label_name:
            raise ConfigurationError("label_name must be a non-empty string without braces")
        if not isinstance(instruction, str) or "{" in instruction or "}" in instruction:
            raise ConfigurationError("instruction must be a string without braces")
        header = instruction.strip() + "\n\n" if instruction.strip() else ""
        return cls(
            header=header,
            example=f"{label_name}: {{label}}\nText: {{text}}\n\n",
            query=f"{label_name}: {{label}}\nText:",
        )


PRESETS: dict[str, PromptTemplate] = {
    # Tang et al. 2024, Table 5 (PTA Table 13)
    "agnews": PromptTemplate.tang(
        "Given a label of news type, generate the chosen type of news accordingly.", "News Type"
    ),
    "dbpedia": PromptTemplate.tang(
        "Given a label of document type, generate the chosen type of document accordingly.", "Document Type"
    ),
    "trec": PromptTemplate.tang(
        "Given a label of answer type, generate a question based on the given answer type accordingly.",
        "Answer Type",
    ),
    "sst2": PromptTemplate.tang(
        "Given a label of sentiment type, generate the chosen type of movie review accordingly.", "Sentiment Type"
    ),
    # GINC (PTA App. F.9): no instruction; examples are token sequences separated by the delimiter "/".
    "ginc": PromptTemplate(header="/ ", example="{text} / ", query="", base="/", stop=None, stop_at_eos=False),
}
"""Templates of the papers' datasets; pass ``template=PRESETS["agnews"]`` or build your own."""
