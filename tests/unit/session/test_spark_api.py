"""The pyspark installed has every call the session seam makes, classic and Connect, on each
stack (Spark 3.5 and 4.x). On Spark 3.5 no local Connect server can start here (pyspark 3.5
fetches its jar from Maven), so this is where Connect's branches meet Spark 3.5: the client's
classes, checked by their signatures."""
from __future__ import annotations

import inspect

import pytest


def _has(cls: type, *names: str) -> list[str]:
    return [n for n in names if not callable(getattr(cls, n, None))]


def test_the_classic_calls_of_the_seam_exist():
    from pyspark import BarrierTaskContext, SparkContext, TaskContext
    from pyspark.rdd import RDD
    from pyspark.sql import DataFrame

    assert _has(SparkContext, "addJobTag", "removeJobTag", "getJobTags", "cancelJobsWithTag",
                "setJobGroup", "parallelize") == []
    assert _has(RDD, "barrier", "withResources", "mapPartitions") == []
    assert _has(BarrierTaskContext, "allGather", "getTaskInfos", "barrier") == []
    assert _has(TaskContext, "resources", "partitionId") == []
    assert _has(DataFrame, "inputFiles", "mapInArrow") == []
    assert "barrier" in inspect.signature(DataFrame.mapInArrow).parameters


def test_the_connect_calls_of_the_seam_exist():
    pytest.importorskip("grpc", reason="the Spark Connect client packages (extra 'connect') "
                                       "are not installed")
    from pyspark.sql.connect.dataframe import DataFrame
    from pyspark.sql.connect.session import SparkSession

    from sparkddl.session import is_connect
    assert _has(SparkSession, "addTag", "removeTag", "getTags", "interruptTag", "range") == []
    assert "barrier" in inspect.signature(DataFrame.mapInArrow).parameters
    # what tells a Connect session apart is where its class lives, on every pyspark
    assert is_connect(SparkSession.__new__(SparkSession))
