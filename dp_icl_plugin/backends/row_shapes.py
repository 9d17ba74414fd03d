"""Row isolation: forwards whose shapes never depend on what else is in the batch.

Every DP analysis here treats a row (a one-shot prompt's next-token distribution, a shard's answer, a
clip-blend prompt's logits) as a function of one record, and some rows (the zero-shot prompt, a public
prompt) as public. A batched forward breaks that when its *shape* depends on its batch-mates: the padding
width follows the longest row, the micro-batch size follows the number of rows, and kernels pick their
blocking (so their rounding) from the shape. Measured on SmolLM2-135M (``benchmarks/row_isolation.py``):
the same row moves by 3e-5 nats in float32 and by up to 0.5 nats in bfloat16 when a longer batch-mate
widens the padding, and by 4e-5 / 0.28 nats when only the number of rows changes; with a fixed
``(rows, width)`` shape the row is bit-identical whatever its batch-mates and their order, in both dtypes.

:class:`RowShapes` is the public policy that fixes every forward's shape from public settings and the
row's *own* length:

- **rows**: a forward of new width w has exactly ``rows_for(w)`` = clamp(``tokens`` // w, 1, ``rows``) rows;
  filler rows (one masked pad token) complete the last micro-batch of a group. The number of rows a call
  brings never reaches the shape: only public settings and the width, which comes from the row itself. Many
  rows for a one-token append (each forward reads every weight once: that is a decoding step's cost), few
  for a long prompt (its compute grows with rows × width, and fillers would double it: measured, Tang's
  step of 11 prompts spread over four width buckets took 2.9× as long with 8 rows in every forward).
- **new width** (tokens computed): a row's own token count rounded up to the next multiple of ``step``,
  strictly above it, so that every row has at least one masked column (transformers drops the attention
  mask, a different kernel path, when a whole batch is unpadded: a row must never decide that for another).
  A call's public suffix (the same tokens for every row) is used at its exact width.
- **past width** (cached keys and values): the first width of the ladder ``past_min``, ``past_min·growth``,
  ... strictly above the row's cached length (128, 512, 2048, ... by default): coarse, so that rows of
  different lengths share a forward (each forward reads every weight once, the dominant cost of a decoding
  step on a CPU; attention over masked keys is cheap next to it: measured, DPS-MOZO's zero-shot prefix and
  its records' prefixes fell in three power-of-two buckets and cost three forwards a token).

Rows with the same key form a group; a group goes in micro-batches of exactly ``rows`` rows. Nothing here
reads a token: keys come from lengths the row itself has. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dp_icl_plugin import _validation as check

__all__ = ["RowShapes", "micro_batches"]

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class RowShapes:
    """The public shape of every forward (see the module docstring).

    Attributes:
        rows: the most rows in a forward (filler rows complete a micro-batch); a forward of new width w has
            ``rows_for(w)`` rows.
        tokens: new tokens a forward aims at: ``rows_for(w)`` = clamp(tokens // w, 1, rows).
        step: new tokens are padded to the next multiple of ``step`` strictly above their count.
        past_min: cached positions are padded to the first of ``past_min·past_growth^k`` strictly above
            their count.
        past_growth: the ratio of that ladder (at least 2).

    Raises:
        ConfigurationError: a field is not a positive integer, or ``past_growth`` is below 2.
    """

    rows: int = 8
    tokens: int = 256
    step: int = 16
    past_min: int = 128
    past_growth: int = 4

    def __post_init__(self) -> None:
        check.positive_int("rows", self.rows)
        check.positive_int("tokens", self.tokens)
        check.positive_int("step", self.step)
        check.positive_int("past_min", self.past_min)
        check.int_at_least("past_growth", self.past_growth, 2)

    def rows_for(self, new_width: int) -> int:
        """Rows in a forward whose new tokens are ``new_width`` wide (public: from the width alone).

        Args:
            new_width: the padded width of the new tokens.
        """
        return max(1, min(self.rows, self.tokens // new_width))

    def new_width(self, n: int) -> int:
        """Padded width of ``n`` new tokens: the next multiple of ``step`` strictly above ``n``.

        Args:
            n: the number of new tokens.
        """
        return (n // self.step + 1) * self.step

    def past_width(self, n: int) -> int:
        """Padded width of ``n`` cached positions: the first rung of the ladder strictly above ``n``.

        Args:
            n: the number of cached positions.
        """
        width = self.past_min
        while width <= n:
            width *= self.past_growth
        return width


def micro_batches(keys: Sequence[Key], rows: Callable[[Key], int]) -> list[tuple[Key, list[int]]]:
    """Indices grouped by key (in order of first appearance), cut into chunks of at most ``rows(key)``.

    Each chunk becomes one forward of exactly ``rows(key)`` rows (the caller adds filler rows), so a row's
    forward has the same shape whichever rows share its key.

    Args:
        keys: each row's key (its forward shape).
        rows: the rows of a forward of that key.

    Returns:
        ``(key, row indices)`` per forward.
    """
    groups: dict[Key, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return [
        (key, members[start : start + rows(key)])
        for key, members in groups.items()
        for start in range(0, len(members), rows(key))
    ]
