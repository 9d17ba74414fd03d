"""Prompts of the kNN DP-ICL paper (App. F for classification, App. G for question answering), overridable.

Every field is public text chosen by the app; demonstrations and the query are filled in at release time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["STOPWORDS", "AnswerPrompt", "ClassificationPrompt", "KeywordAnswerPrompt"]

# English function words that are never keywords (a shard answer's first keywords should carry content).
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "nor",
        "so",
        "yet",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "as",
        "into",
        "onto",
        "over",
        "under",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "it",
        "its",
        "it's",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "they",
        "them",
        "their",
        "he",
        "she",
        "his",
        "her",
        "we",
        "our",
        "you",
        "your",
        "i",
        "me",
        "my",
        "not",
        "no",
        "also",
        "very",
        "which",
        "who",
        "whom",
        "whose",
        "what",
        "when",
        "where",
        "why",
        "how",
        "than",
        "then",
        "too",
        "can",
        "could",
        "will",
        "would",
        "shall",
        "should",
        "may",
        "might",
        "must",
    ]
)


@dataclass(frozen=True)
class _TextFields:
    """A frozen set of public text fields, each checked to be a string."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise ConfigurationError(f"{type(self).__name__}.{f.name} must be a string")


@dataclass(frozen=True)
class ClassificationPrompt(_TextFields):
    """``Instruction: Classify each article into one of the following categories ...`` (App. F).

    The label is scored as the token that follows ``label_prefix`` (plus a space), so labels must start
    with distinct tokens.

    Attributes:
        instruction: the instruction, with ``{item}`` and ``{labels}`` (the labels joined by commas).
        item: what a record is called in the instruction.
        text_prefix: printed before each text.
        label_prefix: printed before each label.
        separator: between lines.

    Raises:
        ConfigurationError: a field is not a string.
    """

    instruction: str = "Classify each {item} into one of the following categories separated by comma: {labels}."
    item: str = "article"
    text_prefix: str = "Article:"
    label_prefix: str = "Class:"
    separator: str = "\n"

    def render(self, demos: Sequence[tuple[str, str]], query: str, labels: Sequence[str]) -> str:
        """The prompt: the instruction, one line per demonstration, then the query waiting for its label.

        Args:
            demos: (record text, record label) pairs.
            query: the public query.
            labels: the public label set.
        """
        head = "Instruction: " + self.instruction.format(item=self.item, labels=", ".join(labels))
        lines = [head] + [f"{self.text_prefix} {text}, {self.label_prefix} {label}" for text, label in demos]
        lines.append(f"{self.text_prefix} {query}, {self.label_prefix}")
        return self.separator.join(lines)


@dataclass(frozen=True)
class AnswerPrompt(_TextFields):
    """Question answering with demonstrations (App. G): ``Read the text: ... Answer the question ...``.

    Attributes:
        context_prefix: printed before each record's text.
        question_prefix: printed before the query.
        answer_prefix: printed before each answer, and last.
        separator: between lines.

    Raises:
        ConfigurationError: a field is not a string.
    """

    context_prefix: str = "Read the text:"
    question_prefix: str = "Answer the question with at most 4 words:"
    answer_prefix: str = "Do not provide a Yes/No answer:"
    separator: str = "\n"

    def render(self, demos: Sequence[tuple[str, str]], query: str) -> str:
        """``demos`` are (record text, record answer); the record text holds the context and question.

        Args:
            demos: (record text, record answer) pairs.
            query: the public question.
        """
        lines: list[str] = []
        for text, answer in demos:
            lines += [f"{self.context_prefix} {text}", f"{self.answer_prefix} {answer}"]
        lines += [f"{self.question_prefix} {query}", self.answer_prefix]
        return self.separator.join(lines)


@dataclass(frozen=True)
class KeywordAnswerPrompt(_TextFields):
    """The final, public prompt of keyword-space aggregation: only released keywords and the query.

    Attributes:
        instruction: the line with the keywords, with ``{keywords}`` (joined by commas).
        question_prefix: printed before the query.
        answer_prefix: printed last.
        separator: between lines.

    Raises:
        ConfigurationError: a field is not a string.
    """

    instruction: str = "Using the following keywords, answer the question concisely: {keywords}"
    question_prefix: str = "Question:"
    answer_prefix: str = "Answer:"
    separator: str = "\n"

    def render(self, keywords: Sequence[str] | None, query: str) -> str:
        """The keyword prompt, or the 0-shot prompt when no keywords were released.

        Args:
            keywords: the released keywords, or None.
            query: the public question.
        """
        lines = [] if keywords is None else [self.instruction.format(keywords=", ".join(keywords))]
        lines += [f"{self.question_prefix} {query}", self.answer_prefix]
        return self.separator.join(lines)
