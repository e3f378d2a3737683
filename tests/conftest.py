"""Shared fixtures: one Spark session at a time, shared across the whole test run.

Spark allows one SparkContext per process, so tests that need local[2] and tests that need
local-cluster[2,1,1024] (separate executor JVMs) are ordered so that each session starts
once: unit tests first, then local, then cluster.
"""
from __future__ import annotations

import faulthandler
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
# The JVMs of the suite (the shared sessions' drivers and executors, every spark-submit a test
# starts) live seconds to minutes on tiny data: C1 alone and the serial collector cost them less
# CPU than C2's compiles and G1's threads on this 2-core machine (a cold session and three
# small fits: 33-36 s against 38-42). Flags of the JVM, not Spark settings; the test of running
# out of heap drops them (the serial collector fits more in a small heap than G1).
# SPARK_SUBMIT_OPTS reaches every driver JVM spark-submit launches, pyspark's own included
# (the docs' pages inherit it: JVM tuning that no page's code sees); executors get
# spark.executor.extraJavaOptions
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if FAST_JVM not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = \
        f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {FAST_JVM}".strip()

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
             .config("spark.executor.extraJavaOptions", FAST_JVM)
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


def local_connect_server_problem() -> str | None:
    """Why no local Spark Connect server can start here, or None: pyspark 4 ships the server's
    jar, pyspark 3.5's ``remote("local")`` fetches it from Maven at start (no network here)."""
    import pyspark
    if int(pyspark.__version__.split(".")[0]) < 4:
        return (f"pyspark {pyspark.__version__} ships no Spark Connect server (3.5 fetches its "
                "jar from Maven, which this machine cannot reach); the Connect branches on "
                "Spark 3.5 are tested on the client, in tests/unit/session")
    return None


@pytest.fixture
def spark_connect():
    """A Spark Connect session (no SparkContext on the client), last in the run."""
    pytest.importorskip("grpc", reason="the Spark Connect client packages (extra 'connect') "
                                       "are not installed")
    problem = local_connect_server_problem()
    if problem:
        pytest.skip(problem)
    return spark_session(CONNECT)


@pytest.fixture(params=["local", "cluster"])
def spark(request):
    """Runs the test once on local[2] and once on local-cluster[2,1,1024]."""
    return spark_session(MASTERS[request.param])


@pytest.fixture
def mlflow_store(tmp_path):
    """A real MLflow tracking store (sqlite, artifacts under tmp_path) as the current tracking
    URI and experiment; MLflow's globals and environment variables are restored after."""
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")
    saved = utils._tracking_uri, fluent._active_experiment_id, \
        {k: os.environ.get(k) for k in names}
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow.set_experiment(experiment_id=mlflow.create_experiment(
        "sparkddl-tests", artifact_location=(tmp_path / "artifacts").as_uri()))
    try:
        yield mlflow.tracking.MlflowClient()
    finally:
        while mlflow.active_run():
            mlflow.end_run()
        utils.set_tracking_uri(saved[0])
        fluent._active_experiment_id = saved[1]
        for k, v in saved[2].items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


# pytest-timeout's SIGALRM cannot always stop a hung test: the signal may land on another
# thread while the main thread sits in a socket read (a py4j call waiting on a wedged Spark
# job), and then nothing interrupts the read. So a second, hard limit: past the test's
# timeout plus this grace, faulthandler's own thread prints every thread's stack and ends
# the run, so CI fails in minutes with the evidence instead of hanging until it is killed.
HARD_LIMIT_GRACE_S = 120
_real_stderr: list = []  # stderr as it was before pytest captured it


def pytest_configure(config) -> None:
    _real_stderr.append(os.fdopen(os.dup(2), "w"))  # not captured here, unlike at import


@pytest.fixture(autouse=True)
def _hard_time_limit(request):
    marker = request.node.get_closest_marker("timeout")
    limit = marker.args[0] if marker and marker.args else request.config.getini("timeout")
    if not limit or not _real_stderr:
        yield
        return
    faulthandler.dump_traceback_later(float(limit) + HARD_LIMIT_GRACE_S, exit=True,
                                      file=_real_stderr[0])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _free_disk() -> str:
    import shutil
    import tempfile
    return ", ".join(f"{where} {shutil.disk_usage(where).free / 2**30:.1f} GiB "
                     f"({os.statvfs(where).f_favail:,} inodes)"
                     for where in dict.fromkeys([tempfile.gettempdir(), str(ROOT)]))


def pytest_report_header(config) -> str:
    # when tests fail all at once, free disk is the first thing to rule out
    return f"free disk: {_free_disk()}"


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"free disk at the end: {_free_disk()}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_order)


def pytest_sessionfinish(session, exitstatus) -> None:
    stop_spark()
