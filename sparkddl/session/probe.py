"""The executors' Python, checked before the first job of a fit or a run.

Without it, an executor Python that lacks sparkddl (``PYSPARK_PYTHON`` unset, so Spark starts
``python3`` from the PATH) first fails deep inside the data preparation job, as two hundred
lines of Java and Python traceback ending in ``ModuleNotFoundError``. One task of one
partition instead imports sparkddl and torch on an executor and reports the Python it runs,
the versions it found and what failed; the driver compares them with its own and raises a
:class:`~sparkddl.errors.ClusterError` naming the executors' Python, what is missing or
different, and the fix. Checked once per session and executor Python.

The probe function is built so that cloudpickle sends its code by value: the executor does
not need sparkddl to unpickle it (a function of a sparkddl module would be pickled by
reference, and fail to unpickle exactly where the check is needed).
"""
from __future__ import annotations

import json
import logging
import sys
from typing import Any

from sparkddl.errors import ClusterError
from sparkddl.session.masters import missing_module

log = logging.getLogger(__name__)

SKIP_KEY = "spark.sparkddl.checkExecutorPython"
_checked: set[tuple[str, str]] = set()  # (session, executor Python) pairs found good

_PROBE_SOURCE = '''
def probe(rows):
    import importlib
    import json
    import sys
    for _ in rows:
        pass
    found = {"python": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]}
    for name in ("sparkddl", "torch"):
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "unknown")
        except BaseException as exc:
            found[name] = None
            found[name + "_error"] = "%s: %s" % (type(exc).__name__, exc)
    yield json.dumps(found)


def arrow_probe(batches):
    import pyarrow as pa
    for text in probe(batches):
        yield pa.RecordBatch.from_pydict({"found": [text]})
'''


def _probe_function(name: str) -> Any:
    """``probe`` (an RDD's mapPartitions) or ``arrow_probe`` (Connect's mapInArrow)."""
    namespace: dict[str, Any] = {"__name__": "sparkddl_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<sparkddl executor probe>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def executor_python_conf(ctx: Any) -> str:
    """What the session says the executors run. A Connect client's own environment says
    nothing about the server's executors: only the server's conf counts there."""
    import os
    named = ctx.getConf().get("spark.pyspark.python", None)
    if named:
        return str(named)
    if getattr(ctx, "is_connect", False):
        return ("the Python the Connect server starts for its executors (the server's "
                "PYSPARK_PYTHON or spark.pyspark.python)")
    return os.environ.get("PYSPARK_PYTHON") or (
        "python3 (Spark's default: neither PYSPARK_PYTHON nor spark.pyspark.python is set)")


def _session_key(ctx: Any) -> str:
    if getattr(ctx, "is_connect", False):
        return f"connect:{getattr(ctx.spark, 'session_id', id(ctx.spark))}"
    return f"classic:{ctx.sc.applicationId}"


def check_executor_python(ctx: Any) -> None:
    """Raise ClusterError unless an executor imports sparkddl and torch at the driver's
    versions (``spark.sparkddl.checkExecutorPython=false`` skips it)."""
    if str(ctx.getConf().get(SKIP_KEY, "true")).lower() == "false":
        return
    python = executor_python_conf(ctx)
    key = (_session_key(ctx), python)
    if key in _checked:
        return
    fix = (f"the executors run {python}. Point PYSPARK_PYTHON (or spark.pyspark.python) at "
           f"a Python with sparkddl installed, e.g. this driver's: {sys.executable}; on a "
           "cluster, install the same sparkddl and torch on every node (cluster libraries "
           f"on Databricks), or set {SKIP_KEY}=false to skip this check")
    try:
        found = json.loads(_run_probe(ctx))
    except Exception as exc:  # noqa: BLE001 - the executors could not even run the probe
        raise ClusterError(f"the executors' Python {_failure(str(exc))} (one task run "
                           f"before training found it); {fix}") from None
    problems = _compare(found)
    if problems:
        raise ClusterError(f"the executors' Python ({found.get('python')}, Python "
                           f"{found.get('version')}) {'; '.join(problems)}; {fix}")
    _checked.add(key)
    log.info("executors' Python %s: sparkddl %s, torch %s", found["python"],
             found["sparkddl"], found["torch"])


def _compare(found: dict[str, Any]) -> list[str]:
    import torch
    mine_sparkddl = sys.modules["sparkddl"].__version__  # this package, imported already
    problems = []
    for name, mine in (("sparkddl", mine_sparkddl), ("torch", torch.__version__)):
        theirs = found.get(name)
        if theirs is None:
            problems.append(f"cannot import {name} ({found.get(name + '_error', '')})")
        elif theirs != mine:
            problems.append(f"has {name} {theirs} where the driver has {mine}")
    return problems


def _run_probe(ctx: Any) -> str:
    if getattr(ctx, "is_connect", False):
        [row] = ctx.spark.range(0, 1, 1, 1).mapInArrow(_probe_function("arrow_probe"),
                                                       "found string").collect()
        return str(row["found"])
    [text] = ctx.sc.parallelize([0], 1).mapPartitions(_probe_function("probe")).collect()
    return str(text)


def _failure(text: str) -> str:
    """What a failed probe task says, in a few words: the module it could not import, or
    the last error line of its traceback."""
    module = missing_module(text)
    if module:
        return f"cannot import {module!r}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    return "failed: " + (errors[-1] if errors else lines[0] if lines else "unknown error")[:500]
