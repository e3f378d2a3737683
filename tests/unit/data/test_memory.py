"""Sizing the materialization write to the heap its tasks share (arithmetic, no Spark)."""
from __future__ import annotations

import pytest

from sparkddl.data import memory


class Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class Context:
    """What the sizing reads of a SparkContext: its master, parallelism and settings."""

    def __init__(self, master: str, parallelism: int = 2, **conf: str):
        self.master, self.defaultParallelism = master, parallelism
        self._conf = Conf({k.replace("_", "."): v for k, v in conf.items()})

    def getConf(self) -> Conf:  # noqa: N802 - SparkContext's name
        return self._conf


@pytest.mark.parametrize("text,expected", [("512m", 512 << 20), ("4g", 4 << 30),
                                           ("1536", 1536 << 20), ("2G", 2 << 30),
                                           ("100k", 100 << 10), ("3gb", 3 << 30)])
def test_spark_memory_sizes(text, expected):
    assert memory.memory_bytes(text) == expected


def test_a_bad_memory_size_says_what_it_got():
    with pytest.raises(ValueError, match="'lots'"):
        memory.memory_bytes("lots")


def test_local_tasks_share_the_driver_heap_and_executors_their_own():
    local = Context("local[16]", 16, spark_driver_memory="1g")
    assert memory.heap_setting(local) == ("spark.driver.memory", "1g")
    assert memory.tasks_per_heap(local) == 16
    cluster = Context("spark://h:7077", 8, spark_executor_memory="4g",
                      spark_executor_cores="8", spark_task_cpus="2")
    assert memory.heap_setting(cluster) == ("spark.executor.memory", "4g")
    assert memory.tasks_per_heap(cluster) == 4
    assert memory.heap_setting(Context("local[2]")) == ("spark.driver.memory", "1g")


def test_row_groups_shrink_until_every_open_writer_fits_the_heap():
    preferred = 16 << 20
    # 16 tasks x 2 writers x 16 MiB would not fit a quarter of (1 GiB - 300 MiB)
    small = memory.row_group_bytes(Context("local[16]", 16, spark_driver_memory="1g"), preferred)
    assert small < preferred
    assert 16 * memory.WRITERS_PER_TASK * small <= \
        memory.WRITER_SHARE * ((1 << 30) - memory.RESERVED_BYTES)
    # a heap that holds them keeps the preferred size; a tiny one stops at the floor
    assert memory.row_group_bytes(Context("local[2]", 2, spark_driver_memory="4g"),
                                  preferred) == preferred
    assert memory.row_group_bytes(Context("local[64]", 64, spark_driver_memory="512m"),
                                  preferred) == 1 << 20


def test_a_driver_jvm_that_spark_3_5_ended_for_a_tasks_heap_names_the_setting():
    """Spark 3.5 wraps a task's OutOfMemoryError met while reading a file, so its driver JVM
    ends with exit code 50 (uncaught error), where Spark 4 ends with 52: both are the heap."""
    from types import SimpleNamespace

    import pytest
    from py4j.protocol import Py4JError

    from sparkddl.data.memory import job_errors
    from sparkddl.errors import ClusterError

    def context(code: int) -> SimpleNamespace:
        proc = SimpleNamespace(wait=lambda timeout: code)
        return SimpleNamespace(master="local[2]", defaultParallelism=2,
                               _gateway=SimpleNamespace(proc=proc),
                               getConf=lambda: {"spark.driver.memory": "512m"})

    for code in (50, 52):
        with pytest.raises(ClusterError, match=r"sizing the training data ran out of Java heap "
                                               r"with spark\.driver\.memory=512m shared by 2 "
                                               r"tasks at once on local\[2\] .*OutOfMemoryError"):
            with job_errors(context(code), "sizing the training data"):
                raise Py4JError("py4j does not exist in the JVM")
    with pytest.raises(Py4JError):  # any other end of the JVM is not called a heap
        with job_errors(context(1), "sizing the training data"):
            raise Py4JError("py4j does not exist in the JVM")
