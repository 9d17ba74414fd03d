"""Full-vocabulary log-probability rows from an inference server's top-k answer.

An OpenAI-compatible server answers ``logprobs=k`` with the k likeliest next tokens and their log-probabilities
(vLLM: keys ``"token_id:N"`` with ``return_tokens_as_token_ids``; ``logprobs=-1`` = every token). The methods
read full rows, so a top-k answer is completed here, from that row alone:

* every returned token keeps its log-probability (vLLM floors them at −9999: probability 0 in float32);
* the V − k missing tokens share the residual mass r = 1 − Σ_{returned} p evenly, each at most the smallest
  returned probability (no missing token can be likelier than a returned one): p_miss = min(r/(V − k), p_min);
  a missing token is never given probability 1, and gets the floor (e^−9999) only when r rounds to 0;
* the row is renormalised (log-sum-exp) so that it is a probability vector.

Privacy: the completed row is a deterministic function of one prompt's answer, so it is what a method's
analysis assumes of a row (a probability vector per prompt): the sensitivity bounds hold as for exact rows.
It only costs accuracy where a method reads tokens outside the top k (stated per method in the README).
Token ids the local tokenizer does not have (a padded embedding) are dropped before renormalising, as
:class:`~dp_icl_plugin.backends.hf.HFBackend` does.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from dp_icl_plugin.errors import ServerError

__all__ = ["FLOOR_LOGPROB", "full_row", "token_id"]

FLOOR_LOGPROB = -9999.0
"""vLLM's floor for a log-probability in JSON (−inf is not JSON)."""

_PREFIX = "token_id:"


def token_id(key: str) -> int:
    """The id in a ``"token_id:N"`` key; ServerError when the server sent token text instead.

    Args:
        key: a key of the server's top log-probabilities.

    Raises:
        ServerError: the key is not ``"token_id:N"``.
    """
    if not isinstance(key, str) or not key.startswith(_PREFIX):
        raise ServerError(
            "the server keyed log-probabilities by token text, not by id: it ignored "
            "return_tokens_as_token_ids (a vLLM-compatible server is required)"
        )
    try:
        return int(key[len(_PREFIX) :])
    except ValueError:
        raise ServerError("the server returned a malformed token id key") from None


def full_row(top: Mapping[str, float], vocab_size: int, *, complete: bool = False) -> np.ndarray:
    """A normalised float32 row of ``vocab_size`` log-probabilities from a server's top-k mapping; ``complete``:
    the answer must hold every token (full-vocabulary mode: a short answer is an error, never filled).

    Args:
        top: the server's ``{"token_id:N": log-probability}`` mapping.
        vocab_size: the row's width.
        complete: require every token of the vocabulary.

    Returns:
        The row; a row of NaN when the server's values are not log-probabilities (the caller judges it).

    Raises:
        ServerError: no entries, a malformed or repeated key, ids outside the vocabulary, or a short answer
            with ``complete``.
    """
    if not top:
        raise ServerError("the server returned no log-probabilities")
    ids = np.fromiter((token_id(k) for k in top), dtype=np.int64, count=len(top))
    if len(np.unique(ids)) < len(ids):
        raise ServerError("the server returned a token id twice")
    values = np.fromiter((_number(v) for v in top.values()), dtype=np.float64, count=len(top))
    if np.isnan(values).any() or (values > 1e-3).any():
        # the model's numerics failed on this prompt (NaN, null, or not a log-probability): a row of NaN, which the
        # caller judges (a public row is refused, a record's row stood in for); never an error of its own, whose
        # raising would depend on the prompt, a record's maybe
        return np.full(vocab_size, np.nan, dtype=np.float32)
    keep = ids < vocab_size
    if (ids < 0).any() or not keep.any():
        raise ServerError("the server returned token ids outside the tokenizer's vocabulary")
    ids, values = ids[keep], np.minimum(np.maximum(values[keep], FLOOR_LOGPROB), 0.0)
    row = np.full(vocab_size, np.nan)
    row[ids] = values
    missing = np.isnan(row)
    n_missing = int(missing.sum())
    if n_missing and complete:
        raise ServerError(
            f"asked for the full vocabulary, the server returned {vocab_size - n_missing} of "
            f"{vocab_size} tokens (a replica started without --max-logprobs -1?)"
        )
    if n_missing:
        residual = max(0.0, 1.0 - float(np.exp(values).sum()))
        bound = float(values.min())  # no missing token is likelier than the least likely returned one
        row[missing] = min(math.log(residual / n_missing), bound) if residual > 0 else FLOOR_LOGPROB
    top_value = float(row.max())
    return (row - (top_value + math.log(float(np.exp(row - top_value).sum())))).astype(np.float32)


def _number(value: object) -> float:
    """A returned log-probability as a float; NaN for anything that is not a real number (null, text, a bool, an
    integer too large for a float): the row is then judged by the caller, never raised on here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except (OverflowError, ValueError):
        return math.nan
