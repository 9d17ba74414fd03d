"""Greedy decoding over any :class:`NextTokenBackend` (for public steps such as a 0-shot answer or a prompt
built from released keywords, and for the per-shard answers that a DP aggregation then privatises)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np

from dp_icl_plugin._validation import positive_int
from dp_icl_plugin.backends.base import NextTokenBackend, Prompt, check_logprobs
from dp_icl_plugin.backends.public_rows import public_scope

__all__ = ["greedy_generate"]


def greedy_generate(
    backend: NextTokenBackend,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = ("\n",),
    public: bool = True,
) -> list[list[int]]:
    """The greedy continuation of each prompt (token ids), ending before EOS, a stop string, or the limit.

    Prompts share one incremental session, so each step costs one token per prompt. Public prompts are computed
    in the backend's public-rows scope: forwards of as many rows as there are prompts (the number is public),
    not a micro-batch of filler rows around a lone prompt.

    Args:
        backend: the model.
        prompts: the prompts.
        max_new_tokens: the most tokens of each continuation.
        stop: strings that end a continuation (not kept).
        public: the prompts are public, and a row the model gets wrong (NaN, +inf, nothing finite) is refused.
            False for the per-shard answers a DP aggregation privatises: such a row then gives whatever argmax
            picks (a shard's answer counts once either way), never an error whose raising would depend on a
            record.

    Returns:
        Each continuation's token ids.

    Raises:
        BackendError: with ``public``, a bad row.
    """
    limit = positive_int("max_new_tokens", max_new_tokens)
    eos = backend.eos_token_id
    outputs: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), dtype=bool)
    with public_scope(backend) if public else nullcontext():
        session = backend.start(prompts)
    with session:
        check = check_logprobs if public else np.asarray
        logprobs = check(session.logprobs)
        for step in range(limit):
            tokens = np.argmax(logprobs, axis=1)
            for i, token in enumerate(tokens.tolist()):
                if done[i]:
                    continue
                text = backend.decode([token])
                if token == eos or any(s in text for s in stop):
                    done[i] = True
                else:
                    outputs[i].append(token)
            if done.all() or step == limit - 1:
                break
            logprobs = check(session.append(tokens))
    return outputs
