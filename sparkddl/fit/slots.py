"""After a failed attempt: how many ranks the next one gets. Waiting for task slots is
bounded (slotWaitTimeout); then the fit goes on with fewer ranks when minWorkers allows, or
ends with a ClusterError naming what was lost and the settings to change."""
from __future__ import annotations

import logging
import time
from typing import Any

from sparkddl.errors import ClusterError, RankFailure
from sparkddl.launch import preflight
from sparkddl.session import cluster_context

log = logging.getLogger(__name__)

WAIT_LOG_EVERY_S = 15.0
POLL_S = 1.0


def forget_lost_executors(sc: Any, failures: list[RankFailure]) -> None:
    """Ask Spark to stop offering the executors of lost ranks (and to replace them): until
    its own heartbeats time out (a minute or more) it would schedule the next attempt's
    tasks there, where they never start."""
    sc = cluster_context(sc)
    for f in failures:
        executor = str(f.status.get("executor") or "") if f.status.get("lost") else ""
        if not executor:
            continue
        try:
            if not sc.replace_executor(executor):
                continue  # a client that cannot ask (Spark Connect)
            log.warning("asked Spark to replace executor %s (rank %d at %s was lost)",
                        executor, f.rank, f.host)
        except Exception as exc:  # noqa: BLE001 - a cluster manager that cannot kill
            log.warning("could not ask Spark to replace lost executor %s: %s", executor, exc)


def world_after_failure(sc: Any, want: int, least: int, wait_s: float, use_gpu: bool,
                        failures: list[RankFailure]) -> int:
    """The number of ranks for the next attempt: ``want`` once that many task slots are
    free (waiting at most ``wait_s``), else the free slots if at least ``least``."""
    sc = cluster_context(sc)
    if sc.task_slots() is None:
        return want  # the client cannot count slots: Spark waits for them itself
    profile = preflight.stage_profile(sc, use_gpu)
    started = time.monotonic()
    said = started
    slots = sc.task_slots(profile)
    while slots < want and time.monotonic() - started < wait_s:
        if time.monotonic() - said >= WAIT_LOG_EVERY_S:
            said = time.monotonic()
            log.warning("waiting for %d task slots to relaunch (%d free, %.0fs of %gs "
                        "slotWaitTimeout)", want, slots, said - started, wait_s)
        time.sleep(POLL_S)
        slots = sc.task_slots(profile)
    if slots >= want:
        return want
    if slots >= least:
        log.warning("going on with %d of %d ranks (minWorkers=%d): %d task slots free after "
                    "%gs", slots, want, least, slots, wait_s)
        return slots
    raise ClusterError(
        f"after {describe_lost(failures)}, the cluster has {slots} free task slot(s) for "
        f"numWorkers={want} (minWorkers={least}) after waiting {wait_s:g}s (slotWaitTimeout); "
        "add executors, raise slotWaitTimeout to wait for them longer, or lower minWorkers "
        "to go on with fewer ranks")


def slots_back(sc: Any, want: int, use_gpu: bool) -> bool:
    """Whether the cluster has ``want`` task slots in all again (an elastic fit's ranks hold
    some of them)."""
    sc = cluster_context(sc)
    try:
        slots = sc.task_slots(preflight.stage_profile(sc, use_gpu))
        return slots is not None and slots >= want  # None: the client cannot count them
    except Exception as exc:  # noqa: BLE001 - asked from a channel thread; never fatal
        log.debug("could not count task slots: %s", exc)
        return False


def describe_lost(failures: list[RankFailure]) -> str:
    gone = [f for f in failures if f.status.get("lost") or not f.traceback]
    if not gone:
        return "the failure"
    return "losing " + "; ".join(f"rank {f.rank} at {f.host or 'an unknown executor'}"
                                 for f in gone)
