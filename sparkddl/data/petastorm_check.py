"""Whether Petastorm loads in this Python: its own module, so the planner can ask without
importing the Petastorm source (which imports the planner)."""
from __future__ import annotations

import functools
import importlib

# the modules the Petastorm source uses: importing them is the test of whether it works here
MODULES = ("petastorm.reader", "petastorm.arrow_reader_worker", "petastorm.fs_utils",
           "petastorm.workers_pool")


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None where Petastorm loads in this Python, else what went wrong (found once per
    process: ranks resolve their reader every epoch)."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - pyarrow >= 15 breaks it with AttributeError too
            return f"importing {name} failed: {type(exc).__name__}: {exc}"
    return None
