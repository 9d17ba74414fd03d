"""What a decoder is given, as config objects: its share of the shared ledger (:class:`BudgetShare`) and its
mechanism's settings (:class:`MozoSettings`, :class:`ClipBlendSettings`). The decoders' named constructors take
them (``MozoDecoder.with_epsilon(dataset, share, ...)`` beside ``MozoDecoder.with_beta(dataset, beta, ...)``), so a
call says which of the two ways of setting the noise it means instead of passing exactly one of two keywords.

Each object is frozen and validated when it is made: a wrong type is a
:class:`~dp_icl_plugin.errors.ConfigurationTypeError`, a wrong value a
:class:`~dp_icl_plugin.errors.ConfigurationError`, both before anything is charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.mechanisms.mozo_mixing import LAMBDA_MAX

__all__ = ["BudgetShare", "ClipBlendSettings", "MozoSettings"]


@dataclass(frozen=True)
class BudgetShare:
    """A decoder's share of the ledger: ``epsilon`` (at ``delta``) for ``n_queries`` answers of at most
    ``max_tokens`` tokens each. The decoder calibrates its noise so that all of them together meet it, charges
    every answer its worst case before its first token, and refuses answer ``n_queries + 1``.

    Attributes:
        epsilon: the share's ε.
        n_queries: the answers it covers.
        max_tokens: the most tokens of one answer (each charged in full).
        delta: the share's δ; None (default) is the ledger's δ, at which the ledger certifies its charges.
    """

    epsilon: float
    n_queries: int
    max_tokens: int = 32
    delta: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))
        object.__setattr__(self, "n_queries", check.positive_int("n_queries", self.n_queries))
        object.__setattr__(self, "max_tokens", check.positive_int("max_tokens", self.max_tokens))
        if self.delta is not None:
            object.__setattr__(self, "delta", check.probability_open("delta", self.delta))


@dataclass(frozen=True)
class MozoSettings:
    """DPS-MOZO's mechanism settings (Flemings et al.; defaults: the paper's).

    Attributes:
        n_shots: records drawn per token (q = n_shots/|D|).
        top_k: the public top-k support of the zero-shot output.
        order: the Rényi order α the mixing is fitted at.
        lambda_max: the upper limit of each mixing weight λ_i.
    """

    n_shots: int = 4
    top_k: int = 100
    order: float = 8.0
    lambda_max: float = LAMBDA_MAX

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_shots", check.positive_int("n_shots", self.n_shots))
        object.__setattr__(self, "top_k", check.positive_int("top_k", self.top_k))
        object.__setattr__(self, "order", check.order("order", self.order))
        object.__setattr__(self, "lambda_max", check.positive_finite("lambda_max", self.lambda_max))


@dataclass(frozen=True)
class ClipBlendSettings:
    """Clip-blend's mechanism settings (Bhusal et al.).

    Attributes:
        subset_size: s, the expected size of the fixed private subset and the divisor of the average.
        clip: the clipping bound c (the paper: 10).
        population_size: N, the public population the subset is drawn from; required under an add/remove ledger,
            |D| under replace-one when None.
    """

    subset_size: int
    clip: float = 10.0
    population_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "subset_size", check.positive_int("subset_size", self.subset_size))
        object.__setattr__(self, "clip", check.positive_finite("clip", self.clip))
        if self.population_size is not None:
            size = check.positive_int("population_size", self.population_size)
            if self.subset_size > size:
                raise ConfigurationError(f"subset_size {self.subset_size} exceeds population_size {size}")
            object.__setattr__(self, "population_size", size)
