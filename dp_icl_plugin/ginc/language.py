"""The GINC language: a mixture of factorial HMMs over a small synthetic vocabulary (numpy only).

GINC (Xie et al. 2022, "An Explanation of In-context Learning as Implicit Bayesian Inference", §4) is a
synthetic language in which a small transformer learns in context. Each *concept* θ is an HMM whose hidden
state is a pair (entity, property):

- emissions are deterministic and shared by all HMMs: one random token per (entity, property), with
  property 0 always emitting the delimiter "/" (token 0);
- transitions are factorial, T_θ = entity_T ⊗ property_T_θ. ``property_T_θ`` differs per concept (a
  softmax-weighted mixture of random permutation matrices, logits uniform in (−½, ½), temperature 0.1);
  ``entity_T`` is shared and biased to stay (0.9·I + 0.1·mixture);
- each concept starts from a near-uniform distribution over hidden states (softmax of uniform logits,
  temperature 10).

Of the ``n_hmms`` concepts, the first ``n_pretrain_hmms`` generate the pretraining documents. Everything is
a deterministic function of :class:`GincConfig` (its seed included), so a model directory only needs the
config to regenerate the exact language it was trained on.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError

__all__ = ["DELIMITER", "GincConfig", "GincLanguage", "symbol_names"]

DELIMITER = "/"


def symbol_names(n_symbols: int) -> list[str]:
    """``["/", "a", ..., "z", "ab", "ac", ...]``: the delimiter, single letters, then ordered letter pairs."""
    n = check.positive_int("n_symbols", n_symbols)
    letters = list(string.ascii_lowercase)
    pairs = ("".join(p) for p in itertools.permutations(letters, 2))
    names = [DELIMITER, *itertools.islice(itertools.chain(letters, pairs), n - 1)]
    if len(names) < n:
        raise ConfigurationError(f"n_symbols must be at most {1 + 26 + 26 * 25}, got {n}")
    return names


@dataclass(frozen=True)
class GincConfig:
    """Every parameter of a GINC language; the language is a pure function of this value.

    Args:
        n_symbols: vocabulary size including the delimiter (50 and 150 in the papers).
        n_hmms: concepts in total; the first ``n_pretrain_hmms`` make the pretraining data.
        n_entities: the entity factor of the hidden state.
        n_properties: the property factor of the hidden state.
        transition_temperature: softmax temperature of the permutation-mixture weights.
        start_temperature: softmax temperature of the start distribution (large = near uniform).
        entity_stay: weight of the identity in the entity transitions.
        seed: seed of the language itself (not of any sampling from it).
    """

    n_symbols: int = 150
    n_hmms: int = 10
    n_pretrain_hmms: int = 5
    n_entities: int = 10
    n_properties: int = 10
    transition_temperature: float = 0.1
    start_temperature: float = 10.0
    entity_stay: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        check.positive_int("n_symbols", self.n_symbols)
        symbol_names(self.n_symbols)
        check.positive_int("n_hmms", self.n_hmms)
        check.positive_int("n_pretrain_hmms", self.n_pretrain_hmms)
        if self.n_pretrain_hmms > self.n_hmms:
            raise ConfigurationError("n_pretrain_hmms must not exceed n_hmms")
        check.positive_int("n_entities", self.n_entities)
        if check.positive_int("n_properties", self.n_properties) < 2:
            raise ConfigurationError("n_properties must be at least 2 (property 0 is the delimiter)")
        if self.n_symbols < 2:
            raise ConfigurationError("n_symbols must be at least 2 (the delimiter and one symbol)")
        check.positive_finite("transition_temperature", self.transition_temperature)
        check.positive_finite("start_temperature", self.start_temperature)
        if not 0.0 <= check.real("entity_stay", self.entity_stay) <= 1.0:
            raise ConfigurationError("entity_stay must lie in [0, 1]")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigurationError("seed must be a non-negative integer")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GincConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigurationError(f"unknown GINC parameters: {unknown}")
        return cls(**known)


def _softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = x / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def _permutation_mixture(rng: np.random.Generator, n: int, temperature: float) -> np.ndarray:
    """A row-stochastic matrix Σ_j w_j P_j over n random permutations, w = softmax(U(−½, ½) / temperature).

    Uniform logits as in the original GINC: at temperature 0.1 a few permutations share the mass, so the
    chains are predictable but not deterministic.
    """
    weights = _softmax(rng.random(n) - 0.5, temperature)
    matrix = np.zeros((n, n))
    for w in weights:
        matrix[np.arange(n), rng.permutation(n)] += w
    return matrix


class GincLanguage:
    """The HMMs of one GINC language, with exact sampling and exact forward filtering.

    Hidden states are flattened as ``entity * n_properties + property``.
    """

    def __init__(self, config: GincConfig | None = None) -> None:
        self.config = config or GincConfig()
        c = self.config
        rng = np.random.default_rng(c.seed)
        self.vocab: list[str] = symbol_names(c.n_symbols)
        # An independent uniform symbol per (entity, property ≠ 0), so symbols collide (about 68 distinct
        # of 90 cells at |V| = 150): a token does not reveal its hidden state, as in the original GINC.
        emission = np.zeros((c.n_entities, c.n_properties), dtype=np.int64)
        emission[:, 1:] = rng.integers(1, c.n_symbols, size=(c.n_entities, c.n_properties - 1))
        self.emission_table = emission
        self.entity_transition = c.entity_stay * np.eye(c.n_entities) + (1.0 - c.entity_stay) * (
            _permutation_mixture(rng, c.n_entities, c.transition_temperature)
        )
        self.property_transitions = np.stack(
            [_permutation_mixture(rng, c.n_properties, c.transition_temperature) for _ in range(c.n_hmms)]
        )
        self.start_distributions = np.stack(
            [_softmax(rng.random(self.n_states) - 0.5, c.start_temperature) for _ in range(c.n_hmms)]
        )

    # ---------------------------------------------------------------- structure

    @property
    def n_states(self) -> int:
        return self.config.n_entities * self.config.n_properties

    @property
    def pretrain_concepts(self) -> range:
        return range(self.config.n_pretrain_hmms)

    @cached_property
    def emission(self) -> np.ndarray:
        """Token emitted by each flattened hidden state, shape (n_states,)."""
        return self.emission_table.reshape(-1)

    def transition(self, concept: int) -> np.ndarray:
        """The full (n_states, n_states) transition matrix entity_T ⊗ property_T of ``concept``."""
        return np.kron(self.entity_transition, self.property_transitions[self._concept(concept)])

    def _concept(self, concept: int) -> int:
        if not isinstance(concept, (int, np.integer)) or not 0 <= concept < self.config.n_hmms:
            raise ConfigurationError(f"concept must be an integer in [0, {self.config.n_hmms}), got {concept!r}")
        return int(concept)

    # ---------------------------------------------------------------- text

    def render(self, tokens: Sequence[int] | np.ndarray) -> str:
        """Tokens as space-separated symbol names (the text form the tokenizer reads)."""
        return " ".join(self.vocab[int(t)] for t in tokens)

    def parse(self, text: str) -> list[int]:
        index = self._index
        try:
            return [index[word] for word in text.split()]
        except KeyError as exc:
            raise ConfigurationError(f"not a GINC symbol: {exc.args[0]!r}") from None

    @cached_property
    def _index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.vocab)}

    # ---------------------------------------------------------------- sampling

    def sample_states(
        self, concepts: np.ndarray, start_states: np.ndarray, length: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Hidden-state paths of ``length`` steps for a batch, shape (batch, length), vectorised over the batch.

        Entity and property move independently (the transition is a Kronecker product), so each is drawn
        from its own factor by inverse-CDF sampling.
        """
        c = self.config
        concepts = np.asarray(concepts, dtype=np.int64)
        start_states = np.asarray(start_states, dtype=np.int64)
        entity_cdf = np.cumsum(self.entity_transition, axis=1)
        property_cdf = np.cumsum(self.property_transitions, axis=2)
        entity, prop = np.divmod(start_states, c.n_properties)
        path = np.empty((len(concepts), length), dtype=np.int64)
        path[:, 0] = start_states
        for t in range(1, length):
            u = rng.random((2, len(concepts)))
            entity = np.minimum((entity_cdf[entity] < u[0, :, None]).sum(axis=1), c.n_entities - 1)
            prop = np.minimum((property_cdf[concepts, prop] < u[1, :, None]).sum(axis=1), c.n_properties - 1)
            path[:, t] = entity * c.n_properties + prop
        return path

    def sample_documents(
        self, n_documents: int, length: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pretraining documents: each from a uniformly chosen pretraining concept, started from its start
        distribution. Returns ``(tokens (n_documents, length), concepts (n_documents,))``."""
        n_documents = check.positive_int("n_documents", n_documents)
        length = check.positive_int("length", length)
        concepts = rng.integers(0, self.config.n_pretrain_hmms, size=n_documents)
        start_cdf = np.cumsum(self.start_distributions[concepts], axis=1)
        starts = np.minimum((start_cdf < rng.random(n_documents)[:, None]).sum(axis=1), self.n_states - 1)
        return self.emission[self.sample_states(concepts, starts, length, rng)], concepts

    # ---------------------------------------------------------------- inference

    def start_belief(self, start_property: int) -> np.ndarray:
        """Uniform over entities, all mass on ``start_property``: how every ICL example starts."""
        c = self.config
        if not 0 <= start_property < c.n_properties:
            raise ConfigurationError(f"start_property must lie in [0, {c.n_properties})")
        belief = np.zeros((c.n_entities, c.n_properties))
        belief[:, start_property] = 1.0 / c.n_entities
        return belief.reshape(-1)

    def next_token_distribution(self, concept: int, prefixes: np.ndarray, start_beliefs: np.ndarray) -> np.ndarray:
        """Exact p(o_{t+1} | o_1..o_t, θ) for a batch of equal-length prefixes, by forward filtering.

        Args:
            concept: θ.
            prefixes: observed tokens, shape (batch, t), t ≥ 0.
            start_beliefs: distribution of the first hidden state, shape (batch, n_states) or (n_states,).

        Returns:
            shape (batch, n_symbols). Raises ConfigurationError if a prefix is impossible under θ.
        """
        transition = self.transition(concept)
        prefixes = np.atleast_2d(np.asarray(prefixes, dtype=np.int64))
        belief = np.broadcast_to(np.asarray(start_beliefs, dtype=float), (len(prefixes), self.n_states)).copy()
        for t in range(prefixes.shape[1]):
            belief *= self.emission[None, :] == prefixes[:, t, None]
            mass = belief.sum(axis=1, keepdims=True)
            if np.any(mass <= 0):
                raise ConfigurationError(f"a prefix is impossible under concept {concept}")
            belief = (belief / mass) @ transition
        out = np.zeros((len(prefixes), self.config.n_symbols))
        np.add.at(out.T, self.emission, belief.T)
        return out
