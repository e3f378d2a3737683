"""Driver-side checks that run before anything is launched.

A barrier stage that asks for more slots than the cluster has waits forever, and one that
meets dynamic allocation or missing GPU resources fails late and obscurely; these checks
turn each case into a clear error while nothing is running yet.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from sparkddl.errors import ClusterError, ConfigError
from sparkddl.session import ClassicContext, cluster_context
from sparkddl.session.masters import local_cluster
from sparkddl.session.probe import start_check

log = logging.getLogger(__name__)

# executors of a freshly started cluster register over a few seconds
EXECUTOR_WAIT_S = 30.0


def check_num_workers(num_workers: Any, name: str = "num_workers") -> int:
    """``num_workers``, a positive integer (``name``: the caller's word for it)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"{name} must be a positive integer, got {num_workers!r}")
    return num_workers


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def check_dynamic_allocation(conf: Mapping[str, str], master: str) -> None:
    """Spark refuses barrier stages under dynamic allocation (it may remove executors
    mid-stage); local masters ignore the setting, as Spark itself does."""
    enabled = conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true"
    if enabled and not is_local_master(master):
        raise ClusterError(
            "barrier-mode training cannot run with spark.dynamicAllocation.enabled=true "
            f"(master {master}): Spark may remove executors in the middle of the stage; set "
            "spark.dynamicAllocation.enabled=false for this application, with a fixed number "
            "of executors (spark.executor.instances)")


def _amount(conf: Mapping[str, str], key: str) -> float:
    try:
        return float(conf.get(key, "") or 0)
    except ValueError:
        return 0.0


def check_gpu_conf(conf: Mapping[str, str], use_gpu: bool) -> None:
    """Local masters: Spark assigns no GPUs there unless tasks ask for them."""
    if not use_gpu:
        return
    amount = conf.get("spark.task.resource.gpu.amount", "")
    if _amount(conf, "spark.task.resource.gpu.amount") <= 0:
        raise ClusterError(
            "use_gpu=True but no GPU task resources are configured "
            f"(spark.task.resource.gpu.amount={amount or 'unset'}); set "
            "spark.executor.resource.gpu.amount, spark.executor.resource.gpu.discoveryScript "
            "and spark.task.resource.gpu.amount, or run with use_gpu=False")


def asks_for_gpus(sc: Any) -> bool:
    """Whether the cluster gives tasks GPUs: executors with GPUs (cluster masters) or GPU
    task resources (local masters); for APIs that take no use_gpu (HorovodRunner)."""
    conf = dict(cluster_context(sc).getConf().getAll())
    return _amount(conf, "spark.executor.resource.gpu.amount") >= 1 or \
        _amount(conf, "spark.task.resource.gpu.amount") > 0


@dataclass(frozen=True)
class GpuStage:
    """How the training stage gets its GPUs. ``cpus`` set: through a stage-level resource
    profile of 1 GPU and ``cpus`` CPUs per task, so every other job (preparation, sizing,
    ``transform``) stays a CPU task; None: the default profile already gives each task its
    GPU. ``line`` is the preflight's one-line account."""

    cpus: int | None
    line: str


def gpu_stage(conf: Mapping[str, str], master: str, use_gpu: bool,
              executor_cores: int | None) -> GpuStage | None:
    """Decide how the training stage asks for GPUs (None without ``use_gpu``).

    Cluster masters (standalone, YARN, Kubernetes) schedule task-only resource profiles
    when dynamic allocation is off (Spark >= 3.4/3.5), so the executors need GPUs
    (``spark.executor.resource.gpu.amount``) but tasks in general do not: with
    ``spark.task.resource.gpu.amount`` unset or below 1, the training stage alone asks for
    one whole GPU per rank (two ranks never share one) and ``cores / GPUs`` of its
    executor's CPUs (``spark.task.cpus`` where set explicitly above 1). With it at 1 or
    more every task has a GPU already, and the stage keeps the default profile."""
    if not use_gpu:
        return None
    if is_local_master(master):
        check_gpu_conf(conf, use_gpu)
        return GpuStage(None, "GPU: local master; ranks take the visible GPUs by local rank")
    executor_gpus = _amount(conf, "spark.executor.resource.gpu.amount")
    if executor_gpus < 1:
        raise ClusterError(
            f"use_gpu=True but the executors of {master} have no GPUs "
            "(spark.executor.resource.gpu.amount="
            f"{conf.get('spark.executor.resource.gpu.amount') or 'unset'}); set "
            "spark.executor.resource.gpu.amount to the GPUs of each executor and "
            "spark.executor.resource.gpu.discoveryScript (on a standalone cluster also "
            "spark.worker.resource.gpu.amount and spark.worker.resource.gpu.discoveryScript), "
            "or run with use_gpu=False")
    task_gpus = _amount(conf, "spark.task.resource.gpu.amount")
    if task_gpus >= 1:
        return GpuStage(None, (
            f"GPU: every task gets {task_gpus:g} GPU(s) (spark.task.resource.gpu.amount), "
            "so the training stage uses the default resource profile; preparation and "
            "transform tasks hold GPUs too: set spark.task.resource.gpu.amount below 1 (or "
            "unset it) to run them as CPU tasks"))
    task_cpus = int(_amount(conf, "spark.task.cpus"))
    if task_cpus > 1:
        cpus, why = task_cpus, "spark.task.cpus"
    else:
        cpus = max(1, (executor_cores or 1) // int(executor_gpus))
        why = f"{executor_cores or '?'} executor cores / {int(executor_gpus)} GPUs"
    return GpuStage(cpus, (
        f"GPU: the training stage asks for 1 GPU and {cpus} CPU(s) per rank ({why}) through "
        "a stage-level resource profile; preparation, sizing and transform jobs run as CPU "
        "tasks (spark.task.resource.gpu.amount="
        f"{conf.get('spark.task.resource.gpu.amount') or 'unset'})"))


def executor_cores(sc: Any) -> int | None:
    """Cores of one executor: ``spark.executor.cores`` where set, else the cluster's
    default parallelism over its registered executors (standalone executors take every
    core of their worker)."""
    conf = sc.getConf()
    if conf.get("spark.executor.cores"):
        return int(conf.get("spark.executor.cores"))
    shape = local_cluster(sc.master)
    if shape:
        return shape[1]
    executors = registered_executors(sc)
    return sc.defaultParallelism // executors if executors > 0 else None


_PROFILES: dict[tuple[str, int], Any] = {}  # by application: a new SparkContext, new ones


def training_profile(sc: Any, stage: GpuStage | None) -> Any:
    """The pyspark ResourceProfile of the training stage (None: the default profile),
    registered with the SparkContext so its task slots can be counted."""
    if stage is None or stage.cpus is None:
        return None
    key = (sc.applicationId, stage.cpus)
    if key not in _PROFILES:
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests
        requests = TaskResourceRequests().cpus(stage.cpus).resource("gpu", 1.0)
        profile = ResourceProfileBuilder().require(requests).build
        sc._jsc.sc().resourceProfileManager().addResourceProfile(
            profile._java_resource_profile)
        _PROFILES[key] = profile
    return _PROFILES[key]


def task_slots(sc: Any, profile: Any = None) -> int:
    """How many tasks a classic cluster can run at once under ``profile`` (a registered
    pyspark ResourceProfile; None: the default one). Cores and, when asked for, GPUs both
    count."""
    return int(ClassicContext(getattr(sc, "sc", sc)).task_slots(profile) or 0)


def available_workers(sc: Any, wanted: int | None = None, profile: Any = None) -> int:
    """Every task slot (or ``wanted``, if fewer); a ClusterError when there is none yet."""
    sc = cluster_context(sc)
    slots = sc.task_slots(profile)
    if slots is None:
        slots = sc.named_slots()
        if slots is None:
            raise ClusterError(f"on Spark Connect the client cannot count the task slots of "
                               f"{sc.master or 'the cluster'}; pass num_workers")
        return slots if wanted is None else min(wanted, slots)
    if slots < 1:
        raise ClusterError(f"the cluster ({sc.master}) has no task slots yet (no executor "
                           "has registered); wait for executors or pass num_workers")
    return slots if wanted is None else min(wanted, slots)


def expected_executors(conf: Mapping[str, str], master: str) -> int | None:
    """How many executors the application will have, where that is known up front."""
    shape = local_cluster(master)
    if shape:
        return shape[0]
    try:
        return int(conf.get("spark.executor.instances", "")) or None
    except ValueError:
        return None


def registered_executors(sc: Any) -> int:
    return int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1  # less the driver


def check_slots(sc: Any, num_workers: int, wait_s: float = EXECUTOR_WAIT_S,
                profile: Any = None) -> int:
    """Fail fast when the barrier stage could never be scheduled; returns the slot count.

    Executors may still be registering: wait up to ``wait_s`` for more slots, but not once
    every executor the application will have (``local-cluster[N,..]``,
    ``spark.executor.instances``) has registered."""
    sc = cluster_context(sc)
    slots = sc.task_slots(profile)
    if slots is None:  # a client that cannot count: what the master's name tells, if anything
        slots = sc.named_slots()
        if slots is not None and slots < num_workers:
            raise ClusterError(f"num_workers={num_workers} but the cluster has {slots} task "
                               f"slots in all ({sc.master}); lower num_workers")
        return slots or num_workers
    deadline = time.monotonic() + (0.0 if is_local_master(sc.master) else wait_s)
    expected = expected_executors(dict(sc.getConf().getAll()), sc.master)
    while slots < num_workers and time.monotonic() < deadline:
        if expected is not None and registered_executors(sc) >= expected:
            break
        time.sleep(0.5)
        slots = sc.task_slots(profile)
    if slots < num_workers:
        if profile is not None:
            raise ClusterError(
                f"num_workers={num_workers} but the cluster can run {slots} GPU rank(s) at "
                f"once ({sc.master}): each rank needs a GPU of its own, so GPUs, not cores, "
                "are the limit; lower num_workers to the number of GPUs, or add GPU executors")
        raise ClusterError(
            f"num_workers={num_workers} but the cluster has {slots} task slots in all "
            f"({sc.master}); lower num_workers or add executors/cores")
    return slots


def cluster_gpu_stage(sc: Any, use_gpu: bool) -> GpuStage | None:
    return gpu_stage(dict(sc.getConf().getAll()), sc.master, use_gpu,
                     None if is_local_master(sc.master) or not use_gpu else executor_cores(sc))


def stage_profile(sc: Any, use_gpu: bool) -> Any:
    """The resource profile the training stage is launched with (None: the default; always
    on Spark Connect, whose DataFrame stages take the session's task resources)."""
    sc = cluster_context(sc)
    sc = cluster_context(sc)
    if not sc.stage_profiles:  # Connect's DataFrame stages take the session's resources
        return None
    return training_profile(sc, cluster_gpu_stage(sc, use_gpu))


def check_cluster(sc: Any, num_workers: int, use_gpu: bool) -> None:
    """Every check that needs the cluster; says in one line how the ranks get GPUs. The
    session's conf is checked first (dynamic allocation refuses at once, with no Spark job
    and no wait for an executor), then the executors' Python, by a small job (once per
    session)."""
    start_cluster_checks(sc, num_workers, use_gpu)()


def start_cluster_checks(sc: Any, num_workers: int, use_gpu: bool,
                         warm: tuple[str, ...] = ()) -> Callable[[], None]:
    """:func:`check_cluster`, whose check of the executors' Python goes on beside the
    caller's own work until the caller calls what this returns (``warm``: imported by the
    check's tasks, whose Python workers the ranks get)."""
    sc = cluster_context(sc)
    check_dynamic_allocation(dict(sc.getConf().getAll()), sc.master)
    wait = start_check(sc, num_workers, warm)
    _check_slots_and_gpus(sc, num_workers, use_gpu)
    return wait


def _check_slots_and_gpus(sc: Any, num_workers: int, use_gpu: bool) -> None:
    if sc.task_slots() is None:  # what the session's conf and master's name tell
        check_gpu_conf(dict(sc.getConf().getAll()), use_gpu)
        slots = sc.named_slots()
        if slots is not None and slots < num_workers:
            raise ClusterError(f"num_workers={num_workers} but the cluster has {slots} task "
                               f"slots in all ({sc.master}); lower num_workers")
        return
    stage = cluster_gpu_stage(sc, use_gpu)
    if stage is not None:
        log.info("%s", stage.line)
    check_slots(sc, num_workers, profile=training_profile(sc, stage))
