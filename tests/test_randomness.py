"""The noise source of a releasing component (_runtime/randomness.py): explicit Generators, seeds for tests
only, fresh OS entropy by default, and fresh entropy again in every forked worker."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from dp_icl_plugin import ConfigurationError
from dp_icl_plugin._runtime.randomness import ForkReseededGenerator, noise_source


def _draws_in_a_forked_child(rng: np.random.Generator) -> list[float]:
    context = mp.get_context("fork")
    queue = context.Queue()

    def child() -> None:
        queue.put(rng.random(4).tolist())

    worker = context.Process(target=child)
    worker.start()
    worker.join(60)
    return queue.get(timeout=5)


def test_a_default_noise_source_is_reseeded_in_every_forked_worker() -> None:
    """Cold review of issue 27: a pre-forking server's workers inherited one Generator state, so answers paid
    for separately drew the same noise. The default (OS-seeded) source now draws afresh in each child."""
    rng = noise_source()
    assert isinstance(rng, ForkReseededGenerator) and isinstance(rng, np.random.Generator)
    children = [_draws_in_a_forked_child(rng) for _ in range(2)]
    parent = rng.random(4).tolist()
    assert len({tuple(parent), *map(tuple, children)}) == 3  # failed before: all three the same


def test_a_callers_generator_or_seed_is_left_as_given() -> None:
    mine = np.random.default_rng(7)
    assert noise_source(mine) is mine
    seeded = noise_source(seed=3)
    assert seeded.random() == np.random.default_rng(3).random()
    assert _draws_in_a_forked_child(noise_source(seed=3)) == np.random.default_rng(3).random(4).tolist()


@pytest.mark.parametrize(
    ("rng", "seed", "match"),
    [
        (np.random.default_rng(0), 1, "not both"),
        ("rng", None, "numpy.random.Generator"),
        (None, -1, "non-negative int"),
        (None, True, "non-negative int"),
        (None, 1.5, "non-negative int"),
    ],
)
def test_bad_noise_sources_are_refused(rng: object, seed: object, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        noise_source(rng, seed)
