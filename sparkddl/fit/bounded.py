"""The fit's ``timeout`` over the driver's own Spark jobs (profiling, materializing and
sampling the data), not only over the barrier stage: a job that never ends (a wedged Python
worker, a UDF that hangs) is cancelled when the time is up, and the fit fails saying so. A
cancel by the caller (``cancelAllJobs``, the job group, a KeyboardInterrupt) ends the fit
with a JobCancelledError instead of Spark's raw error."""
from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from sparkddl.errors import JobCancelledError, TrainingFailedError
from sparkddl.launch.jobs import is_cancellation


@contextmanager
def bounded_jobs(sc: Any, timeout_s: float | None, what: str) -> Iterator[None]:
    """Spark jobs this thread starts in the block carry a tag of their own (the thread's job
    group and tags stay the caller's, so the caller's cancel still reaches them); they are
    cancelled after ``timeout_s`` (TrainingFailedError "timed out after ...s <what>") or on
    a KeyboardInterrupt (JobCancelledError)."""
    tag = f"sparkddl-{uuid.uuid4().hex[:8]}"
    sc.addJobTag(tag)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sc.cancelJobsWithTag(tag)

    timer = threading.Timer(timeout_s, expire) if timeout_s else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    except KeyboardInterrupt as exc:
        sc.cancelJobsWithTag(tag)
        sc.after_cancel()
        raise JobCancelledError(f"interrupted {what} (KeyboardInterrupt); its Spark jobs "
                                "were cancelled") from exc
    except Exception as exc:
        text = str(exc).strip()
        if expired.is_set():
            sc.after_cancel()  # before the session's next jobs
            raise TrainingFailedError(
                [], spark_error=text.splitlines()[0][:500] if text else "",
                reason=f"timed out after {timeout_s:g}s {what} (its Spark jobs were "
                       "cancelled); raise timeout, or look for a stuck task in the Spark "
                       "UI") from exc
        if is_cancellation(text) and not isinstance(exc, JobCancelledError):
            raise JobCancelledError(f"cancelled {what}: its Spark job was cancelled "
                                    f"({_first_line(text)})") from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()
        sc.removeJobTag(tag)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if "cancel" in line.lower() or "interrupt" in line.lower():
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else ""
