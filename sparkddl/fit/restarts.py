"""When a fit's attempt fails: relaunch from the last good checkpoint, or stop. The policy
decides; the fit carries the decision out."""
from __future__ import annotations

import errno
import logging
import re
import time
from dataclasses import dataclass, field

from sparkddl import checkpoint
from sparkddl.errors import (
    NonFiniteLossError,
    RankFailure,
    StoreError,
    TrainingFailedError,
    TransformError,
)
from sparkddl.store import Store
from sparkddl.store.faults import FIXES

# the errno names a storage fault's StoreError carries
STORE_FAULTS = tuple(errno.errorcode[code] for code in FIXES)

log = logging.getLogger(__name__)



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
    world_size: int = 0  # ranks of the next attempt (fewer than numWorkers: elastic)

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

    # signatures of the earlier attempts' causes, and how many attempts hung
    seen: dict[str, int] = field(default_factory=dict)
    hangs: int = 0

    def final_error(self, attempt: int, exc: TrainingFailedError, hint: str = ""
                    ) -> TrainingFailedError | None:
        """None to relaunch; else the error that ends the fit. ``hint``: where a store fault
        leaves the run (the checkpoint a later fit resumes from), said after it."""
        repeats = will_repeat(exc, self.num_workers)
        again = self._seen_before(attempt, exc)
        hung = exc.reason.startswith("watchdog")
        self.hangs += hung
        if attempt < self.max_restarts and self.remaining() != 0 and not repeats and \
                again is None and self.hangs < 2:
            return None
        if again is not None:
            reason = (f"{exc.reason} (not retried: attempt {again} failed the same way: "
                      f"{again_text(exc)})")
        elif hung and self.hangs >= 2:
            reason = (f"{exc.reason} (not retried: attempt {attempt - 1} hung too; a hang is "
                      "retried once)")
        elif repeats and _non_finite(exc):
            reason = (f"{exc.reason} (not retried: a relaunch from the last checkpoint would "
                      "reach the same batch with the same weights)")
        elif store_fault(exc):
            reason = store_fault_reason(exc)
            if "runId=" not in reason:  # a checkpoint's own error says how to resume
                reason = f"{reason} {hint}".strip()
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

    def _seen_before(self, attempt: int, exc: TrainingFailedError) -> int | None:
        """The earlier attempt whose cause had this attempt's signature, if any; remembers
        this one's. Ranks that died without a report (a lost executor or host) have no
        signature: losing a machine twice is not the same bug twice."""
        cause = cause_of(exc)
        if cause is None:
            return None
        sig = signature(cause)
        if sig in self.seen:
            return self.seen[sig]
        self.seen[sig] = attempt
        return None


def will_repeat(exc: TrainingFailedError, num_workers: int) -> bool:
    """Every rank reported the same error before any training step: a configuration or code
    error (a missing function, a device that does not exist), not a fault a relaunch fixes."""
    failures = exc.failures
    if _non_finite(exc) or _transform_failed(exc) or store_fault(exc):
        return True
    if len({f.rank for f in failures}) < num_workers:
        return False
    if not all(f.status and f.traceback for f in failures):  # a rank died: that may not recur
        return False
    if any(int(f.status.get("steps") or 0) > 0 for f in failures):
        return False
    return len({signature(f) for f in failures}) == 1  # ranks and hosts masked


_MASKS = (
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<ip>"),  # IPv4 addresses
    (re.compile(r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\]"), "<ip>"),  # [IPv6]
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.~-]*/)+[\w.~-]*"), "<path>"),  # paths and URLs
    (re.compile(r"\b[0-9a-f]{8,}\b"), "<hex>"),  # run ids, hashes
    (re.compile(r"\d+"), "<n>"),  # ranks, ports, pids, counts
)
_LOCATION = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def cause_of(exc: TrainingFailedError) -> RankFailure | None:
    """The reported failure that caused the attempt's end: the first, unless it is a rank
    that died without a report (no traceback) or a peer that only saw the cause."""
    reported = [f for f in exc.failures if f.traceback]
    return reported[0] if reported else None


def signature(failure: RankFailure) -> str:
    """What makes two failures the same one: the exception's type, where it was raised
    (file name and function) and its message, with addresses, paths, ids and numbers
    masked (they differ from rank to rank and attempt to attempt)."""
    kind, _, message = failure.message.partition(":")
    if failure.exception:  # the rank's own report: its class and where it was raised
        kind, where = failure.exception, failure.location or "?"
    else:  # only text (a process that died, Spark's error): read from it
        places = _LOCATION.findall(failure.traceback)
        where = f"{places[-1][0].rsplit('/', 1)[-1]}:{places[-1][2]}" if places else "?"
    text = message.strip()
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return f"{kind.strip()} at {where}: {text[:300]}"


def again_text(exc: TrainingFailedError) -> str:
    cause = cause_of(exc)
    return cause.message.splitlines()[0][:200] if cause else exc.reason


def _transform_failed(exc: TrainingFailedError) -> bool:
    return any(f.raised(TransformError) for f in exc.failures)


def store_fault(exc: TrainingFailedError) -> bool:
    """A rank could not write to the store for a reason a relaunch meets again (a full disk,
    a read-only mount, a missing permission: sparkddl.store.faults)."""
    return any(f.raised(StoreError) and any(code in f.message for code in STORE_FAULTS)
               for f in exc.failures)


def store_fault_reason(exc: TrainingFailedError) -> str:
    """The ranks' StoreError first (the file, the fault, the space left, the fix), then when
    it came: a store that filled up after two epochs trained is not a rank that could not
    start."""
    failure = next(f for f in exc.failures
                   if f.raised(StoreError) and any(code in f.message for code in STORE_FAULTS))
    text = failure.message.splitlines()[0].removeprefix("StoreError:").strip()
    status, when = failure.status, ""
    steps, epoch = int(status.get("steps") or 0), int(status.get("epoch") or 0)
    phase = str(status.get("phase") or "")
    if steps and epoch:
        when = f" in epoch {epoch} (step {steps} of the run)"
    elif steps:
        when = f" after {steps} step(s) had trained"
    else:
        when = " before its first training step"
    doing = f" while {phase}" if phase and phase != "running" else ""
    return (f"rank {failure.rank} could not write to the store{doing}{when}: {text} (not "
            "retried: a relaunch would meet the same store)")


def _non_finite(exc: TrainingFailedError) -> bool:
    return any(f.raised(NonFiniteLossError) for f in exc.failures)


def record_restart(attempt: int, exc: TrainingFailedError, store: Store, run_id: str,
                   steps_per_epoch: int, steps_seen: int, world: int = 0,
                   epoch_end: bool = False) -> Restart:
    """What the failed attempt reached (``steps_seen``: rank 0's heartbeats) and where the
    next one resumes from (``epoch_end``: a checkpoint at an epoch's end, for a new world)."""
    latest = checkpoint.latest_good(store, run_id, epoch_end)
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
                   time.monotonic(), world_size=world)
