"""When a fit's attempt fails: relaunch from the last good checkpoint, or stop. The policy
decides; the fit carries the decision out."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sparkddl import checkpoint
from sparkddl.errors import ClusterError, NonFiniteLossError, TrainingFailedError, TransformError
from sparkddl.launch import preflight
from sparkddl.store import Store

log = logging.getLogger(__name__)

RELAUNCH_SLOT_WAIT_S = 120.0


@dataclass
class Restart:
    """One failed attempt and how the next one picked up."""

    attempt: int  # the attempt that failed
    reason: str
    resumed_from_epoch: int  # epochs done in the checkpoint resumed from (0: from scratch)
    resumed_from_step: int
    steps_redone: int  # steps (per rank) the failed attempt did after that checkpoint
    failed_at: float  # time.monotonic() when the failure was raised on the driver
    resumed_at: float | None = None  # when the next attempt's first training step reported

    @property
    def recovery_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.failed_at


@dataclass
class RestartPolicy:
    """``max_restarts`` relaunches within ``timeout_s`` of ``started`` (perf_counter)."""

    max_restarts: int
    timeout_s: float | None
    started: float
    num_workers: int
    use_gpu: bool = False

    def remaining(self) -> float | None:
        """What is left of the fit's time limit (None: no limit; 0: nothing left)."""
        if self.timeout_s is None:
            return None
        return max(self.timeout_s - (time.perf_counter() - self.started), 0.0)

    def final_error(self, attempt: int, exc: TrainingFailedError) -> TrainingFailedError | None:
        """None to relaunch; else the error that ends the fit."""
        repeats = will_repeat(exc, self.num_workers)
        if attempt < self.max_restarts and self.remaining() != 0 and not repeats:
            return None
        if repeats and _non_finite(exc):
            reason = (f"{exc.reason} (not retried: a relaunch from the last checkpoint would "
                      "reach the same batch with the same weights)")
        elif repeats and _transform_failed(exc):
            reason = (f"{exc.reason} (not retried: a relaunch would give the transformFn the "
                      "same rows)")
        elif repeats:
            reason = (f"{exc.reason} (not retried: every rank failed the same way before its "
                      "first step, so every attempt would)")
        elif attempt == 0:
            reason = exc.reason
        else:
            reason = (f"{exc.reason} (failed on every one of {attempt + 1} attempts; the last "
                      "failure is shown)")
        return TrainingFailedError(exc.failures, exc.spark_error, attempts=attempt + 1,
                                   reason=reason)

    def wait_for_slots(self, sc: object) -> None:
        """A lost executor is replaced by the cluster manager: wait for its slots before the
        relaunch (Spark rechecks a barrier stage's slots only every 15 s). If they do not
        come in time, relaunch anyway: Spark keeps waiting for them itself, and the attempt
        still counts."""
        remaining = self.remaining()
        wait_s = RELAUNCH_SLOT_WAIT_S if remaining is None else min(remaining,
                                                                     RELAUNCH_SLOT_WAIT_S)
        try:
            preflight.check_slots(sc, self.num_workers, wait_s=wait_s,
                                  profile=preflight.stage_profile(sc, self.use_gpu))
        except ClusterError as exc:
            log.warning("relaunching although %s", exc)


def will_repeat(exc: TrainingFailedError, num_workers: int) -> bool:
    """Every rank reported the same error before any training step: a configuration or code
    error (a missing function, a device that does not exist), not a fault a relaunch fixes."""
    failures = exc.failures
    if _non_finite(exc) or _transform_failed(exc):
        return True
    if len({f.rank for f in failures}) < num_workers:
        return False
    if not all(f.status and f.traceback for f in failures):  # a rank died: that may not recur
        return False
    if any(int(f.status.get("steps") or 0) > 0 for f in failures):
        return False
    return len({f.message for f in failures}) == 1


def _transform_failed(exc: TrainingFailedError) -> bool:
    return any(f.message.startswith(TransformError.__name__) for f in exc.failures)


def _non_finite(exc: TrainingFailedError) -> bool:
    return any(f.message.startswith(NonFiniteLossError.__name__) for f in exc.failures)


def record_restart(attempt: int, exc: TrainingFailedError, store: Store, run_id: str,
                   steps_per_epoch: int, steps_seen: int) -> Restart:
    """What the failed attempt reached (``steps_seen``: rank 0's heartbeats) and where the
    next one resumes from."""
    latest = checkpoint.latest_good(store, run_id)
    epoch, step = (latest.epoch, latest.step) if latest else (0, 0)
    done_at_checkpoint = epoch * steps_per_epoch + step
    # a rank that reported its failure said exactly where it was; else: heartbeats
    reached = max([int(f.status.get("steps", 0)) for f in exc.failures] + [steps_seen])
    reason = str(exc).splitlines()[0]
    if exc.failures:  # the first failure is usually the cause
        first = exc.failures[0]
        reason = f"{reason} First: rank {first.rank}: {first.message}"[:1000]
    log.warning("attempt %d of run %s failed (%s); relaunching from %s", attempt, run_id,
                reason, f"epoch {epoch} step {step}" if latest else "the start")
    return Restart(attempt, reason, epoch, step, max(0, reached - done_at_checkpoint),
                   time.monotonic())
