"""PTA, Plausible Token Amplification (Yamasaki et al., ICML 2025): "P1", "PA2" (with top-p), "PA3" (no base).

Tang et al.'s generation (:mod:`~dp_icl_plugin.synthesis.tang`) with each private distribution reshaped before
the noise (eq. 13, Algorithm 1 lines 4–6):

    p_i[v] ∝ p_base[v] · ( p(v | S_priv^(i)) / p(v | S_pub) )^α     normalised over the whole vocabulary,

where p_base = p(v | base prompt + tokens generated so far) (no instruction, no private data). Then
p̂ = Σ_i p_i + N(0, 2σ²) on V_pub = top-k (∩ top-p) of p(·|S_pub) (Algorithm 2) and the released token is
argmax over V_pub of max(p̂_v, 0) (line 10). "PA3" drops p_base.

Privacy: identical to Tang et al. (PTA App. D.2): each reshaped p_i is still a probability vector of one
prompt, so one record moves the sum by at most √2 in ℓ2; Poisson sampling at q = M·N/min_y n_y over the
declared public sizes; T × shots-per-label compositions under the ledger's relation (replace-one by default,
dp-accounting PLD; add/remove and PRV reproduce PTA's Table 4), ``method_events.tang_event``. S_pub and
p_base read no private data (post-processing of public inputs and of released tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dp_icl_plugin import _validation as check
from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.mechanisms.gaussian_aggregation import pta_distributions, restrict
from dp_icl_plugin.synthesis.tang import TangConfig, TangSynthesizer

__all__ = ["PTAConfig", "PTASynthesizer"]


@dataclass(frozen=True)
class PTAConfig(TangConfig):
    """:class:`~dp_icl_plugin.synthesis.tang.TangConfig` plus PTA's amplification.

    Attributes:
        alpha: amplification strength α ≥ 0 (the paper searches {1, 1.5, 2} and {1, 1.5, 2, 5} on GINC).
        use_base: multiply by p_base ("P1", "PA2"); False gives "PA3".

    Raises:
        ConfigurationError: a setting out of range (those of
            :class:`~dp_icl_plugin.synthesis.tang.TangConfig` included).
    """

    alpha: float = 1.0
    use_base: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check.non_negative_finite("alpha", self.alpha)
        if not isinstance(self.use_base, bool):
            raise ConfigurationError("use_base must be a bool")


class PTASynthesizer(TangSynthesizer):
    """DP synthetic demonstrations with Plausible Token Amplification; see the module docstring."""

    name: ClassVar[str] = "pta"
    config_type: ClassVar[type] = PTAConfig
    config: PTAConfig
    _clip_negative: ClassVar[bool] = True

    def _uses_base(self) -> bool:
        return self.config.use_base

    def _candidate_distributions(self, logprobs: np.ndarray, vocabulary: np.ndarray, has_base: bool) -> np.ndarray:
        base = logprobs[1] if has_base else None
        reshaped = pta_distributions(logprobs[1 + has_base :], logprobs[0], alpha=self.config.alpha, base_logprobs=base)
        return restrict(reshaped, vocabulary, renormalize=False)
