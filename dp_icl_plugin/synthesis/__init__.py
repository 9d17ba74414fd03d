"""DP synthetic demonstrations (offline, pay once): :class:`TangSynthesizer` (B1/BA2), :class:`PTASynthesizer`
(P1/PA2/PA3), :class:`AdaDPSynSynthesizer`, :class:`ClipBlendSynthesizer`, :class:`MozoOfflineSynthesizer` and
:class:`TangAnswerSynthesizer` (answer public inputs: free-text tasks).

Each is a frozen config + ``event(dataset)`` + ``synthesize(dataset, backend=, budget=, rng=)`` that charges first and
returns a :class:`DemoSet`; every method's tokens run through one loop (:class:`SynthesisMethod`) on its token step
(:mod:`dp_icl_plugin.steps`).
"""

from dp_icl_plugin.synthesis.adadpsyn import AdaDPSynConfig, AdaDPSynSynthesizer
from dp_icl_plugin.synthesis.clip_blend import ClipBlendConfig, ClipBlendSynthesizer
from dp_icl_plugin.synthesis.demoset import DemoSet, Provenance
from dp_icl_plugin.synthesis.method import Plan, SynthesisMethod
from dp_icl_plugin.synthesis.mozo_offline import MozoOfflineConfig, MozoOfflineSynthesizer
from dp_icl_plugin.synthesis.pta import PTAConfig, PTASynthesizer
from dp_icl_plugin.synthesis.tang import TangConfig, TangSynthesizer
from dp_icl_plugin.synthesis.tang_answers import TangAnswerConfig, TangAnswerSynthesizer

__all__ = [
    "AdaDPSynConfig",
    "AdaDPSynSynthesizer",
    "ClipBlendConfig",
    "ClipBlendSynthesizer",
    "DemoSet",
    "MozoOfflineConfig",
    "MozoOfflineSynthesizer",
    "PTAConfig",
    "PTASynthesizer",
    "Plan",
    "Provenance",
    "SynthesisMethod",
    "TangAnswerConfig",
    "TangAnswerSynthesizer",
    "TangConfig",
    "TangSynthesizer",
]
