"""dp-icl-plugin: differentially private in-context learning for LangChain and LlamaIndex apps.

Everything a user builds with is importable from here (``from dp_icl_plugin import PrivateDataset, PTASynthesizer,
BudgetManager``): the records (:mod:`~dp_icl_plugin.data`), the synthesizers (:mod:`~dp_icl_plugin.synthesis`),
the decoders (:mod:`~dp_icl_plugin.decoding`), private kNN retrieval (:mod:`~dp_icl_plugin.retrieval`), the
templates, the backends, the budget ledger and its events (:mod:`~dp_icl_plugin.accounting`) and the errors.

The core is framework-free: importing it loads neither torch, transformers, faiss, langchain nor llama_index. Layers
(imports point one way): ``accounting`` ← ``mechanisms`` / ``backends`` ← ``data`` / ``templates`` ← ``steps`` (one
token step per mechanism) ← ``synthesis`` / ``retrieval`` ← ``decoding`` ← the adapter distributions in
``integrations/`` (``langchain_dp_icl``, ``llama_index.llms.dp_icl``, ``llama_index.retrievers.dp_icl``), which reach
the core through this module and :mod:`dp_icl_plugin.adapters`.
"""

from dp_icl_plugin.accounting import (
    ADD_REMOVE,
    REPLACE_ONE,
    ApproxDPEvent,
    BudgetManager,
    ComposedEvent,
    DPEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    IndividualBudget,
    LedgerEntry,
    MozoTokenEvent,
    PoissonSampledEvent,
    PrivacyBudget,
    PrivacySpend,
    PureDPEvent,
    RDPCurveEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    calibrate,
    compose,
    get_accountant,
    to_relation,
)
from dp_icl_plugin.backends import (
    FakeBackend,
    HFBackend,
    IncrementalSession,
    NextTokenBackend,
    ServerBackend,
    ServerSettings,
)
from dp_icl_plugin.data import Demonstration, PrivateDataset, PrivateRecord, load_dataset
from dp_icl_plugin.decoding import (
    AnswerChoices,
    AnswerStream,
    BudgetShare,
    ClipBlendDecoder,
    ClipBlendSettings,
    DecodedAnswer,
    Decoder,
    KNNExpertDecoder,
    KNNKeywordDecoder,
    MozoDecoder,
    MozoSettings,
    build_decoder,
    build_expert_decoder,
    build_keyword_decoder,
)
from dp_icl_plugin.errors import (
    AllowanceSpentError,
    BackendError,
    BudgetExhaustedError,
    BudgetMismatchError,
    CalibrationError,
    ConfigurationError,
    ConfigurationTypeError,
    DPICLError,
    FilterMismatchError,
    FilterRolledBackError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
    ModelFileError,
    NothingStoredError,
    ReleaseFailedError,
    ServerError,
    ServerMismatchError,
    ServerRateLimitError,
    ServerUnavailableError,
    ShareExhaustedError,
    UnsupportedEventError,
)
from dp_icl_plugin.retrieval import KNNConfig, PrivateIndex, PrivateKNN, kept_index
from dp_icl_plugin.synthesis import (
    AdaDPSynConfig,
    AdaDPSynSynthesizer,
    ClipBlendConfig,
    ClipBlendSynthesizer,
    DemoSet,
    MozoOfflineConfig,
    MozoOfflineSynthesizer,
    Provenance,
    PTAConfig,
    PTASynthesizer,
    SynthesisMethod,
    TangAnswerConfig,
    TangAnswerSynthesizer,
    TangConfig,
    TangSynthesizer,
)
from dp_icl_plugin.templates import ANSWER_PRESETS, PRESETS, AnswerTemplate, PromptTemplate
from dp_icl_plugin.timing import FixedLatency

__version__ = "0.1.0"

__all__ = [
    "ADD_REMOVE",
    "ANSWER_PRESETS",
    "PRESETS",
    "REPLACE_ONE",
    "AdaDPSynConfig",
    "AdaDPSynSynthesizer",
    "AllowanceSpentError",
    "AnswerChoices",
    "AnswerStream",
    "AnswerTemplate",
    "ApproxDPEvent",
    "BackendError",
    "BudgetExhaustedError",
    "BudgetManager",
    "BudgetMismatchError",
    "BudgetShare",
    "CalibrationError",
    "ClipBlendConfig",
    "ClipBlendDecoder",
    "ClipBlendSettings",
    "ClipBlendSynthesizer",
    "ComposedEvent",
    "ConfigurationError",
    "ConfigurationTypeError",
    "DPEvent",
    "DPICLError",
    "DecodedAnswer",
    "Decoder",
    "DemoSet",
    "Demonstration",
    "ExponentialMechanismEvent",
    "FakeBackend",
    "FilterMismatchError",
    "FilterRolledBackError",
    "FixedLatency",
    "GaussianEvent",
    "HFBackend",
    "IncrementalSession",
    "IndividualBudget",
    "KNNConfig",
    "KNNExpertDecoder",
    "KNNKeywordDecoder",
    "LedgerCorruptError",
    "LedgerEntry",
    "LedgerError",
    "LedgerFormatError",
    "ModelFileError",
    "MozoDecoder",
    "MozoOfflineConfig",
    "MozoOfflineSynthesizer",
    "MozoSettings",
    "MozoTokenEvent",
    "NextTokenBackend",
    "NothingStoredError",
    "PTAConfig",
    "PTASynthesizer",
    "PoissonSampledEvent",
    "PrivacyBudget",
    "PrivacySpend",
    "PrivateDataset",
    "PrivateIndex",
    "PrivateKNN",
    "PrivateRecord",
    "PromptTemplate",
    "Provenance",
    "PureDPEvent",
    "RDPCurveEvent",
    "ReleaseFailedError",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "ServerBackend",
    "ServerError",
    "ServerMismatchError",
    "ServerRateLimitError",
    "ServerSettings",
    "ServerUnavailableError",
    "ShareExhaustedError",
    "SynthesisMethod",
    "TangAnswerConfig",
    "TangAnswerSynthesizer",
    "TangConfig",
    "TangSynthesizer",
    "UnsupportedEventError",
    "__version__",
    "build_decoder",
    "build_expert_decoder",
    "build_keyword_decoder",
    "calibrate",
    "compose",
    "get_accountant",
    "kept_index",
    "load_dataset",
    "to_relation",
]


def _public_home() -> None:
    """Each public class and function says it is ``dp_icl_plugin.<name>`` (reprs, tracebacks, docs), where a user
    imports it from; pickling finds it there too."""
    for name in __all__:
        obj = globals()[name]
        if (isinstance(obj, type) or callable(obj)) and getattr(obj, "__module__", "").startswith(f"{__name__}."):
            obj.__module__ = __name__


_public_home()
