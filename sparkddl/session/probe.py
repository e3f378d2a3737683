"""The executors' Python, checked before the first job of a fit or a run.

Without it, an executor Python that lacks sparkddl (``PYSPARK_PYTHON`` unset, so Spark starts
``python3`` from the PATH) first fails deep inside the data preparation job, as two hundred
lines of Java and Python traceback ending in ``ModuleNotFoundError``. A small job (one task
per rank to come) instead imports sparkddl and torch on the executors and reports the Python
it runs, the versions it found and what failed; the driver compares them with its own and
raises a :class:`~sparkddl.errors.ClusterError` naming the executors' Python, what is missing
or different, and the fix. Checked once per session and executor Python, on a thread of its
own while the driver checks the model and optimizer; nothing touches the data or the store
before it has passed. Its tasks leave their Python workers with torch (and, for a fit, what
a rank imports first) loaded, and Spark hands those workers to the ranks.

The probe function is built so that cloudpickle sends its code by value: the executor does
not need sparkddl to unpickle it (a function of a sparkddl module would be pickled by
reference, and fail to unpickle exactly where the check is needed).
"""
from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any, Callable

from sparkddl.errors import ClusterError
from sparkddl.session.masters import missing_module

log = logging.getLogger(__name__)

SKIP_KEY = "spark.sparkddl.checkExecutorPython"
_checked: set[tuple[str, str]] = set()  # (session, executor Python) pairs found good

# what a fit's ranks import first, imported by the probe too where a fit asks: Spark reuses a
# task's Python worker for the next task, so the ranks that follow start with them loaded
# (torch.optim's first optimizer imports torch._dynamo: ~1.4 s on a 2-core machine)
FIT_IMPORTS = ("sparkddl.task.bootstrap", "sparkddl.train.loop", "torch._dynamo")

_PROBE_SOURCE = '''
WARM = ()


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
    if found["sparkddl"]:
        try:  # the worker's next tasks (the ranks) start ~0.1 s sooner
            importlib.import_module("sparkddl.task.archives").keep_spark_archives()
        except Exception:
            pass
    if found["sparkddl"] and found["torch"]:
        for name in WARM:
            try:
                importlib.import_module(name)
            except Exception:  # the rank that needs it says why
                pass
    if found["sparkddl"]:
        try:  # what was imported, out of the collection pyspark runs after each task
            importlib.import_module("sparkddl.task.frozen").freeze()
        except Exception:
            pass
    yield json.dumps(found)


def arrow_probe(batches):
    import pyarrow as pa
    for text in probe(batches):
        yield pa.RecordBatch.from_pydict({"found": [text]})
'''


def _probe_function(name: str, warm: tuple[str, ...] = ()) -> Any:
    """``probe`` (an RDD's mapPartitions) or ``arrow_probe`` (Connect's mapInArrow), which
    also imports ``warm`` once sparkddl and torch import."""
    namespace: dict[str, Any] = {"__name__": "sparkddl_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<sparkddl executor probe>", "exec"), namespace)  # noqa: S102
    namespace["WARM"] = tuple(warm)
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
    start_check(ctx)()


def start_check(ctx: Any, tasks: int = 1, warm: tuple[str, ...] = ()) -> Callable[[], None]:
    """Start the check of the executors' Python on a thread of its own, so that the driver's
    own work goes on beside it, and return what waits for it (and raises its ClusterError).
    ``tasks`` tasks run it, which leaves that many Python workers with sparkddl, torch and
    ``warm`` imported for the ranks that follow. Nothing to wait for where this session's
    executor Python was checked already or the check is off."""
    if str(ctx.getConf().get(SKIP_KEY, "true")).lower() == "false":
        return _nothing
    python = executor_python_conf(ctx)
    key = (_session_key(ctx), python)
    if key in _checked:
        return _nothing
    group, tags = ctx.job_group(), ctx.getJobTags()
    outcome: list[BaseException | None] = []

    def check() -> None:
        try:  # the caller's job group and tags: cancelling them cancels the check too
            ctx.enter_group(group, "sparkddl: the executors' Python check")
            for tag in tags:
                ctx.addJobTag(tag)
            _check(ctx, python, key, max(1, tasks), warm)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - raised again by the caller's wait
            outcome.append(exc)

    thread = threading.Thread(target=check, daemon=True, name="sparkddl-executor-check")
    thread.start()

    def wait() -> None:
        thread.join()
        if outcome and outcome[0] is not None:
            raise outcome[0]

    return wait


def _nothing() -> None:
    pass


def _check(ctx: Any, python: str, key: tuple[str, str], tasks: int,
           warm: tuple[str, ...]) -> None:
    fix = (f"the executors run {python}. Point PYSPARK_PYTHON (or spark.pyspark.python) at "
           f"a Python with sparkddl installed, e.g. this driver's: {sys.executable}; on a "
           "cluster, install the same sparkddl and torch on every node (cluster libraries "
           f"on Databricks), or set {SKIP_KEY}=false to skip this check")
    try:
        reports = [json.loads(text) for text in _run_probe(ctx, tasks, warm)]
    except Exception as exc:  # noqa: BLE001 - the executors could not even run the probe
        raise ClusterError(f"the executors' Python {_failure(str(exc))} (a task run before "
                           f"training found it); {fix}") from None
    for found in reports:
        problems = _compare(found)
        if problems:
            raise ClusterError(f"the executors' Python ({found.get('python')}, Python "
                               f"{found.get('version')}) {'; '.join(problems)}; {fix}")
    _checked.add(key)
    found = reports[0]
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


def _run_probe(ctx: Any, tasks: int = 1, warm: tuple[str, ...] = ()) -> list[str]:
    """What each of ``tasks`` tasks found."""
    if getattr(ctx, "is_connect", False):
        rows = ctx.spark.range(0, tasks, 1, tasks).mapInArrow(
            _probe_function("arrow_probe", warm), "found string").collect()
        return [str(row["found"]) for row in rows]
    return [str(text) for text in ctx.sc.parallelize(range(tasks), tasks).mapPartitions(
        _probe_function("probe", warm)).collect()]


def _failure(text: str) -> str:
    """What a failed probe task says, in a few words: the module it could not import, or
    the last error line of its traceback."""
    module = missing_module(text)
    if module:
        return f"cannot import {module!r}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    return "failed: " + (errors[-1] if errors else lines[0] if lines else "unknown error")[:500]
