"""Prompt layouts (public text only): label-conditioned demonstration prompts (:class:`PromptTemplate`, for Tang,
PTA, AdaDPSyn and clip-blend synthesis) and input-to-output prompts (:class:`AnswerTemplate`, for DPS-MOZO and the
decoders), with the papers' presets.
"""

from dp_icl_plugin.templates.answer import ANSWER_PRESETS, AnswerTemplate
from dp_icl_plugin.templates.demonstration import PRESETS, PromptTemplate

__all__ = ["ANSWER_PRESETS", "PRESETS", "AnswerTemplate", "PromptTemplate"]
