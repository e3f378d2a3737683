"""What a rank knows about itself while it runs inside a barrier task."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from sparkddl.channel.client import RankChannel
from sparkddl.errors import SparkDDLError


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    attempt: int
    use_gpu: bool
    gpus: list[str]
    collective_timeout_s: float
    channel: RankChannel | None = None
    store: Any = None  # the run's torch TCPStore (rank 0 hosts it)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    # the driver has the slots for the full world again: stop at an epoch's end, checkpoint,
    # and let it relaunch wider (an elastic fit growing back)
    regrow_requested: threading.Event = field(default_factory=threading.Event)
    # where this rank is (phase, epoch, step, steps, and the collective it waits in, if
    # any): plain ints and strings, sent with heartbeats and failure reports
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


_current: RankContext | None = None


def current() -> RankContext:
    """The running rank's context; only valid inside a function started by sparkddl."""
    if _current is None:
        raise SparkDDLError("not inside a sparkddl barrier task; call this from a function "
                            "started by sparkddl.run or TorchEstimator.fit")
    return _current


def is_active() -> bool:
    return _current is not None


def set_current(ctx: RankContext | None) -> None:
    global _current
    _current = ctx


@contextmanager
def collective(name: str, status: dict[str, Any] | None = None) -> Iterator[None]:
    """Mark the calling rank as waiting in collective ``name`` for the duration.

    Every place that can block on other ranks enters through here, so the driver's watchdog
    can tell a rank that waits for its peers from the rank they wait for. Nested marks keep
    the outermost name. ``status`` defaults to the running rank's; outside a sparkddl task
    this does nothing.
    """
    if status is None and _current is not None:
        status = _current.status
    if status is None or status.get("collective"):
        yield
        return
    status["collective"] = name
    try:
        yield
    finally:
        status["collective"] = ""
