"""Driver-side handling of what ranks send: live logs and failure reports."""
from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable

from sparkddl.channel import messages as m
from sparkddl.channel.server import Message
from sparkddl.errors import RankFailure
from sparkddl.task import last_words

log = logging.getLogger(__name__)

# a handler gets the frame (rank, payload, reply) and its typed message
Handler = Callable[[Message, Any], None]
Handlers = dict[type, Handler]

# the least time a rank may take to start (import torch, join the rendezvous) before the
# watchdog names it, whatever watchdogTimeout is; with watchdogTimeout='auto', also the
# budget up to its first training step
START_LIMIT_S = 300.0
# watchdogTimeout='auto': the larger of this and AUTO_STEPS times the longest a rank has gone
# between two heartbeats that showed it moving (a step, or a phase such as a checkpoint)
AUTO_FLOOR_S = 60.0
AUTO_STEPS = 20
# a rank whose heartbeats (one a second) stop this long while its connection stays open is
# lost: its host is unreachable or its process frozen. Found in seconds, not after Spark's
# own executor heartbeat (60 s and more) or a collective's timeout (30 minutes)
HEARTBEAT_LOST_S = 10.0


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
    starting: bool = False  # before the rendezvous completed

    def describe(self, now: float) -> str:
        where = f", epoch {self.epoch} step {self.step}" if self.epoch is not None else ""
        waits = (f"waiting in {self.collective}" if self.collective
                 else "not inside a collective")
        return (f"at step {self.steps} ({self.phase}{where}), {waits}, "
                f"no progress for {now - self.moved_at:.1f}s")


