"""Spark Connect sessions: no SparkContext and no RDDs on the client, so the barrier stage
goes through the DataFrame API (``mapInArrow(..., barrier=True)``), is cancelled through a
job tag (``interruptTag``, behind SparkContext's job-tag names), and the few facts the
preflight checks need come from the session's conf.

The ranks still report to a channel the client opens, so every property of a classic
session holds (live logs, fail-fast, heartbeats, snapshots), provided the executors can
reach the client. That is checked before the stage starts, by one small task connecting to
the channel. Where they cannot (or ``spark.sparkddl.channel.reachable=false`` says so), the
stage runs offline, and says so once: the ranks rendezvous through Spark's allGather, what
they would have sent comes back in the stage's rows when it ends (logs, epoch rows,
snapshot notices, rank 0's result) and is handed to the same handlers, and a failure is
Spark's own (the barrier stage fails as a whole, with the rank's Python traceback).
"""
from __future__ import annotations

import functools
import socket
from typing import Any, Iterable, Iterator

from sparkddl.errors import ClusterError
from sparkddl.session.cluster import ClassicContext, Inline, at_least
from sparkddl.session.masters import master_slots, missing_module, missing_module_reason

REACHABLE_KEY = "spark.sparkddl.channel.reachable"  # "false": do not even try
HOST_KEY = "spark.sparkddl.channel.host"  # the address executors reach this client at
PROBE_TIMEOUT_S = 5.0
RESULT_SCHEMA = "rank int, result binary"


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client without a SparkContext), or
    the :class:`ConnectContext` of one."""
    return getattr(spark, "is_connect", False) is True or \
        type(spark).__module__.startswith("pyspark.sql.connect")


class ConnectContext:
    """What the launch path asks of a SparkContext, answered for a Connect session: the
    master and the conf (read through the session), the stage and its cancellation; the
    cluster questions of :mod:`sparkddl.session.cluster`, as far as a client can answer."""

    is_connect = True
    has_jvm = False
    stage_profiles = False
    label = "spark connect session"

    def __init__(self, spark: Any):
        self.spark = spark
        self.master = spark.conf.get("spark.master", "")

    def getConf(self) -> "_Conf":  # noqa: N802 - SparkContext's name
        return _Conf(self.spark)

    @property
    def defaultParallelism(self) -> int:  # noqa: N802 - SparkContext's name
        return master_slots(self.master) or int(self.getConf().get(
            "spark.default.parallelism", "2"))

    def task_slots(self, profile: Any = None) -> int | None:
        return None  # the client cannot count them: Spark waits for them itself

    def running_tasks(self, tag: str) -> int | None:
        return None  # no status tracker here: the ranks' hellos tell instead

    def named_slots(self) -> int | None:
        return master_slots(self.master)

    def replace_executor(self, executor: str) -> bool:
        return False  # no SparkContext to ask

    @property
    def arrow_udfs(self) -> bool:
        """The client's ``arrow_udf`` and a server of Spark 4.1 or later to run it."""
        import pyspark.sql.functions as functions
        return hasattr(functions, "arrow_udf") and at_least(self.spark.version, (4, 1))

    def driver_gpus(self) -> list[str] | None:
        return None  # the server's driver is not this process: torch counts this host's

    def job_group(self) -> tuple[str | None, ...]:
        return ()  # job groups are a SparkContext's; Connect has tags only

    def enter_group(self, group: tuple[str | None, ...], description: str) -> None:
        pass

    def channel_addresses(self) -> tuple[str, str]:
        """The client's own address: the server's driver host is not this process."""
        return channel_host(self.spark)

    def ship(self, value: Any) -> Any:
        return Inline(value)  # no broadcasts: the value travels inside the function

    def partitions(self, df: Any) -> int | None:
        return None  # no RDD to ask

    def set_log_level(self, level: str) -> None:
        pass  # the server's logs are the server's

    def after_cancel(self) -> None:
        pass  # the server's Python workers are the server's

    def run_barrier(self, entry: Any, num_workers: int, profile: Any = None) -> list[bytes]:
        """Run ``entry(rows) -> iterator of bytes`` as a barrier stage of ``num_workers``
        tasks (under this thread's tags); what each task yielded, in rank order. ``profile``
        is always None here (no stage_profiles)."""
        rows = (self.spark.range(0, num_workers, 1, num_workers)
                .mapInArrow(functools.partial(_arrow_entry, entry), RESULT_SCHEMA,
                            barrier=True)
                .collect())
        return [bytes(r["result"]) for r in sorted(rows, key=lambda r: r["rank"])]

    # job tags, under SparkContext's names: a Connect client's tags are per thread too
    def addJobTag(self, tag: str) -> None:  # noqa: N802
        self.spark.addTag(tag)

    def removeJobTag(self, tag: str) -> None:  # noqa: N802
        self.spark.removeTag(tag)

    def getJobTags(self) -> set[str]:  # noqa: N802
        return set(self.spark.getTags())

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802
        self.spark.interruptTag(tag)

    def unreachable(self, host: str, port: int) -> str:
        """Why the executors cannot reach the channel at (host, port), or '' if they can:
        one small task tries to connect (unless the setting says not to bother)."""
        if self.getConf().get(REACHABLE_KEY, "true").lower() == "false":
            return f"{REACHABLE_KEY}=false"
        probe = functools.partial(_probe, host, port)
        try:
            [row] = self.spark.range(0, 1, 1, 1).mapInArrow(probe, "error string").collect()
        except Exception as exc:  # the first job: executors without sparkddl fail here
            module = missing_module(str(exc))
            if module is None:
                raise
            raise ClusterError(missing_module_reason(module)) from None
        return f"they cannot connect to {host}:{port}: {row['error']}" if row["error"] else ""


