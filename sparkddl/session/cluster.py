"""What the rest of sparkddl asks of a Spark cluster, answered once per kind of session.

:func:`cluster_context` gives a :class:`ClassicContext` (a SparkContext in this process,
with its JVM) or a :class:`~sparkddl.session.connect.ConnectContext` (a Spark Connect
client: no SparkContext, no RDDs, no JVM here). Both answer the same questions, so callers
ask instead of testing which kind they hold:

- ``task_slots(profile)``: how many tasks can run at once, or None where the client cannot
  count them (then ``named_slots()``: what the master's name says, if anything);
- ``stage_profiles``: whether a stage may ask for resources of its own (stage-level
  scheduling; a Connect client's DataFrame stages take the session's task resources);
- ``replace_executor(id)``: ask Spark to stop offering an executor and replace it;
- ``job_group()`` / ``enter_group(group, description)``: the caller's job group, carried
  onto a stage's thread (job tags work alike on both: ``addJobTag`` and friends);
- ``run_barrier(entry, n, profile)``: a barrier stage of ``n`` tasks, what each yielded;
- ``channel_addresses()`` and ``unreachable(host, port)``: where the driver's channel
  listens, and whether executors can reach it;
- ``ship(value)``: a value for executors to read (a broadcast, or carried inline);
- ``partitions(df)``: a DataFrame's partition count, if the client can tell;
- ``driver_gpus()``: the GPUs Spark gave the driver, or None (a Connect client: none here);
- ``arrow_udfs``: whether UDFs may take and give Arrow arrays (``arrow_udf``: Spark 4.1 on
  both sides; pandas UDFs otherwise);
- ``after_cancel()``: what a session needs after sparkddl cancelled a job of Python tasks
  (Spark 3.5: its pool of Python workers cleared of closed ones);
- ``has_jvm``: pyspark's JVM-backed helpers (Hadoop paths, MLWriter's overwrite) work here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sparkddl.errors import ClusterError
from sparkddl.session.masters import master_slots

# jobs run at most to clear closed Python workers out of Spark 3.5's pool after a cancel
HEAL_JOBS = 3


def _nothing(rows: Any) -> Any:
    return iter(())


# where Spark keeps a thread's job tags, comma-separated (SparkContext.SPARK_JOB_TAGS, 3.5+)
JOB_TAGS_PROPERTY = "spark.job.tags"


class ConfSnapshot:
    """A SparkConf's entries as they were read: ``get`` and ``getAll`` as SparkConf's."""

    def __init__(self, entries: dict[str, str]):
        self.entries = entries

    @classmethod
    def parse(cls, text: str) -> "ConfSnapshot":
        """SparkConf.toDebugString: sorted ``key=value`` lines; a line without '=' continues
        the value before it (a value that holds a newline)."""
        entries: dict[str, str] = {}
        key: str | None = None
        for line in text.split("\n"):
            name, eq, value = line.partition("=")
            # the lines are sorted by key: one that sorts before the last key continues it
            if key is None or (eq and name and not any(c.isspace() for c in name)
                               and name > key):
                key = name
                entries[key] = value
            else:
                entries[key] += "\n" + line
        entries.pop("", None)
        return cls(entries)

    def get(self, key: str, default: Any = None) -> Any:
        return self.entries.get(key, default)

    def contains(self, key: str) -> bool:
        return key in self.entries

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self.entries.items())


@dataclass(frozen=True)
class Inline:
    """Stands in for a Broadcast where there are none (Spark Connect): ``.value`` travels
    with the function that holds it."""

    value: Any


_GROUP_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def at_least(version: str, wanted: tuple[int, int]) -> bool:
    """Whether a Spark ``version`` ("4.1.1", "4.2.0-preview") is ``wanted`` (major, minor) or
    later."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts) >= wanted


def visible_indices(addresses: list[str]) -> list[str]:
    """Spark's GPU addresses as CUDA device ids: an address is an index into
    ``CUDA_VISIBLE_DEVICES`` where that is set."""
    bad = [a for a in addresses if not a.isdigit()]
    if bad:
        raise ClusterError(f"the driver's GPU addresses {bad} are not device indices; make "
                           "the GPU discovery script print indices such as \"0\", \"1\"")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return addresses
    listed = visible.split(",")
    if any(int(a) >= len(listed) for a in addresses):
        raise ClusterError(f"the driver's GPU addresses {addresses} index past "
                           f"CUDA_VISIBLE_DEVICES={visible!r}; fix one or the other")
    return [listed[int(a)].strip() for a in addresses]


