"""Submit one barrier stage, watch it through the driver channel, and fail fast."""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import weakref
from typing import Any, Callable

from sparkddl.channel.server import DriverChannel, Message
from sparkddl.errors import ClusterError, JobCancelledError, TrainingFailedError
from sparkddl.launch.jobs import CallerScope, is_cancellation, new_tag
from sparkddl.launch.monitor import HEARTBEAT_LOST_S, Handlers, StageMonitor, ordered_failures
from sparkddl.session import cluster_context
from sparkddl.session.masters import missing_module, missing_module_reason
from sparkddl.task.bootstrap import barrier_entry
from sparkddl.task.spec import TaskSpec

log = logging.getLogger(__name__)

# after the first failure report, wait this long for the other ranks' reports
SILENT_RANK_GRACE_S = 3.0
# how long to wait for Spark to wind the stage down after a cancel, and then for every rank
# that connected to be gone (Spark kills a cancelled task's Python worker after
# spark.python.task.killTimeout, 2 s by default)
CANCEL_WAIT_S = 30.0
# a stage Spark ended: connections that closed this soon after the driver woke count as
# ranks that died by themselves (Spark's own kills of the peers take longer)
DEAD_GRACE_S = 1.0
# how long the watchdog waits for the stuck ranks' Python stacks
STACKS_WAIT_S = 3.0
# a finished stage: how long the driver waits for the frames its ranks sent last (a model
# snapshot of many MB may still be on its way when Spark reports the tasks done)
DRAIN_S = 30.0

SpecFactory = Callable[[DriverChannel], TaskSpec]

# the channels of running stages (for diagnostics and tests); entries vanish when closed
OPEN_CHANNELS: "weakref.WeakSet[DriverChannel]" = weakref.WeakSet()
# how often the driver checks the watchdog
WATCHDOG_POLL_S = 0.5
# how often a stage whose ranks have not all started says that it waits for task slots
SLOT_NOTICE_S = 15.0


class _Job(threading.Thread):
    """Runs the barrier stage's collect() with a job tag of its own, so that sparkddl can
    cancel it, in the caller's job group and tags, so that the caller's cancel reaches it."""

    def __init__(self, sc: Any, spec: TaskSpec, tag: str, description: str,
                 wake: threading.Event, profile: Any = None):
        super().__init__(name=f"sparkddl-job-{spec.run_id}", daemon=True)
        self.sc, self.spec, self.tag, self.description = sc, spec, tag, description
        self.scope = CallerScope.capture(sc)  # constructed in the caller's thread
        self.profile = profile  # the stage's resource profile (GPU ranks), or None
        self.wake = wake
        self.result: list[bytes] | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()  # set before wake, unlike is_alive()

    def run(self) -> None:
        try:
            entry = functools.partial(barrier_entry, self.spec)
            self.scope.enter(self.sc, self.tag, self.description)
            try:
                self.result = self._collect(entry)
            finally:
                self.scope.leave(self.sc, self.tag)
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting driver thread
            self.error = exc
        finally:
            self.finished.set()
            self.wake.set()

    def _collect(self, entry: Any) -> list[bytes]:
        return self.sc.run_barrier(entry, self.spec.num_workers, self.profile)


