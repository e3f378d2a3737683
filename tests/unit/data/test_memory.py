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
