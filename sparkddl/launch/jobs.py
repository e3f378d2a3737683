"""Spark jobs sparkddl starts for the caller: tagged so that sparkddl cancels exactly those,
yet kept in the caller's job group and tags, so that the caller's own cancel (a notebook's
stop button cancels the cell's job group; ``cancelAllJobs``; ``interruptAll`` on Spark
Connect) reaches them too; and a cancel told apart from a failure."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sparkddl.session import is_connect

# how Spark words a cancelled job (classic) or an interrupted operation (Connect)
_CANCEL_MARKERS = ("SPARK_JOB_CANCELLED", "OPERATION_CANCELED", "cancelled part of",
                   "cancellation of all jobs", "cancelled because", "was cancelled",
                   "INTERRUPTED")
_GROUP_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


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
        if is_connect(sc):
            return cls((), frozenset(sc.getJobTags()))
        group = tuple(sc.getLocalProperty(k) for k in _GROUP_KEYS)
        return cls(group, frozenset(sc.getJobTags()))

    def enter(self, sc: Any, tag: str, description: str) -> None:
        """In the stage's thread: the caller's group (or a description of our own) and tags,
        plus ``tag``, which sparkddl cancels by."""
        if not is_connect(sc):
            group_id = self.group[0] if self.group else None
            if group_id:
                sc.setJobGroup(group_id, self.group[1] or description, interruptOnCancel=True)
            else:
                sc.setJobDescription(description)
                sc.setInterruptOnCancel(True)
        for t in self.tags | {tag}:
            sc.addJobTag(t)

    def leave(self, sc: Any, tag: str) -> None:
        for t in self.tags | {tag}:
            sc.removeJobTag(t)