def run_stage(sc: Any, make_spec: SpecFactory, timeout_s: float | None = None,
              handlers: Handlers | None = None, description: str = "sparkddl",
              watchdog_s: float | str | None = None, profile: Any = None,
              slot_wait_s: float | None = None) -> list[bytes]:
    """Run one barrier stage and return what its tasks yielded.

    Raises TrainingFailedError as soon as a rank reports a failure (after a short grace for
    the other ranks' reports), when Spark fails the stage, when ``timeout_s`` passes, or,
    with ``watchdog_s``, when a rank's heartbeats stop showing progress for that long; the
    stage is cancelled first so no rank is left blocked in a collective. While its ranks
    have not all started, the wait for task slots is logged, and a ClusterError past
    ``slot_wait_s``.
    """
    monitor = StageMonitor(handlers)
    sc = cluster_context(sc)
    host, bind = sc.channel_addresses()
    with DriverChannel(monitor.handle, bind_host=bind or "0.0.0.0",
                       advertise_host=host) as channel:
        monitor.broadcast = channel.send_to_ranks
        OPEN_CHANNELS.add(channel)
        try:
            spec = make_spec(channel)
            why = sc.unreachable(channel.host, channel.port)
            if why:
                _say_offline(sc, why)
                spec, watchdog_s = dataclasses.replace(spec, offline=True), None
            return _run(sc, spec, monitor, timeout_s, watchdog_s, description, profile,
                        slot_wait_s)
        finally:
            OPEN_CHANNELS.discard(channel)


class _Starting:
    """A barrier stage waits, silently in Spark, until every one of its tasks has a slot at
    once: said every ``SLOT_NOTICE_S``; past ``limit_s`` (slotWaitTimeout), a ClusterError.
    Tasks with a slot are counted by Spark's status tracker, or, where the client has none
    (Connect), as the ranks that said hello (which also counts their start-up)."""

    def __init__(self, sc: Any, tag: str, monitor: StageMonitor, spec: TaskSpec,
                 started: float, limit_s: float | None):
        self.sc, self.tag, self.monitor, self.spec = sc, tag, monitor, spec
        self.started, self.limit_s = started, limit_s
        self.next_notice = started + SLOT_NOTICE_S
        self.done = False

    def check(self, now: float) -> None:
        if self.done:
            return
        running = self.sc.running_tasks(self.tag)  # None: not listed yet, or Connect
        started = len(self.monitor.connected) if running is None else running
        if started >= self.spec.num_workers or len(self.monitor.connected) >= \
                self.spec.num_workers:
            self.done = True
            return
        waited, world = now - self.started, self.spec.num_workers
        what = (f"{started} of {world} tasks of run {self.spec.run_id}'s barrier stage "
                f"have a slot after {waited:.0f}s: the stage starts once {world} task slots "
                "are free at once")
        if self.limit_s is not None and waited >= self.limit_s:
            raise ClusterError(f"{what}, and they were not within slotWaitTimeout="
                               f"{self.limit_s:g}s; other jobs of this application hold the "
                               "slots, or the cluster has fewer than numWorkers; wait for them "
                               "to end, add executors, lower numWorkers, or raise "
                               "slotWaitTimeout")
        if now >= self.next_notice:
            self.next_notice = now + SLOT_NOTICE_S
            log.info("%s (other jobs hold them?); waiting%s", what,
                     f" up to {self.limit_s:g}s (slotWaitTimeout)" if self.limit_s else "")


