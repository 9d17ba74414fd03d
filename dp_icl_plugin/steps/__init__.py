"""One private token step per mechanism, shared by the synthesizers (:mod:`dp_icl_plugin.synthesis`) and the decoders
(:mod:`dp_icl_plugin.decoding`): each records draw and each release is written once.
"""

from dp_icl_plugin.steps.aggregation_step import AggregationStep
from dp_icl_plugin.steps.clip_blend_step import ClipBlendStep, assign_groups
from dp_icl_plugin.steps.mozo_step import MozoStep
from dp_icl_plugin.steps.token_step import TokenStep, decode_tokens, public_checked

__all__ = [
    "AggregationStep",
    "ClipBlendStep",
    "MozoStep",
    "TokenStep",
    "assign_groups",
    "decode_tokens",
    "public_checked",
]
