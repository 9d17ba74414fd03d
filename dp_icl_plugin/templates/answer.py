"""The input→output prompt layout of DPS-MOZO and the decoders (:class:`AnswerTemplate`), and its presets.

Public text only: a template must not contain private data; a record enters a prompt only through ``{text}`` and
``{label}`` of :attr:`AnswerTemplate.example`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dp_icl_plugin.data.records import PrivateRecord
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.templates.demonstration import format_fields

__all__ = ["ANSWER_PRESETS", "AnswerTemplate"]


@dataclass(frozen=True)
class AnswerTemplate:
    """Format strings of MOZO's input→output prompts (public; they must not contain private data).

    Attributes:
        header: printed first in every prompt (an instruction and its separator); no fields.
        example: one private record as a demonstration: ``{text}`` is the record's input, ``{label}`` its
            output (e.g. a class name).
        query: the public input, using ``{input}``; the output is generated right after it.
        stop: text that ends an output once generated (generation stops; the text is cut there).
        stop_at_eos: end an output at the model's EOS token (off for GINC, whose delimiter is EOS).

    Raises:
        ConfigurationError: a field is not of its type, or a format string uses fields it may not.
    """

    header: str = ""
    example: str = "Text: {text}\nLabel: {label}\n\n"
    query: str = "Text: {input}\nLabel:"
    stop: str | None = "\n"
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        for name in ("header", "example", "query"):
            if not isinstance(getattr(self, name), str):
                raise ConfigurationError(f"template.{name} must be a string")
        if self.stop is not None and (not isinstance(self.stop, str) or not self.stop):
            raise ConfigurationError("template.stop must be a non-empty string or None")
        if not isinstance(self.stop_at_eos, bool):
            raise ConfigurationError("template.stop_at_eos must be a bool")
        if format_fields(self.header):
            raise ConfigurationError("template.header must not use fields")
        example = format_fields(self.example)
        if "text" not in example or example - {"text", "label"}:
            raise ConfigurationError("template.example must use {text} and may use {label}, nothing else")
        if format_fields(self.query) != {"input"}:
            raise ConfigurationError("template.query must use {input} and nothing else")

    def zero_shot_prompt(self, public_input: str) -> str:
        """The public prompt: header, then the public input.

        Args:
            public_input: the query.
        """
        return self.header + self.query.format(input=public_input)

    def one_shot_prompt(self, record: PrivateRecord | Sequence[PrivateRecord], public_input: str) -> str:
        """A private prompt: header, one record (or one unit's few records) as the example, then the public input.

        Args:
            record: the private record shown as the example, or one unit's records (each an example, in order).
            public_input: the query.
        """
        records = [record] if isinstance(record, PrivateRecord) else list(record)
        examples = "".join(self.example.format(text=r.text, label=r.label) for r in records)
        return self.header + examples + self.query.format(input=public_input)


ANSWER_PRESETS: dict[str, AnswerTemplate] = {
    # a record is (text, class name); the output is the class name, ended by the newline
    "classification": AnswerTemplate(),
    # GINC: a record's text is the 9-token input, its label the 1-token output; examples are delimited by
    # "/" as in the GINC prompts (the delimiter is also EOS, so EOS does not stop generation; use max_tokens=1)
    "ginc": AnswerTemplate(header="/ ", example="{text} {label} / ", query="{input}", stop=None, stop_at_eos=False),
    # the paper's prompts (Figures 5 and 7), outputs ended by the newline
    "e2e": AnswerTemplate(
        header="Please convert the structured data into natural language.\n",
        example="Input:\n{text}\nAnswer: {label}\n\n",
        query="Input:\n{input}\nAnswer:",
    ),
    "samsum": AnswerTemplate(
        example="Dialogue:\n{text}\nSummarize the above dialogue: {label}\n\n",
        query="Dialogue:\n{input}\nSummarize the above dialogue:",
    ),
    # a record is a question and its answer, the query the next question (retrievers' expert decoding)
    "question": AnswerTemplate(example="Question: {text}\nAnswer: {label}\n\n", query="Question: {input}\nAnswer:"),
}
"""Layouts for MOZO; pass ``template=ANSWER_PRESETS["classification"]`` or build your own."""
