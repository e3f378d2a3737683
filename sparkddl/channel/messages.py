"""Every message between the driver and the ranks, typed: one frozen dataclass per kind.

On the wire a message is its frame header, ``{"type": KIND, **fields}`` (plain JSON values),
plus the frame's payload bytes where a kind carries some (log text, snapshot weights).
Ranks send with ``RankChannel.post``; the driver parses a header with :func:`parse` and
dispatches on the class (``launch/monitor.py`` holds the one table).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Body:
    KIND: ClassVar[str] = ""

    def header(self) -> dict[str, Any]:
        return {"type": self.KIND, **dataclasses.asdict(self)}


# ---- rank -> driver ----

LAST_WORDS = "last_words"  # Hello.role of a rank's second connection (task/last_words.py)


@dataclass(frozen=True)
class Hello(Body):
    """First frame of a connection (after the handshake). ``role`` "" is the rank's channel;
    LAST_WORDS a connection that carries, after this frame, only the raw text Python's
    faulthandler writes should the rank's process die of a fatal signal."""
    KIND: ClassVar[str] = "hello"
    rank: int
    host: str = ""  # where the rank runs: its executor's address (and id, and hostname)
    pid: int = 0
    executor: str = ""  # the executor's id, where the cluster manager tells it
    role: str = ""


@dataclass(frozen=True)
class Rendezvous(Body):
    """Rank 0 reports its TCPStore's real port; the driver relays it to every rank."""
    KIND: ClassVar[str] = "rendezvous"
    port: int


@dataclass(frozen=True)
class Log(Body):
    """A line (or, with ``partial``, the start of one) of a rank's stdout/stderr: payload."""
    KIND: ClassVar[str] = "log"
    stream: str = "stdout"
    partial: bool = False


@dataclass(frozen=True)
class Heartbeat(Body):
    """Where a rank is, once a second: phase, global steps done, epoch and step in it, the
    collective it waits in ('' when none), and whether it is still starting (importing
    torch, joining the rendezvous)."""
    KIND: ClassVar[str] = "heartbeat"
    phase: str = ""
    steps: int = 0
    epoch: int | None = None
    step: int | None = None
    collective: str = ""
    starting: bool = False

    @classmethod
    def of(cls, status: dict[str, Any]) -> "Heartbeat":
        return cls(**{f.name: status[f.name] for f in dataclasses.fields(cls)
                      if status.get(f.name) is not None})


@dataclass(frozen=True)
class Error(Body):
    """A rank's failure, reported before the process group is torn down."""
    KIND: ClassVar[str] = "error"
    message: str
    traceback: str = ""
    host: str = ""
    status: dict[str, Any] = field(default_factory=dict)  # where the rank was
    exception: str = ""  # the exception's class, module-qualified
    location: str = ""  # where it was raised: file name and function


@dataclass(frozen=True)
class Done(Body):
    """The rank's function returned; ``group``: the size of the largest default process group
    it formed (-1: not watched)."""
    KIND: ClassVar[str] = "done"
    group: int = -1


@dataclass(frozen=True)
class Progress(Body):
    KIND: ClassVar[str] = "progress"
    epoch: int
    step: int
    steps: int  # per epoch
    loss: float


@dataclass(frozen=True)
class Epoch(Body):
    """One row of epoch statistics, averaged over the ranks."""
    KIND: ClassVar[str] = "epoch"
    row: dict[str, Any]


@dataclass(frozen=True)
class Snapshot(Body):
    """Model weights as torch.save bytes in the payload, or at ``url`` in the Store;
    ``metrics``: the validation metrics, where the ranks evaluated the snapshot."""
    KIND: ClassVar[str] = "snapshot"
    epoch: int
    final: bool = False
    url: str | None = None
    metrics: dict[str, float] | None = None


@dataclass(frozen=True)
class Checkpoint(Body):
    KIND: ClassVar[str] = "checkpoint"
    epoch: int
    step: int
    url: str


@dataclass(frozen=True)
class Stacks(Body):
    """A rank's Python stacks, every thread (payload: text), as the driver asked."""
    KIND: ClassVar[str] = "stacks"


# ---- driver -> rank ----

@dataclass(frozen=True)
class Stop(Body):
    """Early stopping: the ranks agree to stop after the current epoch. With ``regrow``,
    they stop to be relaunched on more ranks: a checkpoint is written where they stop."""
    KIND: ClassVar[str] = "stop"
    epoch: int
    regrow: bool = False


@dataclass(frozen=True)
class DumpStacks(Body):
    """The watchdog fired: send your Python stacks (a Stacks message)."""
    KIND: ClassVar[str] = "dump_stacks"


# ---- the driver's own ----

@dataclass(frozen=True)
class Closed(Body):
    """A rank's connection closed (normal after Done; otherwise the rank died), or, with
    ``dropped``, the driver dropped it for a protocol error (the rank lives on, unheard)."""
    KIND: ClassVar[str] = "closed"
    dropped: bool = False


@dataclass(frozen=True)
class LastWords(Body):
    """What a rank's LAST_WORDS connection carried before it closed (payload): faulthandler's
    report of the fatal signal that killed the rank, with its Python stacks. Handed over
    before the rank's Closed."""
    KIND: ClassVar[str] = "last_words"
    host: str = ""  # where the rank ran, as its hello said


KINDS: dict[str, type[Body]] = {cls.KIND: cls for cls in (
    Hello, Rendezvous, Log, Heartbeat, Error, Done, Progress, Epoch, Snapshot, Checkpoint, Stop,
    Closed, Stacks, DumpStacks, LastWords)}


def parse(header: dict[str, Any]) -> Body | None:
    """The typed message of a frame header; None for an unknown or malformed one (the
    channel authenticated its sender, but a newer rank may send kinds this driver lacks)."""
    cls = KINDS.get(str(header.get("type", "")))
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in header.items() if k in names})
    except TypeError:  # a required field is missing
        return None
