"""Private records, the datasets they form and how they are read from files.

Every record is private; only what a caller declares public about them (label names, label sizes) is read by the
methods' accounting (:class:`PrivateDataset`).
"""

from dp_icl_plugin.data.files import load_dataset, read_rows
from dp_icl_plugin.data.records import Demonstration, PrivateDataset, PrivateRecord

__all__ = ["Demonstration", "PrivateDataset", "PrivateRecord", "load_dataset", "read_rows"]
