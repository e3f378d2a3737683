"""The DataFrames ``read_delta`` and ``read_iceberg`` returned, each with the table version it
reads, so that a fit given one reads that version in place. Kept here by the DataFrame's
identity while it lives: nothing is set on pyspark's objects (a Spark Connect DataFrame
answers any attribute name with a Column, and a DataFrame derived from it is another object,
which is decided afresh)."""
from __future__ import annotations

import threading
import weakref
from typing import Any

from sparkddl.tables.table import Table

_handed: weakref.WeakKeyDictionary[Any, tuple[str, Table]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def hand_over(frame: Any, url: str, version: Table) -> Any:
    """Remember that ``frame`` reads ``version`` of the table at ``url``; ``frame``."""
    with _lock:
        _handed[frame] = (url, version)
    return frame


def handed(frame: Any) -> tuple[str, Table] | None:
    """(url, version) of a DataFrame ``read_delta``/``read_iceberg`` returned, else None."""
    try:
        with _lock:
            return _handed.get(frame)
    except TypeError:  # not weakly referable, so never handed over
        return None
