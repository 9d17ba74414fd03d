"""The noise source of a component that releases DP output: an explicit ``numpy.random.Generator``.

Frameworks' users expect an optional ``seed``; a DP component must not default to a fixed one. So the
choice is: a Generator the caller owns (``rng``), a ``seed`` (reproducible noise: tests and benchmarks
only, since whoever knows the seed can subtract the noise), or neither: a fresh Generator seeded from the
operating system's entropy.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["noise_source"]


def noise_source(rng: object = None, seed: object = None) -> np.random.Generator:
    """``rng`` itself, ``numpy.random.default_rng(seed)``, or a fresh OS-seeded Generator (neither given)."""
    if rng is not None and seed is not None:
        raise ConfigurationError("give rng or seed, not both")
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationError("rng must be a numpy.random.Generator (or give seed=, an int)")
        return rng
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, Integral) or int(seed) < 0:
            raise ConfigurationError("seed must be a non-negative int")
        return np.random.default_rng(int(seed))
    return np.random.default_rng()
