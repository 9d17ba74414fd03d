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

**Privacy units.** A relation compares datasets that differ in one *unit*:

- :data:`PER_RECORD` (the default): the unit is one record, as above.
- :data:`PER_UNIT`: the unit is everything one privacy unit holds (a person, a patient, a customer: the
  ``unit`` of :class:`~dp_icl_plugin.data.records.PrivateRecord`). Replace-one: all of one unit's records are
  replaced by one or more records of one unit that is not otherwise in the dataset (the number of units stays the
  same, so it is public; the number of records need not; merging two units or emptying one is not a step).
  Add/remove: all of one unit's records are added or removed. A method earns such a guarantee by
  contribution bounding: it draws units, never records, and lets a drawn unit put at most a public number of
  its records into a prompt (:mod:`~dp_icl_plugin.data.units`), so one unit moves what one record moved in the
  record-level analysis.

Every event names its unit too (``events.DPEvent.privacy_unit``). A ledger holds one unit and refuses a charge
made for the other: a record-level guarantee says nothing of a unit with many records (group privacy needs a
bound on its size, which is private), and a unit-level one is not converted down either (the ledger would then
certify a relation its other charges do not hold under).
"""

from __future__ import annotations

from dp_icl_plugin.errors import ConfigurationError

__all__ = [
    "ADD_REMOVE",
    "DEFAULT_NEIGHBOURING",
    "PER_RECORD",
    "PER_UNIT",
    "PRIVACY_UNITS",
    "RELATIONS",
    "REPLACE_ONE",
    "check_privacy_unit",
    "check_relation",
]

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
RELATIONS = (REPLACE_ONE, ADD_REMOVE)
DEFAULT_NEIGHBOURING = REPLACE_ONE
"""Every ledger's relation unless the caller chooses another (see the module docstring for why)."""
PER_RECORD = "record"
PER_UNIT = "unit"
PRIVACY_UNITS = (PER_RECORD, PER_UNIT)


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


def check_privacy_unit(value: object, name: str = "privacy_unit") -> str:
    """``value`` if it names a privacy unit (``"record"`` or ``"unit"``), else ConfigurationError.

    Args:
        value: the unit's name.
        name: the parameter's name, for the message.

    Raises:
        ConfigurationError: ``value`` names no privacy unit.
    """
    if not isinstance(value, str) or value not in PRIVACY_UNITS:
        raise ConfigurationError(f"{name} must be one of {', '.join(map(repr, PRIVACY_UNITS))}, got {value!r}")
    return value
