"""DP decoding (pay per answer): the :class:`Decoder` contract the adapters use, DPS-MOZO and clip-blend decoders
over a dataset, kNN expert decoding and kNN keyword hints over a private index, and :func:`build_decoder` by name.
"""

from dp_icl_plugin.decoding.choices import AnswerChoices
from dp_icl_plugin.decoding.contract import AnswerStream, DecodedAnswer, Decoder, Query
from dp_icl_plugin.decoding.decoders import ClipBlendDecoder, MozoDecoder
from dp_icl_plugin.decoding.factory import DECODING_METHODS, build_decoder
from dp_icl_plugin.decoding.knn_experts import KNNExpertDecoder, build_expert_decoder
from dp_icl_plugin.decoding.knn_keywords import KNNKeywordDecoder, build_keyword_decoder
from dp_icl_plugin.decoding.shares import BudgetShare, ClipBlendSettings, MozoSettings

__all__ = [
    "DECODING_METHODS",
    "AnswerChoices",
    "AnswerStream",
    "BudgetShare",
    "ClipBlendDecoder",
    "ClipBlendSettings",
    "DecodedAnswer",
    "Decoder",
    "KNNExpertDecoder",
    "KNNKeywordDecoder",
    "MozoDecoder",
    "MozoSettings",
    "Query",
    "build_decoder",
    "build_expert_decoder",
    "build_keyword_decoder",
]
