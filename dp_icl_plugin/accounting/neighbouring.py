"""Neighbouring relations: which pairs of datasets a privacy guarantee compares.

- :data:`REPLACE_ONE` (the default of every ledger): D and D' have the same number of records and differ in
  one record, its text and its label alike. The stronger, usual relation for a dataset of known size:
  the dataset size is invariant (public by the relation), sampling without replacement (AdaDPSyn,
  DPS-MOZO) has a valid analysis only under it, and every add/remove guarantee converts to it (group
  privacy), while nothing converts back. A ledger under replace-one can therefore hold every component.
- :data:`ADD_REMOVE`: D' is D with one record added or removed. The relation of Tang et al., PTA,
  clip-blend's Lemma 2 and the individual Rényi filter of the kNN paper. Methods analysed only for
  replace-one (AdaDPSyn, DPS-MOZO) cannot be charged to an add/remove ledger.

Every privacy event names the relation its analysis assumed (``events.DPEvent.neighbouring``); a ledger is
created with one relation and converts (``conversion.py``) or refuses every charge made under the other.
"""

from __future__ import annotations

from dp_icl_plugin.errors import ConfigurationError

__all__ = ["ADD_REMOVE", "DEFAULT_NEIGHBOURING", "RELATIONS", "REPLACE_ONE", "check_relation"]

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
RELATIONS = (REPLACE_ONE, ADD_REMOVE)
DEFAULT_NEIGHBOURING = REPLACE_ONE
"""Every ledger's relation unless the caller chooses another (see the module docstring for why)."""


def check_relation(value: object, name: str = "neighbouring") -> str:
    """``value`` if it names a relation (``"replace_one"`` or ``"add_remove"``), else ConfigurationError.

    Args:
        value: the relation's name.
        name: the parameter's name, for the message.

    Raises:
        ConfigurationError: ``value`` names no relation.
    """
    if not isinstance(value, str) or value not in RELATIONS:
        raise ConfigurationError(f"{name} must be one of {', '.join(map(repr, RELATIONS))}, got {value!r}")
    return value
