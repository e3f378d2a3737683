"""Driver-side checks that run before anything is launched.

A barrier stage that asks for more slots than the cluster has waits forever, and one that
meets dynamic allocation or missing GPU resources fails late and obscurely; these checks
turn each case into a clear error while nothing is running yet.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from sparkddl.errors import ClusterError, ConfigError

log = logging.getLogger(__name__)

# executors of a freshly started cluster register over a few seconds
EXECUTOR_WAIT_S = 30.0


def check_num_workers(num_workers: Any) -> int:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"num_workers must be a positive integer, got {num_workers!r}")
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


def check_gpu_conf(conf: Mapping[str, str], use_gpu: bool) -> None:
    if not use_gpu:
        return
    amount = conf.get("spark.task.resource.gpu.amount", "")
    try:
        ok = float(amount) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ClusterError(
            "use_gpu=True but no GPU task resources are configured "
            f"(spark.task.resource.gpu.amount={amount or 'unset'}); set "
            "spark.executor.resource.gpu.amount, spark.executor.resource.gpu.discoveryScript "
            "and spark.task.resource.gpu.amount, or run with use_gpu=False")


def task_slots(sc: Any) -> int:
    """How many tasks the cluster can run at once under the default resource profile
    (cores and, when configured, GPUs per task both count)."""
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def available_workers(sc: Any, wanted: int | None = None) -> int:
    """Every task slot (or ``wanted``, if fewer); a ClusterError when there is none yet."""
    slots = task_slots(sc)
    if slots < 1:
        raise ClusterError(f"the cluster ({sc.master}) has no task slots yet (no executor "
                           "has registered); wait for executors or pass num_workers")
    return slots if wanted is None else min(wanted, slots)


def check_slots(sc: Any, num_workers: int, wait_s: float = EXECUTOR_WAIT_S) -> int:
    """Fail fast when the barrier stage could never be scheduled; returns the slot count."""
    slots = task_slots(sc)
    deadline = time.monotonic() + (0.0 if is_local_master(sc.master) else wait_s)
    while slots < num_workers and time.monotonic() < deadline:
        time.sleep(0.5)  # executors may still be registering
        slots = task_slots(sc)
    if slots < num_workers:
        raise ClusterError(
            f"num_workers={num_workers} but the cluster has {slots} task slots in all "
            f"({sc.master}); lower num_workers or add executors/cores")
    return slots


def check_cluster(sc: Any, num_workers: int, use_gpu: bool) -> None:
    conf = dict(sc.getConf().getAll())
    check_dynamic_allocation(conf, sc.master)
    check_gpu_conf(conf, use_gpu)
    check_slots(sc, num_workers)
