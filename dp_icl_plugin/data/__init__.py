"""Private records, the datasets they form, the privacy units they belong to and how they are read from files.

Every record is private; only what a caller declares public about them (label names, label sizes, unit counts) is
read by the methods' accounting (:class:`PrivateDataset`). :mod:`~dp_icl_plugin.data.units` says what a method
samples under a record-level or a unit-level ledger.
"""

from dp_icl_plugin.data.files import load_dataset, read_rows
from dp_icl_plugin.data.records import Demonstration, PrivateDataset, PrivateRecord

__all__ = ["Demonstration", "PrivateDataset", "PrivateRecord", "load_dataset", "read_rows"]