class ClassicContext:
    """A classic SparkContext with the cluster questions answered; every other attribute is
    the SparkContext's own."""

    is_connect = False
    has_jvm = True
    stage_profiles = True
    label = "spark"

    def __init__(self, sc: Any):
        self.sc = sc
        self._conf: ConfSnapshot | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sc, name)

    def getConf(self) -> "ConfSnapshot":  # noqa: N802 - SparkContext's name
        """The context's conf, read once per context in one call to the JVM (pyspark's
        ``getConf`` copies it entry by entry: ~120 calls, and a run asked seven times)."""
        if self._conf is None:
            self._conf = ConfSnapshot.parse(self.sc._conf.toDebugString())
        return self._conf

    def getJobTags(self) -> set[str]:  # noqa: N802 - SparkContext's name
        """This thread's job tags in one call (pyspark walks a Java set, whose end costs a
        Java exception: ~30 ms)."""
        text = self.sc.getLocalProperty(JOB_TAGS_PROPERTY) or ""
        return {tag for tag in text.split(",") if tag}

    def task_slots(self, profile: Any = None) -> int | None:
        jsc = self.sc._jsc.sc()
        java = (profile._java_resource_profile if profile is not None
                else jsc.resourceProfileManager().defaultResourceProfile())
        return int(jsc.maxNumConcurrentTasks(java))

    def named_slots(self) -> int | None:
        return master_slots(self.sc.master)

    @property
    def arrow_udfs(self) -> bool:
        """pyspark's ``arrow_udf`` (Spark 4.1): the JVM here is pyspark's own release."""
        import pyspark.sql.functions as functions
        return hasattr(functions, "arrow_udf") and at_least(self.sc.version, (4, 1))

    def driver_gpus(self) -> list[str] | None:
        """The GPUs Spark gave the driver (``spark.driver.resource.gpu.*``), as the CUDA
        indices this process sees (mapped through ``CUDA_VISIBLE_DEVICES`` where it is set,
        as pyspark maps them); None where Spark gave it none."""
        resource = self.sc.resources.get("gpu")
        if resource is None or not resource.addresses:
            return None
        return visible_indices(list(resource.addresses))

    def running_tasks(self, tag: str) -> int | None:
        """Tasks of the jobs tagged ``tag`` that run now (have a slot), from Spark's status
        tracker; None before Spark lists the job."""
        tracker = self.sc._jsc.sc().statusTracker()
        running = None
        for job in tracker.getJobIdsForTag(tag):
            info = tracker.getJobInfo(job)
            if info.isEmpty():
                continue
            for stage in info.get().stageIds():
                stage_info = tracker.getStageInfo(stage)
                if not stage_info.isEmpty():
                    running = (running or 0) + int(stage_info.get().numActiveTasks())
        return running

    def replace_executor(self, executor: str) -> bool:
        return bool(self.sc._jsc.sc().killAndReplaceExecutor(executor))

    def job_group(self) -> tuple[str | None, ...]:
        return tuple(self.sc.getLocalProperty(k) for k in _GROUP_KEYS)

    def enter_group(self, group: tuple[str | None, ...], description: str) -> None:
        group_id = group[0] if group else None
        if group_id:
            self.sc.setJobGroup(group_id, group[1] or description, interruptOnCancel=True)
        else:
            self.sc.setJobDescription(description)
            self.sc.setInterruptOnCancel(True)

    def run_barrier(self, entry: Any, num_workers: int, profile: Any = None) -> list[bytes]:
        rdd = self.sc.parallelize(range(num_workers), num_workers)
        if profile is not None:  # this stage alone asks for GPUs
            rdd = rdd.withResources(profile)
        return rdd.barrier().mapPartitions(entry).collect()

    def channel_addresses(self) -> tuple[str, str]:
        conf = self.getConf()
        host = conf.get("spark.driver.host", "")
        return host, conf.get("spark.driver.bindAddress", host)

    def unreachable(self, host: str, port: int) -> str:
        return ""  # executors reach the driver: Spark itself depends on it

    def ship(self, value: Any) -> Any:
        return self.sc.broadcast(value)

    def partitions(self, df: Any) -> int | None:
        return int(df.rdd.getNumPartitions())

    def set_log_level(self, level: str) -> None:
        self.sc.setLogLevel(level)

    def after_cancel(self) -> None:
        """Once a job whose tasks ran Python was cancelled with interruption: on Spark 3.5
        the killed tasks' Python workers can go back to the idle pool with their sockets
        closed, and the next Python tasks that take them fail with "java.net.SocketException:
        Socket is closed" (in local mode, where a task is not retried, the next fit of the
        session failed so). Small jobs take those workers out of the pool, until one runs
        clean. Spark 4's runner does not pool them."""
        if at_least(self.sc.version, (4, 0)):
            return
        tasks = max(1, int(self.sc.defaultParallelism))
        for _ in range(HEAL_JOBS):
            try:
                self.sc.parallelize(range(tasks), tasks).mapPartitions(_nothing).count()
                return
            except Exception:  # noqa: BLE001 - a closed worker taken out: try again
                continue
