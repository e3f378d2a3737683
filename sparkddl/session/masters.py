"""What a Spark master's name and an executor's error text tell, without asking the cluster:
the task slots of local masters, and the module an executor's Python could not import."""
from __future__ import annotations

import os
import re


def local_cluster(master: str) -> tuple[int, int] | None:
    """(executors, cores each) of a ``local-cluster[N, C, MiB]`` master, else None."""
    found = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,.*\]", master)
    return (int(found.group(1)), int(found.group(2))) if found else None


def master_slots(master: str) -> int | None:
    """Task slots a local master has by its name (local[N], local[*], local-cluster)."""
    shape = local_cluster(master)
    if shape:
        return shape[0] * shape[1]
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\d+|\*)(?:\s*,\s*\d+)?\]", master)
    if not found:
        return None
    return (os.cpu_count() or 1) if found.group(1) == "*" else int(found.group(1))


def missing_module(text: str) -> str | None:
    """The module an executor's Python could not import, from Spark's error text."""
    found = re.search(r"No module named '([\w.]+)'", text)
    return found.group(1) if found else None


def missing_module_reason(module: str) -> str:
    return (f"the executors' Python cannot import {module!r}: install sparkddl with its "
            "dependencies (torch, pyarrow, pandas) in the Python the executors run "
            "(PYSPARK_PYTHON, or the cluster's libraries on Databricks)")
