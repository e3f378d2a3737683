"""Shared fixtures: one Spark session at a time, shared across the whole test run.

Spark allows one SparkContext per process, so tests that need local[2] and tests that need
local-cluster[2,1,1024] (separate executor JVMs) are ordered so that each session starts
once: unit tests first, then local, then cluster.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "local[2]"
CLUSTER = "local-cluster[2,1,1024]"
MASTERS = {"local": LOCAL, "cluster": CLUSTER}
CONNECT = "connect"

# executors run this venv's Python and can import the tests package (functions defined in
# test modules are pickled by reference)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)

_state: dict = {"master": None, "session": None}


def spark_session(master: str):
    """The shared session for ``master``, stopping the other one if it is running.
    ``connect``: a Spark Connect client of a local Connect server on local[2]."""
    if _state["master"] == master:
        return _state["session"]
    stop_spark()
    from pyspark.sql import SparkSession
    if master == CONNECT:
        spark = SparkSession.builder.remote(LOCAL).appName("sparkddl-tests").getOrCreate()
        _state.update(master=master, session=spark)
        return spark
    spark = (SparkSession.builder.master(master).appName("sparkddl-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.executor.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    _state.update(master=master, session=spark)
    return spark


def stop_spark() -> None:
    if _state["session"] is not None:
        _state["session"].stop()
    _state.update(master=None, session=None)


@pytest.fixture
def spark_local():
    return spark_session(LOCAL)


@pytest.fixture
def spark_cluster():
    return spark_session(CLUSTER)


@pytest.fixture
def spark_connect():
    """A Spark Connect session (no SparkContext on the client), last in the run."""
    pytest.importorskip("grpc", reason="the Spark Connect client packages (extra 'connect') "
                                       "are not installed")
    return spark_session(CONNECT)


@pytest.fixture(params=["local", "cluster"])
def spark(request):
    """Runs the test once on local[2] and once on local-cluster[2,1,1024]."""
    return spark_session(MASTERS[request.param])


def _order(item: pytest.Item) -> int:
    names = getattr(item, "fixturenames", ())
    param = getattr(getattr(item, "callspec", None), "params", {}).get("spark")
    if "spark_connect" in names:
        return 4
    if "spark_cluster" in names or param == "cluster":
        return 3
    if "spark_local" in names or param == "local":
        return 2
    return 1 if any(n.startswith("spark") for n in names) else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_order)


def pytest_sessionfinish(session, exitstatus) -> None:
    stop_spark()
