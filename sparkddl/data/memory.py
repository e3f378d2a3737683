"""The Java heap that preparation jobs run in: what the write holds in flight is sized to it,
and an out-of-memory failure becomes an error that names the setting to raise."""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Any, Iterator

from sparkddl.errors import ClusterError, DataError

log = logging.getLogger(__name__)

# what Spark keeps for itself out of every heap (its "reserved memory")
RESERVED_BYTES = 300 << 20
# the share of the rest that open Parquet writers may fill (Spark's own execution and storage
# memory, and the Arrow batches coming from Python, need the remainder)
WRITER_SHARE = 0.25
# a task of the partitioned write keeps a train and a validation file open
WRITERS_PER_TASK = 2
DEFAULT_HEAP = "1g"
_UNITS = {"": 1 << 20, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_bytes(text: str) -> int:
    """A Spark memory setting ("512m", "4g", "1536": MiB without a unit) in bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", text.lower())
    if match is None:
        raise ValueError(f"not a Spark memory size: {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def heap_setting(sc: Any) -> tuple[str, str]:
    """The setting that sizes the heap tasks run in, and its value: the driver's in local
    mode (tasks run inside the driver JVM), the executors' otherwise."""
    key = "spark.driver.memory" if sc.master.startswith("local") else "spark.executor.memory"
    return key, sc.getConf().get(key, DEFAULT_HEAP)


def tasks_per_heap(sc: Any) -> int:
    """How many tasks share one heap at a time."""
    if sc.master.startswith("local"):
        return max(1, int(sc.defaultParallelism))
    conf = sc.getConf()
    cores = int(conf.get("spark.executor.cores", "1"))
    return max(1, cores // max(1, int(float(conf.get("spark.task.cpus", "1")))))


def row_group_bytes(sc: Any, preferred: int, smallest: int = 1 << 20) -> int:
    """``preferred``, or less where the heap cannot hold a buffered row group for every open
    Parquet writer of every task that runs at once."""
    key, value = heap_setting(sc)
    tasks = tasks_per_heap(sc)
    budget = (memory_bytes(value) - RESERVED_BYTES) * WRITER_SHARE
    fits = int(budget // (tasks * WRITERS_PER_TASK))
    if fits >= preferred:
        return preferred
    chosen = max(smallest, fits)
    log.info("row groups of %d KiB instead of %d KiB: %d tasks at once share %s=%s", chosen >> 10,
             preferred >> 10, tasks, key, value)
    return chosen


# how Spark's uncaught-exception handler ends a JVM that ran out of memory, and one whose
# task thread died of another error: Spark 3.5 wraps a task's OutOfMemoryError met while
# reading a file in a SparkException ("Encountered error while reading file"), so its JVM
# ends with 50 where Spark 4 ends with 52
OOM_EXIT_CODE = 52
UNCAUGHT_EXIT_CODE = 50
JVM_EXIT_WAIT_S = 10.0
# what Spark's error says when a file it listed is gone before a task reads it (a lost
# shuffle file, under a blockmgr- folder, is no input's)
FILE_GONE = ("FILE_NOT_EXIST", "java.io.FileNotFoundException")


@contextmanager
def job_errors(sc: Any, what: str) -> Iterator[None]:
    """Turn a Spark job failure caused by java.lang.OutOfMemoryError into a ClusterError that
    names the heap setting, its value, and how to fix it; one caused by an input file deleted
    under the DataFrame into a DataError naming the file. In local mode such an error ends the
    driver JVM itself (exit code 52), so everything the message needs is read beforehand."""
    key, value = heap_setting(sc)
    tasks, master = tasks_per_heap(sc), sc.master
    gateway = getattr(getattr(sc, "_gateway", None), "proc", None)  # a JVM pyspark started
    try:
        yield
    except Exception as exc:  # Py4JJavaError, pyspark's captured errors, a dead gateway
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - the JVM that held the message is gone
            text = ""
        gone = next((line.strip() for line in text.splitlines()
                     if any(m in line for m in FILE_GONE) and "blockmgr-" not in line), None)
        if gone:
            raise DataError(f"{what} failed: a file the DataFrame reads is gone ({gone[:300]}); "
                            "it was deleted or overwritten after the DataFrame was defined: "
                            "define the DataFrame again (spark.read...) and fit on that") from None
        code = _exit_code(gateway, exc)
        died = code in (OOM_EXIT_CODE, UNCAUGHT_EXIT_CODE)
        if "OutOfMemoryError" not in text and not died:
            raise
        flag = "--driver-memory" if key == "spark.driver.memory" else "--executor-memory"
        seen = next((line.strip() for line in text.splitlines() if "OutOfMemoryError" in line),
                    "java.lang.OutOfMemoryError")
        ended = "; the driver JVM exited with it, start a new session" if died else ""
        if code == UNCAUGHT_EXIT_CODE and "OutOfMemoryError" not in text:
            seen = ("the driver JVM exited with code 50, which Spark 3.5 gives a task's "
                    "java.lang.OutOfMemoryError met while reading a file")
            ended = "; start a new session"
        raise ClusterError(
            f"{what} ran out of Java heap with {key}={value} shared by {tasks} tasks at once on "
            f"{master} ({seen[:300]}{ended}); raise {key} (the preset's [spark].conf, "
            f"spark-submit {flag}, or spark-defaults.conf) or run fewer tasks at once") from None


def _exit_code(gateway: Any, exc: BaseException) -> int | None:
    """The exit code of a driver JVM that pyspark started, if the failure is its loss (the
    JVM runs its shutdown hooks before it exits: give it a moment)."""
    import subprocess

    from py4j.protocol import Py4JError

    if gateway is None or not isinstance(exc, (Py4JError, ConnectionError)):
        return None
    try:
        return gateway.wait(timeout=JVM_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return None