class StageMonitor:
    """Routes what the ranks send through one table (message class -> handlers): prints rank
    output as it arrives, relays the rendezvous, records failures, heartbeats and ranks
    that finished or whose connection closed; ``handlers`` adds the caller's own (metrics,
    snapshots, ...), run after the monitor's for the same class.

    ``wake`` is set whenever something the waiting driver must react to happens (a failure
    report).
    """

    def __init__(self, handlers: Handlers | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # when heartbeats arrive and the watchdog looks (tests set it)
        self.failures: dict[int, RankFailure] = {}
        self.wake = threading.Event()
        self.broadcast: Callable[[dict], None] = lambda header: None
        self._rendezvous: dict | None = None
        self._partial: dict[tuple[int, str], list[str]] = {}
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # a rank's "done" or its closing
        self.beats: dict[int, Beat] = {}
        self._first_beat: float | None = None
        self.done: set[int] = set()  # ranks that finished their function
        self.closed: dict[int, float] = {}  # rank -> when its connection closed
        self.dropped: set[int] = set()  # ranks whose connection the driver dropped
        self.connected: set[int] = set()  # ranks that said hello
        self.hello_at: dict[int, float] = {}  # when (lost before any heartbeat: counts)
        self.where: dict[int, str] = {}  # rank -> its executor's address, as it said
        self.executors: dict[int, str] = {}  # rank -> its executor's id ('' if unknown)
        self.lost_ranks: list[RankFailure] = []  # ranks found lost, as failures
        self.slowest_move_s = 0.0  # the longest gap between two moves of a rank, after a step
        self.culprits: list[int] = []  # whom the watchdog blamed when it fired
        self.stacks: dict[int, str] = {}  # ranks' Python stacks, when asked for
        self.table: dict[type, list[Handler]] = {
            m.Hello: [self._hello, self._relay_rendezvous],
            m.Rendezvous: [self._relay_rendezvous],
            m.Log: [self._print], m.Error: [self._failed], m.Closed: [self._closed],
            m.Heartbeat: [self._beat], m.Done: [self._done], m.Stacks: [self._stacks],
            m.LastWords: [self._last_words]}
        # the caller's first: what it records from a message (a Done's group size) is there
        # before a built-in handler wakes whoever waits for that message
        for kind, handler in (handlers or {}).items():
            self.table.setdefault(kind, []).insert(0, handler)

    def wait_finished(self, world: int, timeout_s: float) -> list[int]:
        """Wait until every rank's "done" (its last frame) or the end of its connection has
        been handled, at most ``timeout_s``; the ranks still missing then."""
        deadline = time.monotonic() + timeout_s
        with self._finished:
            while True:
                missing = [r for r in range(world) if r not in self.done and r not in self.closed]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._finished.wait(left)

    def wait_disconnected(self, timeout_s: float, lost: AbstractSet[int] = frozenset()
                          ) -> list[int]:
        """Wait until the connection of every rank that connected has closed, at most
        ``timeout_s``; the ranks still connected then. ``lost`` ranks are not waited for
        (their connection ends when their host comes back, or never)."""
        deadline = time.monotonic() + timeout_s
        with self._finished:
            while True:
                alive = sorted(self.connected - set(self.closed) - set(lost))
                left = deadline - time.monotonic()
                if not alive or left <= 0:
                    return alive
                self._finished.wait(left)

    def collect_stacks(self, ranks: list[int], timeout_s: float) -> dict[int, str]:
        """Ask every rank for its Python stacks; those of ``ranks`` that arrive within
        ``timeout_s`` (a rank whose interpreter is blocked, or gone, cannot answer)."""
        with self._lock:
            self.stacks = {}
        self.broadcast(m.DumpStacks().header())
        deadline = time.monotonic() + timeout_s
        with self._finished:
            while not all(r in self.stacks for r in ranks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._finished.wait(left)
            return {r: self.stacks[r] for r in ranks if r in self.stacks}

    def closed_without_done(self, world: int) -> list[int]:
        """Ranks whose connection ended before their "done" was handled."""
        with self._lock:
            return [r for r in range(world) if r in self.closed and r not in self.done]

    def died_silently(self, before: float) -> list[int]:
        """Ranks whose connection closed before ``before`` without a "done" or a failure
        report: their Python worker or executor died."""
        with self._lock:
            return sorted(r for r, at in self.closed.items()
                          if at <= before and r not in self.done and r not in self.failures
                          and r not in self.dropped)

    def accounted(self) -> int:
        """Ranks that reported a failure or died silently."""
        with self._lock:
            return len(set(self.failures) | (set(self.closed) - self.done - self.dropped))

    def handle(self, msg: Message) -> None:
        body = msg.body
        if body is None:
            log.debug("ignoring a %r frame from rank %d", msg.type, msg.rank)
            return
        for handler in self.table.get(type(body), ()):
            handler(msg, body)

    def _failed(self, msg: Message, body: m.Error) -> None:
        with self._lock:
            self.failures[msg.rank] = RankFailure(
                rank=msg.rank, message=body.message, traceback=body.traceback,
                host=body.host, status=dict(body.status or {}), exception=body.exception,
                location=body.location)
        self.wake.set()

    def _last_words(self, msg: Message, body: m.LastWords) -> None:
        """A fatal signal killed the rank: the cause, not a consequence, so it goes first."""
        text = msg.payload.decode("utf-8", "replace")
        with self._lock:
            failure = last_words.failure(msg.rank, text, body.host or self.where.get(msg.rank, ""),
                                         self.beats.get(msg.rank))
            self.failures = {msg.rank: failure, **self.failures}
        self.wake.set()

    def _closed(self, msg: Message, body: m.Closed) -> None:
        with self._lock:
            self.closed.setdefault(msg.rank, time.monotonic())
            if body.dropped:
                self.dropped.add(msg.rank)
            self._finished.notify_all()

    def _hello(self, msg: Message, body: m.Hello) -> None:
        with self._lock:
            self.connected.add(msg.rank)
            self.hello_at.setdefault(msg.rank, self.clock())
            self.where[msg.rank] = body.host
            self.executors[msg.rank] = body.executor

    def lost(self, limit_s: float = HEARTBEAT_LOST_S) -> list[RankFailure]:
        """Ranks whose heartbeats stopped for ``limit_s`` (or never came, counting from their
        hello: a host lost in a rank's first second) while their connection stayed open, as
        failures naming where they ran."""
        now = self.clock()
        with self._lock:
            heard = {**self.hello_at, **{r: b.heard_at for r, b in self.beats.items()}}
            return [RankFailure(r, f"lost: no heartbeat for {now - at:.0f}s while its "
                                   "connection to the driver stayed open (its host is "
                                   "unreachable, or its process is frozen)",
                                host=self.where.get(r, ""),
                                status={"lost": True, "executor": self.executors.get(r, "")})
                    for r, at in sorted(heard.items())
                    if now - at > limit_s and r not in self.done
                    and r not in self.closed and r not in self.failures]

    def _stacks(self, msg: Message, body: m.Stacks) -> None:
        with self._lock:
            self.stacks[msg.rank] = msg.payload.decode("utf-8", "replace")
            self._finished.notify_all()

    def _done(self, msg: Message, body: m.Done) -> None:
        with self._lock:
            self.done.add(msg.rank)
            self._finished.notify_all()

    def _relay_rendezvous(self, msg: Message, body: m.Hello | m.Rendezvous) -> None:
        """Rank 0 reports its store's real port; every rank gets it, whenever it connects.
        (Spark's allGather would do the same but polls in one-second sleeps.)"""
        with self._lock:
            if isinstance(body, m.Rendezvous) and msg.rank == 0:
                self._rendezvous = body.header()
                self.broadcast(self._rendezvous)
            elif isinstance(body, m.Hello) and self._rendezvous is not None:
                msg.reply(self._rendezvous)

    def _beat(self, msg: Message, body: m.Heartbeat) -> None:
        position = (body.steps, body.epoch, body.step, body.phase, body.collective,
                    body.starting)
        now = self.clock()
        with self._lock:
            if self._first_beat is None:
                self._first_beat = now
            old = self.beats.get(msg.rank)
            moved = now if old is None or old.position != position else old.moved_at
            if old is not None and moved == now and old.steps > 0:
                self.slowest_move_s = max(self.slowest_move_s, now - old.moved_at)
            self.beats[msg.rank] = Beat(position, moved, now, body.phase, int(body.steps),
                                        body.epoch, body.step, body.collective, body.starting)

    def auto_limit(self) -> float:
        """watchdogTimeout='auto': AUTO_STEPS times the slowest move seen, at least
        AUTO_FLOOR_S."""
        return max(AUTO_FLOOR_S, AUTO_STEPS * self.slowest_move_s)

    def stalled(self, limit: float | str, world: int) -> str:
        """'' while the ranks the others wait for still move; otherwise what the watchdog
        reports. A rank still starting (importing torch, joining the rendezvous) or that has
        not reported yet gets ``max(limit_s, START_LIMIT_S)``: a loaded machine may take
        seconds to start a Python worker, and that is not a hang; with ``limit='auto'`` so
        does a rank before its first step, and after it :meth:`auto_limit` applies. Ranks
        that finished are out. A rank that waits in a collective never fires the watchdog by
        itself: the rank it waits for (see ``blamed``) must have stopped too."""
        auto = limit == "auto"
        limit_s = self.auto_limit() if auto else float(limit)
        now = self.clock()
        with self._lock:
            if self._first_beat is None:
                return ""  # no rank has started yet: Spark may still be scheduling the tasks
            beats = {r: b for r, b in self.beats.items() if r not in self.done}
            active = [r for r in range(world) if r not in self.done]
            first = self._first_beat
        start_limit = max(limit_s, START_LIMIT_S)

        def over(rank: int) -> bool:
            if rank not in beats:
                return now - first > start_limit
            beat = beats[rank]
            first_step = beat.starting or (auto and beat.steps == 0)
            return now - beat.moved_at > (start_limit if first_step else limit_s)

        culprits = blamed(beats, active, limit_s, now)
        if not any(over(r) for r in culprits):
            return ""
        self.culprits = culprits
        how = (f" (watchdogTimeout='auto': {AUTO_STEPS}x the slowest step seen, "
               f"{self.slowest_move_s:.1f}s, at least {AUTO_FLOOR_S:g}s)") if auto else ""
        return watchdog_report(beats, active, limit_s, now, how)

    def _print(self, msg: Message, body: m.Log) -> None:
        stream_name = "stderr" if body.stream == "stderr" else "stdout"
        key = (msg.rank, stream_name)
        text = msg.payload.decode("utf-8", "replace")
        with self._lock:
            pieces = self._partial.setdefault(key, [])
            pieces.append(text)
            if body.partial:
                return
            line = "".join(self._partial.pop(key))
        # looked up at write time so notebooks and test captures that swap streams see it
        stream = sys.stderr if stream_name == "stderr" else sys.stdout
        stream.write(f"[rank {msg.rank}] {line}\n")
        stream.flush()


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


def watchdog_report(beats: dict[int, Beat], active: list[int], limit_s: float, now: float,
                    how: str = "") -> str:
    """First line: the likely culprit(s); then one line per rank with where it is."""
    culprits = blamed(beats, active, limit_s, now)

    def line(r: int) -> str:
        if r not in beats:
            return f"rank {r} never reported (its task may not have started)"
        lost = " (no heartbeat for %.1fs)" % (now - beats[r].heard_at) \
            if now - beats[r].heard_at > limit_s else ""
        return f"rank {r} {beats[r].describe(now)}{lost}"

    return (f"watchdog: no progress for {limit_s:g}s{how}; likely cause: " +
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