def _run(sc: Any, spec: TaskSpec, monitor: StageMonitor, timeout_s: float | None,
         watchdog_s: float | str | None, description: str, profile: Any = None,
         slot_wait_s: float | None = None) -> list[bytes]:
    job = _Job(sc, spec, new_tag(spec.run_id), description, monitor.wake, profile)
    started = time.monotonic()
    job.start()
    try:
        reason = _wait(job, monitor, timeout_s, started, watchdog_s, spec.num_workers,
                       online=not spec.offline,
                       starting=_Starting(sc, job.tag, monitor, spec, started,
                                          slot_wait_s))
    except KeyboardInterrupt as exc:  # a notebook's stop button, Ctrl-C
        _stop(sc, job, monitor, spec)
        raise JobCancelledError(f"run {spec.run_id} was interrupted (KeyboardInterrupt); "
                                "its barrier stage was cancelled and every rank has "
                                "ended") from exc
    except Exception:  # no slots (ClusterError: a relaunch would wait the same), or the
        _stop(sc, job, monitor, spec)  # driver's own watch failed: no rank is left running
        raise
    decided = time.monotonic()  # connections that close after this were closed by the cancel
    ours = not job.finished.is_set()
    if ours:  # a rank failed or time ran out: stop everyone still running
        _stop(sc, job, monitor, spec)
    elif job.error is not None:  # the ranks of a failed stage may still be running
        _ranks_gone(monitor, spec)
    if job.error is None and not reason:
        if spec.offline:
            _log_finished(spec, started)
            return _replay(job.result or [], monitor)
        # every rank's "done" is its last frame: once it is handled, so is all it sent before
        # (closing the channel now would drop those still being read)
        missing = monitor.wait_finished(spec.num_workers, DRAIN_S)
        lost = missing + monitor.closed_without_done(spec.num_workers)
        if lost:
            log.warning("run %s: rank(s) %s finished, but their last messages did not reach "
                        "the driver%s; results that depend on them (such as the last epoch's "
                        "evaluation) may be missing", spec.run_id, ", ".join(map(str, lost)),
                        f" within {DRAIN_S:g}s" if missing else "")
        _log_finished(spec, started)
        return job.result or []
    spark_error = _error_text(job.error)
    if not ours and is_cancellation(spark_error):
        raise JobCancelledError(f"run {spec.run_id} was cancelled: its Spark job was "
                                f"cancelled ({_cancel_line(spark_error)}); every rank has "
                                "ended")
    # a rank whose connection closed without a report before the driver cancelled the
    # stage died by itself; when Spark ended the stage, the connection of the rank that
    # died may be handled a moment after the peer's report that woke the driver
    cutoff = decided if ours else decided + DEAD_GRACE_S
    failures = monitor.lost_ranks + ordered_failures(
        spark_error, list(monitor.failures.values()), monitor.died_silently(cutoff))
    module = missing_module(spark_error) if not monitor.failures else None
    if module and not reason:  # the task could not even start sparkddl's entry
        reason = missing_module_reason(module)
    raise TrainingFailedError(failures, spark_error=spark_error,
                              reason=reason or "the barrier stage failed")


def _stop(sc: Any, job: _Job, monitor: StageMonitor, spec: TaskSpec) -> None:
    """Cancel the stage and return once its ranks are gone (or the wait is over)."""
    sc.cancelJobsWithTag(job.tag)
    job.join(CANCEL_WAIT_S)
    _ranks_gone(monitor, spec)


def _ranks_gone(monitor: StageMonitor, spec: TaskSpec) -> None:
    """Spark reports a cancelled or failed stage before its tasks' Python workers have
    stopped: a relaunch (or the caller) must not go on while they may still train and write
    checkpoints. Every rank that connected is gone once its connection has closed."""
    alive = monitor.wait_disconnected(CANCEL_WAIT_S, {f.rank for f in monitor.lost_ranks})
    if alive:
        log.warning("run %s attempt %d: rank(s) %s still connected %gs after the stage ended; "
                    "their writes are refused (the attempt is fenced)", spec.run_id,
                    spec.attempt, ", ".join(map(str, alive)), CANCEL_WAIT_S)


