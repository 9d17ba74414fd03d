"""dp-icl-plugin: differentially private in-context learning for LangChain and LlamaIndex apps.

The core is framework-free: importing it loads neither torch, transformers, faiss, langchain nor
llama_index. Layers (imports point one way): ``accounting`` ← ``mechanisms`` / ``backends`` ← ``methods``
← the adapter distributions in ``integrations/``: ``langchain_dp_icl``, ``llama_index.llms.dp_icl``,
``llama_index.retrievers.dp_icl``.
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
from dp_icl_plugin.backends import FakeBackend, IncrementalSession, NextTokenBackend
from dp_icl_plugin.errors import (
    BackendError,
    BudgetExhaustedError,
    BudgetMismatchError,
    CalibrationError,
    ConfigurationError,
    DPICLError,
    FilterMismatchError,
    LedgerCorruptError,
    LedgerError,
    LedgerFormatError,
    ModelFileError,
    ReleaseFailedError,
    ServerError,
    ServerMismatchError,
    ServerRateLimitError,
    ServerUnavailableError,
    ShareExhaustedError,
    UnsupportedEventError,
)
from dp_icl_plugin.timing import FixedLatency

__version__ = "0.1.0"

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "ApproxDPEvent",
    "BackendError",
    "BudgetExhaustedError",
    "BudgetManager",
    "BudgetMismatchError",
    "CalibrationError",
    "ComposedEvent",
    "ConfigurationError",
    "DPEvent",
    "DPICLError",
    "ExponentialMechanismEvent",
    "FakeBackend",
    "FilterMismatchError",
    "FixedLatency",
    "GaussianEvent",
    "HFBackend",
    "IncrementalSession",
    "LedgerCorruptError",
    "LedgerEntry",
    "LedgerError",
    "LedgerFormatError",
    "ModelFileError",
    "MozoTokenEvent",
    "NextTokenBackend",
    "PoissonSampledEvent",
    "PrivacyBudget",
    "PrivacySpend",
    "PureDPEvent",
    "RDPCurveEvent",
    "ReleaseFailedError",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "ServerBackend",
    "ServerError",
    "ServerMismatchError",
    "ServerRateLimitError",
    "ServerUnavailableError",
    "ShareExhaustedError",
    "UnsupportedEventError",
    "__version__",
    "calibrate",
    "compose",
    "get_accountant",
    "to_relation",
]


def __getattr__(name: str) -> object:
    # HFBackend needs torch and transformers: import them only when it is asked for.
    if name == "HFBackend":
        from dp_icl_plugin.backends.hf import HFBackend

        return HFBackend
    if name == "ServerBackend":  # needs httpx and a transformers tokenizer
        from dp_icl_plugin.backends.server import ServerBackend

        return ServerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
