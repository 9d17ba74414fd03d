"""The published DP-ICL methods, composed from backends, mechanisms and the accounting core.

Synthesis (offline, pay once): :class:`TangSynthesizer` (B1/BA2), :class:`PTASynthesizer` (P1/PA2/PA3),
:class:`AdaDPSynSynthesizer`, :class:`ClipBlendSynthesizer`, :class:`MozoOfflineSynthesizer` (answers public inputs).
Each is a frozen config + ``event(dataset)`` + ``synthesize(dataset, backend=, budget=, rng=)`` that charges
first and returns a :class:`DemoSet`.
"""

from dp_icl_plugin.methods.adadpsyn import AdaDPSynConfig, AdaDPSynSynthesizer
from dp_icl_plugin.methods.answer_templates import ANSWER_PRESETS, AnswerTemplate
from dp_icl_plugin.methods.base import Plan, SynthesisMethod
from dp_icl_plugin.methods.choices import AnswerChoices
from dp_icl_plugin.methods.clip_blend import ClipBlendConfig, ClipBlendSynthesizer
from dp_icl_plugin.methods.data import Demonstration, PrivateDataset, PrivateRecord
from dp_icl_plugin.methods.demoset import DemoSet, Provenance
from dp_icl_plugin.methods.mozo import MozoOfflineConfig, MozoOfflineSynthesizer
from dp_icl_plugin.methods.pta import PTAConfig, PTASynthesizer
from dp_icl_plugin.methods.tang import TangConfig, TangSynthesizer
from dp_icl_plugin.methods.templates import PRESETS, PromptTemplate

__all__ = [
    "ANSWER_PRESETS",
    "PRESETS",
    "AdaDPSynConfig",
    "AdaDPSynSynthesizer",
    "AnswerChoices",
    "AnswerTemplate",
    "ClipBlendConfig",
    "ClipBlendSynthesizer",
    "DemoSet",
    "Demonstration",
    "MozoOfflineConfig",
    "MozoOfflineSynthesizer",
    "PTAConfig",
    "PTASynthesizer",
    "Plan",
    "PrivateDataset",
    "PrivateRecord",
    "PromptTemplate",
    "Provenance",
    "SynthesisMethod",
    "TangConfig",
    "TangSynthesizer",
]
