"""Public answer choices: every answer token restricted to those that continue one of a public set of strings.

A classifier's labels, a router's desks, "yes"/"no": when the app already knows the possible answers, the
decoder need not spend budget on tokens that could never be one, and the answer cannot be a sentence the
app must parse. :class:`AnswerChoices` holds the choices as token sequences (a prefix tree); at every step
a decoder samples among the tokens that extend the answer so far towards a choice, and the answer ends when
it spells one.

**Privacy.** The choices are public (the caller declares them; they never come from the records), so the
support they leave is a public function of public inputs and the tokens released so far: restricting every
row, public and private, to it is the "public support" step each token mechanism already has (DPS-MOZO's
zero-shot top-k, eq. 2; clip-blend's vocabulary; expert decoding's top-k) and changes no sensitivity. Where
only one token can follow (``"ab"`` → ``"brev"`` → ``"iation"``), that token is a function of the public
tokens before it: it is emitted without running the mechanism and costs nothing. An answer therefore runs at
most :attr:`AnswerChoices.decisions` token mechanisms (the most steps with two or more possible tokens on
any choice's path, public), which is what it is charged and what a decoder's budget is calibrated for; it
has at most :attr:`AnswerChoices.max_tokens` tokens; ending early refunds nothing.

A choice is encoded as the tokenizer encodes the text alone (``add_special_tokens=False``), the way an
answer begins after a chat template's assistant header; with a completion template that ends in
``"Answer:"`` give the choices with their leading space (``" yes"``). When one choice's tokens begin
another's (``"Sport"``, ``"Sports"``), the shorter one ends with the model's end-of-sequence token, which
the model then needs to have (on a chat model whose end-of-turn token is another, such as Llama 3's
``<|eot_id|>``, that token is unlikely and the longer choice wins; prefer choices that are no prefix of
another). A choice the zero-shot row gives probability exactly 0 is outside DPS-MOZO's and expert decoding's
support (their public support has only tokens of positive zero-shot probability).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dp_icl_plugin.backends.base import NextTokenBackend, check_logprobs
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["AnswerChoices", "draw_among"]


def draw_among(draw: Callable[[np.ndarray], int], logprobs: np.ndarray, columns: np.ndarray) -> int:
    """A token mechanism run on a public support: ``draw`` sees every row restricted to ``columns`` (token ids,
    ascending) and its pick is mapped back to a token id; where one column alone is allowed, that token, with no
    mechanism run.

    A row with no finite entry on the columns (a model that gives every allowed token probability 0 after one
    record's prompt) would make a mechanism raise, and so make the release fail for that record alone: such a row
    becomes the uniform row (zeros) on those columns, a fixed map of the row itself, under which every mechanism's
    sensitivity holds as before. The public row is treated the same way (public).

    Args:
        draw: the mechanism: rows restricted to ``columns`` (shape (n, m)) → a column.
        logprobs: the step's rows, shape (n, V).
        columns: the allowed token ids, ascending.

    Returns:
        The token id drawn.
    """
    if columns.size == 1:
        return int(columns[0])
    rows = np.array(np.asarray(logprobs)[..., columns], dtype=np.float64)
    empty = ~np.isfinite(rows).any(axis=-1) & ~np.isnan(rows).any(axis=-1)
    rows[empty] = 0.0
    return int(columns[draw(rows)])


class AnswerChoices:
    """A public set of answers as token sequences; see the module.

    Args:
        backend: the model whose tokenizer encodes the choices.
        choices: two or more distinct, non-empty strings (public: never computed from private records).

    Raises:
        ConfigurationError: fewer than two choices, an empty or repeated one, one that encodes to no tokens, or
            one that is a token prefix of another on a model without an end-of-sequence token.
    """

    def __init__(self, backend: NextTokenBackend, choices: Sequence[str]) -> None:
        if isinstance(choices, str) or not isinstance(choices, Sequence):
            raise ConfigurationError("choices must be a list of strings (the public answers)")
        texts = list(choices)
        if len(texts) < 2 or not all(isinstance(c, str) and c for c in texts):
            raise ConfigurationError("choices must hold at least two non-empty strings")
        if len(set(texts)) != len(texts):
            raise ConfigurationError("choices must be distinct")
        self.texts = tuple(texts)
        self.eos_token_id = backend.eos_token_id
        encoded = []
        for text in texts:
            ids = tuple(int(t) for t in backend.encode(text, add_special_tokens=False))
            if not ids:
                raise ConfigurationError(f"the choice {text!r} encodes to no tokens")
            encoded.append(ids)
        if len(set(encoded)) != len(encoded):
            raise ConfigurationError("two choices encode to the same tokens")
        ended: list[tuple[int, ...]] = []
        for ids in encoded:
            if any(other[: len(ids)] == ids for other in encoded if len(other) > len(ids)):
                if self.eos_token_id is None:
                    raise ConfigurationError(
                        f"the choice {backend.decode(list(ids))!r} begins another and the model has no "
                        "end-of-sequence token to end it"
                    )
                ids = (*ids, int(self.eos_token_id))  # it ends only where the model ends it
            ended.append(ids)
        self.sequences = tuple(ended)
        self.decoded = tuple(backend.decode(list(ids)) for ids in encoded)  # as an answer's text would read
        self.max_tokens = max(len(s) for s in self.sequences)
        self.decisions = max(sum(len(self.allowed(s[:i])) > 1 for i in range(len(s))) for s in self.sequences)

    @classmethod
    def of(cls, backend: NextTokenBackend, choices: Sequence[str] | AnswerChoices) -> AnswerChoices:
        """``choices`` encoded by ``backend``'s tokenizer (an :class:`AnswerChoices` built for another model
        is encoded again from its texts).

        Args:
            backend: the model whose tokenizer encodes them.
            choices: the choices' texts, or an :class:`AnswerChoices`.

        Raises:
            ConfigurationError: as the constructor.
        """
        return cls(backend, choices.texts if isinstance(choices, AnswerChoices) else choices)

    def __repr__(self) -> str:
        return f"AnswerChoices({list(self.texts)!r})"

    def allowed(self, prefix: Sequence[int]) -> np.ndarray:
        """The token ids that extend ``prefix`` (the answer's tokens so far) towards a choice, ascending.

        Args:
            prefix: the answer's tokens so far.

        Raises:
            ConfigurationError: ``prefix`` is no choice's beginning, or already a whole choice.
        """
        at = tuple(int(t) for t in prefix)
        n = len(at)
        nxt = sorted({s[n] for s in self.sequences if len(s) > n and s[:n] == at})
        if not nxt:
            raise ConfigurationError(f"the tokens {list(at)} continue no choice")
        return np.asarray(nxt, dtype=np.int64)

    def complete(self, prefix: Sequence[int]) -> bool:
        """Whether ``prefix`` spells a whole choice (the answer ends there).

        Args:
            prefix: the answer's tokens so far.
        """
        return tuple(int(t) for t in prefix) in self.sequences

    def forced(self, prefix: Sequence[int]) -> int | None:
        """The one token that can follow ``prefix`` (public, free), or None where the mechanism decides.

        Args:
            prefix: the answer's tokens so far.

        Raises:
            ConfigurationError: as :meth:`allowed`.
        """
        allowed = self.allowed(prefix)
        return int(allowed[0]) if allowed.size == 1 else None

    def restrict(self, draw: Callable[[np.ndarray], int], logprobs: np.ndarray, prefix: Sequence[int]) -> int:
        """Run a token mechanism on the allowed columns only and map its pick back to a token id; where one
        token alone can follow, return it without running the mechanism (:meth:`forced`; :func:`draw_among`).

        Args:
            draw: the mechanism: takes rows restricted to the allowed columns (shape (n, m)), returns a column.
            logprobs: every row of the step, shape (n, V).
            prefix: the answer's tokens so far.

        Returns:
            The token id.

        Raises:
            ConfigurationError: as :meth:`allowed`.
        """
        return draw_among(draw, logprobs, self.allowed(prefix))

    def text_of(self, token_ids: Sequence[int]) -> str | None:
        """The choice that ``token_ids`` spell, or None.

        Args:
            token_ids: an answer's tokens.
        """
        at = tuple(int(t) for t in token_ids)
        for text, ids in zip(self.texts, self.sequences, strict=True):
            if ids == at:
                return text
        return None

    def greedy(self, backend: NextTokenBackend, prompt: Sequence[int]) -> str:
        """The most likely choice token by token for a public prompt (no private data): the zero-shot answer
        an app has without records, for comparison with a DP one.

        Args:
            backend: the model.
            prompt: the prompt's token ids.

        Returns:
            The choice's text.

        Raises:
            BackendError: the model returned a bad row.
        """
        tokens: list[int] = []
        while not self.complete(tokens):
            row = check_logprobs(backend.next_token_logprobs([list(prompt) + tokens]))[
                0
            ]  # public: a bad row is refused
            tokens.append(self.restrict(lambda rows: int(np.argmax(rows)), row, tokens))
        text = self.text_of(tokens)
        assert text is not None  # complete() holds
        return text
