"""What the audit cases share to draw outputs: a loop of one-output draws, and the public row that makes a token
rare under clip-blend.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dp_icl_plugin.mechanisms.clip_blend_sampling import blended_scores

__all__ = ["loop", "rare_token_public_row"]


def loop(draw: Callable[[np.random.Generator], int]) -> Callable[[int, np.random.Generator], np.ndarray]:
    """``(n, rng) -> n outputs``, each ``draw(rng)``.

    Args:
        draw: one output from the randomness.
    """
    return lambda n, rng: np.fromiter((draw(rng) for _ in range(n)), dtype=np.int64, count=n)


def rare_token_public_row(private: np.ndarray, *, clip: float, subset_size: int, temperature: float) -> np.ndarray:
    """The public row ``[0, push]`` with the smallest push on a grid of 401 in [0, 2c] that makes token 0 rare
    (P ≈ 0.02: a score gap of ln 50 at ``temperature``) against ``private`` rows under clip-blend.

    Args:
        private: the private rows, shape (n, 2).
        clip: c.
        subset_size: s.
        temperature: τ the rarity is tuned for.
    """
    push = 0.0
    for push in np.linspace(0, 2 * clip, 401):
        z = blended_scores(private, np.array([0.0, push]), clip=clip, subset_size=subset_size)
        if z[1] - z[0] >= math.log(50.0) * temperature:
            break
    return np.array([0.0, push])
