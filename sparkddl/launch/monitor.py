"""Driver-side handling of what ranks send: live logs and failure reports."""
from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sparkddl.channel.server import Message
from sparkddl.errors import RankFailure

MessageHook = Callable[[Message], None]


@dataclass
class Beat:
    """A rank's last heartbeat: where it is, when that last changed, when it was heard."""

    position: tuple
    moved_at: float
    heard_at: float
    phase: str
    steps: int  # global steps done
    epoch: int | None
    step: int | None
    collective: str  # the collective it waits in ('' when none)

    def describe(self, now: float) -> str:
        where = f", epoch {self.epoch} step {self.step}" if self.epoch is not None else ""
        waits = (f"waiting in {self.collective}" if self.collective
                 else "not inside a collective")
        return (f"at step {self.steps} ({self.phase}{where}), {waits}, "
                f"no progress for {now - self.moved_at:.1f}s")


class StageMonitor:
    """Prints rank output as it arrives and records rank failures.

    ``wake`` is set whenever something the waiting driver must react to happens (a failure
    report); ``hook`` receives every other message type (metrics, snapshots, ...).
    """

    def __init__(self, hook: MessageHook | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.hook = hook
        self.clock = clock  # when heartbeats arrive and the watchdog looks (tests set it)
        self.failures: dict[int, RankFailure] = {}
        self.wake = threading.Event()
        self.broadcast: Callable[[dict], None] = lambda header: None
        self._rendezvous: dict | None = None
        self._partial: dict[tuple[int, str], list[str]] = {}
        self._lock = threading.Lock()
        self.beats: dict[int, Beat] = {}
        self._first_beat: float | None = None
        self.done: set[int] = set()  # ranks that finished their function
        self.closed: dict[int, float] = {}  # rank -> when its connection closed

    def died_silently(self, before: float) -> list[int]:
        """Ranks whose connection closed before ``before`` without a "done" or a failure
        report: their Python worker or executor died."""
        with self._lock:
            return sorted(r for r, at in self.closed.items()
                          if at <= before and r not in self.done and r not in self.failures)

    def accounted(self) -> int:
        """Ranks that reported a failure or died silently."""
        with self._lock:
            return len(set(self.failures) | (set(self.closed) - self.done))

    def handle(self, msg: Message) -> None:
        if msg.type in ("hello", "rendezvous"):
            self._relay_rendezvous(msg)
        elif msg.type == "log":
            self._print(msg)
        elif msg.type == "error":
            with self._lock:
                self.failures[msg.rank] = RankFailure(
                    rank=msg.rank, message=str(msg.header.get("message", "")),
                    traceback=str(msg.header.get("traceback", "")),
                    host=str(msg.header.get("host", "")),
                    status=dict(msg.header.get("status") or {}))
            self.wake.set()
        elif msg.type == "closed":
            with self._lock:
                self.closed.setdefault(msg.rank, time.monotonic())
        else:
            if msg.type == "heartbeat":
                self._beat(msg)
            if msg.type == "done":
                with self._lock:
                    self.done.add(msg.rank)
            elif self.hook is not None:
                self.hook(msg)

    def _relay_rendezvous(self, msg: Message) -> None:
        """Rank 0 reports its store's real port; every rank gets it, whenever it connects.
        (Spark's allGather would do the same but polls in one-second sleeps.)"""
        with self._lock:
            if msg.type == "rendezvous" and msg.rank == 0:
                self._rendezvous = {"type": "rendezvous", "port": msg.header.get("port")}
                self.broadcast(self._rendezvous)
            elif msg.type == "hello" and self._rendezvous is not None:
                msg.reply(self._rendezvous)

    def _beat(self, msg: Message) -> None:
        h = msg.header
        collective = str(h.get("collective") or "")
        position = (h.get("steps"), h.get("epoch"), h.get("step"), h.get("phase"), collective)
        now = self.clock()
        with self._lock:
            if self._first_beat is None:
                self._first_beat = now
            old = self.beats.get(msg.rank)
            moved = now if old is None or old.position != position else old.moved_at
            self.beats[msg.rank] = Beat(position, moved, now, str(h.get("phase", "")),
                                        int(h.get("steps") or 0), _int(h.get("epoch")),
                                        _int(h.get("step")), collective)

    def stalled(self, limit_s: float, world: int) -> str:
        """'' while every rank moves; otherwise what the watchdog reports. Once any rank has
        reported, every rank must report within ``limit_s``; ranks that finished are out."""
        now = self.clock()
        with self._lock:
            if self._first_beat is None:
                return ""  # no rank has started yet: Spark may still be scheduling the tasks
            beats = {r: b for r, b in self.beats.items() if r not in self.done}
            active = [r for r in range(world) if r not in self.done]
            waited = now - self._first_beat
        stuck = any(now - b.moved_at > limit_s for b in beats.values())
        if not stuck and not (waited > limit_s and any(r not in beats for r in active)):
            return ""
        return watchdog_report(beats, active, limit_s, now)

    def _print(self, msg: Message) -> None:
        stream_name = "stderr" if msg.header.get("stream") == "stderr" else "stdout"
        key = (msg.rank, stream_name)
        text = msg.payload.decode("utf-8", "replace")
        with self._lock:
            pieces = self._partial.setdefault(key, [])
            pieces.append(text)
            if msg.header.get("partial"):
                return
            line = "".join(self._partial.pop(key))
        # looked up at write time so notebooks and test captures that swap streams see it
        stream = sys.stderr if stream_name == "stderr" else sys.stdout
        stream.write(f"[rank {msg.rank}] {line}\n")
        stream.flush()


def _int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[arg-type]


def blamed(beats: dict[int, Beat], active: list[int], limit_s: float, now: float
           ) -> list[int]:
    """The ranks the others are most likely waiting for, by evidence, never by timing alone:
    ranks that never reported or whose heartbeats stopped; then, among the ranks that are
    not inside a collective (their peers wait in one for them), those with the least
    progress; only when every rank waits in a collective, the least advanced of them."""
    lost = [r for r in active if r not in beats or now - beats[r].heard_at > limit_s]
    heard = [r for r in active if r not in lost]
    free = [r for r in heard if not beats[r].collective]
    pool = free if free or lost else heard
    least = min((beats[r].steps for r in pool), default=0)
    return lost + [r for r in pool if beats[r].steps == least]


def watchdog_report(beats: dict[int, Beat], active: list[int], limit_s: float, now: float
                    ) -> str:
    """First line: the likely culprit(s); then one line per rank with where it is."""
    culprits = blamed(beats, active, limit_s, now)

    def line(r: int) -> str:
        if r not in beats:
            return f"rank {r} never reported (its task may not have started)"
        lost = " (no heartbeat for %.1fs)" % (now - beats[r].heard_at) \
            if now - beats[r].heard_at > limit_s else ""
        return f"rank {r} {beats[r].describe(now)}{lost}"

    return (f"watchdog: no progress for {limit_s:g}s; likely cause: " +
            "; ".join(line(r) for r in culprits) +
            ". Raise watchdogTimeout if steps are legitimately this slow. Every rank:\n" +
            "\n".join(f"  {line(r)}" for r in active))


_TASK_PATTERNS = (re.compile(r"ResultTask\(\d+, (\d+)\)"),
                  re.compile(r"[Ll]ost task (\d+)\.\d+ in stage"))


def failures_from_spark_error(text: str) -> list[RankFailure]:
    """Recover the failing rank and the Python traceback from Spark's job error text, for
    failures the rank could not report itself (e.g. its process died)."""
    rank = next((int(m.group(1)) for p in _TASK_PATTERNS for m in [p.search(text)] if m), None)
    if rank is None:
        return []
    tb = ""
    if "PythonException:" in text:
        tb = text.split("PythonException:", 1)[1]
        tb = re.split(r"\n\s+at |\n\tat ", tb, maxsplit=1)[0].strip()
    message = tb.strip().splitlines()[-1] if tb.strip() else _first_reason(text)
    return [RankFailure(rank=rank, message=message, traceback=tb)]


DIED_SILENTLY = ("its connection to the driver closed without a report: its Python worker "
                 "or its executor died")


def ordered_failures(text: str, reported: list[RankFailure], dead: list[int]
                     ) -> list[RankFailure]:
    """Every failure, the likely cause first: ranks that died without reporting (named with
    what Spark's job error ``text`` says of them, if anything), then the reports (peers whose
    collectives broke), then a rank only Spark's error names."""
    named = {f.rank: f for f in unreported_failures(text, reported)}
    first = [named.pop(r, None) or RankFailure(r, DIED_SILENTLY) for r in dead]
    return first + list(reported) + list(named.values())


def unreported_failures(text: str, reported: list[RankFailure]) -> list[RankFailure]:
    """The failure Spark's job error names, if its rank did not report one itself (its
    process or executor died). A traceback in that text that is a reporting peer's own (Spark
    quotes whichever Python error it saw) is not pinned on the silent rank."""
    ranks = {f.rank for f in reported}
    out = []
    for failure in failures_from_spark_error(text):
        if failure.rank in ranks:
            continue
        if failure.traceback and any(f.message and f.message in failure.traceback
                                     for f in reported):
            failure = RankFailure(failure.rank, _first_reason(text.split("PythonException:")[0]))
        out.append(failure)
    return out


def _first_reason(text: str) -> str:
    """The most telling line: what happened to the task (its executor or Python worker died)
    before any generic exception line such as Spark's "Job aborted"."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for markers in (("ExecutorLostFailure", "exited", "crashed", "killed", "lost"),
                    ("Exception", "Error")):
        for line in lines:
            if any(m in line or m in line.lower() for m in markers):
                return line[:500]
    return lines[0][:500] if lines else "unknown failure"