def _cancel_line(text: str) -> str:
    for line in text.splitlines():
        if is_cancellation(line):
            return line.strip()[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else "no detail"


def _log_finished(spec: TaskSpec, started: float) -> None:
    log.info("run %s: %d ranks finished in %.1fs", spec.run_id, spec.num_workers,
             time.monotonic() - started)


def _wait(job: _Job, monitor: StageMonitor, timeout_s: float | None, started: float,
          watchdog_s: float | str | None, world: int, online: bool = True,
          starting: _Starting | None = None) -> str:
    """Block until the job ends, a rank fails or is lost, the timeout passes or the watchdog
    fires; '' if the job ended. ``starting`` (online only) says, and bounds, the wait for
    the ranks to start."""
    while True:
        remaining = None if timeout_s is None else timeout_s - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            return f"timed out after {timeout_s:g}s"
        if online:  # heartbeats come over the channel
            if starting is not None:
                starting.check(time.monotonic())
            remaining = WATCHDOG_POLL_S if remaining is None else min(remaining, WATCHDOG_POLL_S)
            monitor.lost_ranks = monitor.lost()
            if monitor.lost_ranks:
                return _lost_reason(monitor.lost_ranks)
        if watchdog_s:
            stalled = monitor.stalled(watchdog_s, world)
            if stalled:
                stalled += _stacks_text(monitor)
                log.warning("%s", stalled)  # the whole picture; a restart keeps its first line
                return stalled
        monitor.wake.wait(remaining)
        monitor.wake.clear()
        if monitor.failures:
            _grace(job, monitor, world)
            return "training failed"
        if job.finished.is_set():
            return ""


def _lost_reason(lost: list) -> str:
    named = "; ".join(f"rank {f.rank} at {f.host or 'an unknown executor'}" for f in lost)
    text = (f"lost {named}: no heartbeat for {HEARTBEAT_LOST_S:g}s while its connection "
            "stayed open (its host is unreachable, or its process is frozen)")
    log.warning("%s; cancelling the stage", text)
    return text


def _stacks_text(monitor: StageMonitor) -> str:
    """The Python stacks of the ranks the watchdog blamed, as they answer."""
    stacks = monitor.collect_stacks(monitor.culprits, STACKS_WAIT_S)
    parts = []
    for rank in monitor.culprits:
        text = stacks.get(rank)
        parts.append(f"\nPython stacks of rank {rank}:\n{text.rstrip()}" if text else
                     f"\nrank {rank} did not send its Python stacks within {STACKS_WAIT_S:g}s "
                     "(its interpreter is blocked, e.g. in native code holding the GIL, or "
                     "its process is gone)")
    return "".join(parts)


def _grace(job: _Job, monitor: StageMonitor, world: int) -> None:
    """After the first failure report, wait until every rank has reported or died (its
    connection closed without a report) or Spark has ended the stage, at most
    SILENT_RANK_GRACE_S: peers report their broken collectives within milliseconds, and a
    rank that died is then named, with what Spark says of it, instead of being missed."""
    start = time.monotonic()
    while not job.finished.is_set() and monitor.accounted() < world:
        waited = time.monotonic() - start
        if waited >= SILENT_RANK_GRACE_S:
            return
        job.finished.wait(min(0.05, SILENT_RANK_GRACE_S - waited))


_OFFLINE_SAID: set[int] = set()


def _say_offline(sc: Any, why: str) -> None:
    """Once per session: what running offline means."""
    if id(sc.spark) in _OFFLINE_SAID:
        return
    _OFFLINE_SAID.add(id(sc.spark))
    log.warning(
        "the executors cannot reach this Spark Connect client (%s): the ranks run offline. "
        "Their output, epoch rows and snapshots arrive when the stage ends, not live; a "
        "failure is reported through Spark's own error; there is no watchdog, and early "
        "stopping and callbacks cannot stop training. Set spark.sparkddl.channel.host to an "
        "address of this machine the executors reach to have all of it live", why)


def _replay(rows: list[bytes], monitor: StageMonitor) -> list[bytes]:
    """Offline ranks' rows: hand every message to the handlers, in rank order, as a live
    channel would have; return rank 0's result (as a live stage does)."""
    from pyspark import cloudpickle

    results = []
    for part in sorted((cloudpickle.loads(r) for r in rows), key=lambda p: p["rank"]):
        for header, payload in part["frames"]:
            monitor.handle(Message(part["rank"], header, payload))
        if part["result"] is not None:
            results.append(part["result"])
    return results


def _error_text(error: BaseException | None) -> str:
    if error is None:
        return ""
    text = str(error)
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # noqa: BLE001 - the JVM may be gone already
            pass
    return text
