"""Greedy decoding over any :class:`NextTokenBackend` (for public steps such as a 0-shot answer or a prompt
built from released keywords, and for the per-shard answers that a DP aggregation then privatises)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.backends.base import NextTokenBackend, Prompt

__all__ = ["greedy_generate"]


def greedy_generate(
    backend: NextTokenBackend,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = ("\n",),
) -> list[list[int]]:
    """The greedy continuation of each prompt (token ids), ending before EOS, a stop string, or the limit.

    Prompts share one incremental session, so each step costs one token per prompt.
    """
    limit = check.positive_int("max_new_tokens", max_new_tokens)
    eos = backend.eos_token_id
    outputs: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), dtype=bool)
    with backend.start(prompts) as session:
        logprobs = session.logprobs
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
            logprobs = session.append(tokens)
    return outputs