class _Conf:
    def __init__(self, spark: Any):
        self.spark = spark

    def get(self, key: str, default: Any = None) -> Any:
        try:
            value = self.spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a key the server does not know
            value = None
        return default if value is None else value

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self.spark.conf.getAll.items())


def channel_host(spark: Any) -> tuple[str, str]:
    """(the address executors reach this client at, the address to listen on): the setting
    (listening on every interface, as behind NAT the address may not be local), else the
    local address of the route towards the Connect server (loopback for a local server)."""
    configured = _Conf(spark).get(HOST_KEY, "")
    if configured:
        return configured, "0.0.0.0"
    server = _server_host(spark)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((server, 9))  # no packet is sent: this only picks the route
            address = s.getsockname()[0]
    except OSError:
        address = socket.gethostname()
    return address, address


def _server_host(spark: Any) -> str:
    try:
        host = spark.client.host or ""
    except Exception:  # noqa: BLE001 - an older client without the property
        host = ""
    return "127.0.0.1" if host in ("localhost", "") else host


def _arrow_entry(entry: Any, batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    rank = BarrierTaskContext.get().partitionId()
    for value in entry(iter(batches)):
        yield pa.RecordBatch.from_pydict({"rank": [rank], "result": [value]},
                                         schema=pa.schema([("rank", pa.int32()),
                                                           ("result", pa.binary())]))


def _probe(host: str, port: int, batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa
    for _ in batches:
        pass
    error = ""
    try:  # the channel counts the probe as a connection that never authenticated
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    yield pa.RecordBatch.from_pydict({"error": [error]})


def cluster_context(spark: Any) -> Any:
    """A ClassicContext around a classic session's SparkContext, or a ConnectContext for a
    Connect session (a context already made is returned as it is)."""
    if isinstance(spark, (ConnectContext, ClassicContext)):
        return spark
    if is_connect(spark):
        return ConnectContext(spark)
    sc = getattr(spark, "sparkContext", spark)  # a session, or a SparkContext already
    return ClassicContext(sc)
