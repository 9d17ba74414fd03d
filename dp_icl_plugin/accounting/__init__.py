"""Privacy accounting: events, accountants, calibration, and the shared budget manager.

Knows nothing of language models. See ``events`` for what a release costs, ``neighbouring`` and
``conversion`` for the relation each guarantee is under, ``accountants`` for how costs compose into
(ε, δ), ``calibration`` for the noise that meets a target, and ``budget`` for the durable, atomic ledger
every component charges.
"""

from dp_icl_plugin.accounting.accountants import (
    Accountant,
    BasicAccountant,
    PLDAccountant,
    PRVAccountant,
    RDPAccountant,
    TightestAccountant,
    get_accountant,
)
from dp_icl_plugin.accounting.budget import BudgetManager, LedgerEntry
from dp_icl_plugin.accounting.calibration import (
    CalibrationResult,
    calibrate,
    calibrate_adadpsyn,
    calibrate_clip_blend_temperature,
    calibrate_mozo,
    calibrate_subsampled_gaussian,
)
from dp_icl_plugin.accounting.conversion import to_relation
from dp_icl_plugin.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialMechanismEvent,
    FilteredReleaseEvent,
    GaussianEvent,
    MozoTokenEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RDPCurveEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    compose,
    event_from_dict,
)
from dp_icl_plugin.accounting.individual_filter import IndividualBudget, ReleaseCost
from dp_icl_plugin.accounting.neighbouring import ADD_REMOVE, DEFAULT_NEIGHBOURING, REPLACE_ONE
from dp_icl_plugin.accounting.privacy import PrivacyBudget, PrivacySpend
from dp_icl_plugin.accounting.renyi_filter import RenyiFilter
from dp_icl_plugin.accounting.stores import InMemoryStore, LedgerStore, PostgresStore, SQLiteStore

__all__ = [
    "ADD_REMOVE",
    "DEFAULT_NEIGHBOURING",
    "REPLACE_ONE",
    "Accountant",
    "ApproxDPEvent",
    "BasicAccountant",
    "BudgetManager",
    "CalibrationResult",
    "ComposedEvent",
    "DPEvent",
    "ExponentialMechanismEvent",
    "FilteredReleaseEvent",
    "GaussianEvent",
    "InMemoryStore",
    "IndividualBudget",
    "LedgerEntry",
    "LedgerStore",
    "MozoTokenEvent",
    "PLDAccountant",
    "PRVAccountant",
    "PoissonSampledEvent",
    "PostgresStore",
    "PrivacyBudget",
    "PrivacySpend",
    "PureDPEvent",
    "RDPAccountant",
    "RDPCurveEvent",
    "ReleaseCost",
    "RenyiFilter",
    "SQLiteStore",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "TightestAccountant",
    "calibrate",
    "calibrate_adadpsyn",
    "calibrate_clip_blend_temperature",
    "calibrate_mozo",
    "calibrate_subsampled_gaussian",
    "compose",
    "event_from_dict",
    "get_accountant",
    "to_relation",
]
