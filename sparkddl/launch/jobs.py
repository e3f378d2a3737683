"""Spark jobs sparkddl starts for the caller: tagged so that sparkddl cancels exactly those,
yet kept in the caller's job group and tags, so that the caller's own cancel (a notebook's
stop button cancels the cell's job group; ``cancelAllJobs``; ``interruptAll`` on Spark
Connect) reaches them too; and a cancel told apart from a failure."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

# how Spark words a cancelled job (classic) or an interrupted operation (Connect)
_CANCEL_MARKERS = ("SPARK_JOB_CANCELLED", "OPERATION_CANCELED", "cancelled part of",
                   "cancellation of all jobs", "cancelled because", "was cancelled",
                   "INTERRUPTED")


def new_tag(run_id: str) -> str:
    return f"sparkddl-{run_id}-{uuid.uuid4().hex[:6]}"


def is_cancellation(text: str) -> bool:
    """Whether Spark's error text says the job was cancelled rather than failed."""
    return any(marker in text for marker in _CANCEL_MARKERS)


@dataclass(frozen=True)
class CallerScope:
    """The job group and tags of the thread that called sparkddl, to be carried onto the
    thread that runs a stage (Spark keeps both per thread; a new thread has neither)."""

    group: tuple[str | None, ...]
    tags: frozenset[str]

    @classmethod
    def capture(cls, sc: Any) -> "CallerScope":
        """Call in the caller's thread."""
        return cls(sc.job_group(), frozenset(sc.getJobTags()))

    def enter(self, sc: Any, tag: str, description: str) -> None:
        """In the stage's thread: the caller's group (or a description of our own) and tags,
        plus ``tag``, which sparkddl cancels by."""
        sc.enter_group(self.group, description)
        for t in self.tags | {tag}:
            sc.addJobTag(t)

    def leave(self, sc: Any, tag: str) -> None:
        for t in self.tags | {tag}:
            sc.removeJobTag(t)
