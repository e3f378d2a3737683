"""The fit's ``timeout`` over the driver's own Spark jobs (profiling, materializing and
sampling the data), not only over the barrier stage: a job that never ends (a wedged Python
worker, a UDF that hangs) is cancelled when the time is up, and the fit fails saying so."""
from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from sparkddl.errors import TrainingFailedError

_LOCAL_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@contextmanager
def bounded_jobs(sc: Any, timeout_s: float | None, what: str) -> Iterator[None]:
    """Spark jobs this thread starts in the block are cancelled after ``timeout_s``; the
    block then raises TrainingFailedError ("timed out after ...s <what>"). The thread's own
    job group (classic) or tags (Connect) are as they were afterwards."""
    if not timeout_s:
        yield
        return
    group = f"sparkddl-{uuid.uuid4().hex[:8]}"
    connect = getattr(sc, "is_connect", False)
    if connect:
        sc.spark.addTag(group)
    else:
        saved = [sc.getLocalProperty(k) for k in _LOCAL_PROPERTIES]
        sc.setJobGroup(group, what, interruptOnCancel=True)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        if connect:
            sc.cancel(group)
        else:
            sc.cancelJobGroup(group)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as exc:
        if expired.is_set():
            text = str(exc).strip()
            raise TrainingFailedError(
                [], spark_error=text.splitlines()[0][:500] if text else "",
                reason=f"timed out after {timeout_s:g}s {what} (its Spark jobs were "
                       "cancelled); raise timeout, or look for a stuck task in the Spark "
                       "UI") from exc
        raise
    finally:
        timer.cancel()
        if connect:
            sc.spark.removeTag(group)
        else:
            for key, value in zip(_LOCAL_PROPERTIES, saved):
                sc.setLocalProperty(key, value)
