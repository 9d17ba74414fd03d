"""The noise source of a component that releases DP output: an explicit ``numpy.random.Generator``.

Frameworks' users expect an optional ``seed``; a DP component must not default to a fixed one. So the
choice is: a Generator the caller owns (``rng``), a ``seed`` (reproducible noise: tests and benchmarks
only, since whoever knows the seed can subtract the noise), or neither: a fresh Generator seeded from the
operating system's entropy.

**Across fork().** A pre-forking server forks workers after the app (and its adapters' Generators) is built:
each worker would draw the same noise as its siblings, so answers paid for separately would share their
randomness (composition assumes independent noise; two releases with the same uniforms can reveal more than
both charges cover). The fresh, OS-seeded Generators made here are reseeded from the OS in every forked
child. A Generator the caller passes (``rng``) or a ``seed`` is the caller's: give each worker its own.
"""

from __future__ import annotations

import os
import weakref
from numbers import Integral

import numpy as np

from dp_icl_plugin.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["ForkReseededGenerator", "noise_source"]


class ForkReseededGenerator(np.random.Generator):
    """A ``numpy.random.Generator`` seeded from the OS and reseeded from the OS in every forked child
    (see the module docstring); otherwise a plain Generator."""

    __slots__ = ("__weakref__",)

    def __init__(self) -> None:
        super().__init__(np.random.PCG64(np.random.SeedSequence()))
        _fresh.add(self)


_fresh: weakref.WeakSet[ForkReseededGenerator] = weakref.WeakSet()


def _reseed_in_child() -> None:
    for generator in list(_fresh):
        generator.bit_generator.state = np.random.PCG64(np.random.SeedSequence()).state


os.register_at_fork(after_in_child=_reseed_in_child)


def noise_source(rng: object = None, seed: object = None) -> np.random.Generator:
    """``rng`` itself, ``numpy.random.default_rng(seed)``, or a fresh OS-seeded Generator (neither given; a
    :class:`ForkReseededGenerator`, reseeded in forked children)."""
    if rng is not None and seed is not None:
        raise ConfigurationError("give rng or seed, not both")
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise ConfigurationTypeError("rng must be a numpy.random.Generator (or give seed=, an int)")
        return rng
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, Integral) or int(seed) < 0:
            raise ConfigurationError("seed must be a non-negative int")
        return np.random.default_rng(int(seed))
    return ForkReseededGenerator()
