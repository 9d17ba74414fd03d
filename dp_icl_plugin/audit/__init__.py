"""Statistical privacy audit: empirical lower bounds on ε for the library's mechanisms (``dp-icl audit``).

Each mechanism runs many times on neighbouring inputs; Clopper–Pearson bounds on the best test's rates
give an ε the samples prove (``statistics``). It must stay below the ε the library claims for the call, and
the same audit must catch the mechanism run with half its noise, or with the defect the case guards against
(``cases``, ``runner``; ``decoder_case``: DPS-MOZO decoding on a real model in bfloat16).
"""

from dp_icl_plugin.audit.runner import AuditRow, run_audit, to_markdown
from dp_icl_plugin.audit.statistics import clopper_pearson, epsilon_lower_bound

__all__ = ["AuditRow", "clopper_pearson", "epsilon_lower_bound", "run_audit", "to_markdown"]
