"""Where a fit's or a run's wall-clock time went: its phases in order, each the seconds from
the end of the one before to its own end, so that they add up to the whole. Phases met
again (a relaunch's stage) add to what they had."""
from __future__ import annotations

import time
from typing import Any, Callable


class Phases:
    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 started: float | None = None):
        self.clock = clock
        self.started = clock() if started is None else started
        self._last = self.started
        self.seconds: dict[str, float] = {}

    def now(self) -> float:
        return self.clock()

    def end(self, name: str, at: float | None = None) -> None:
        """Phase ``name`` ended ``at`` (a time of ``clock``; now when None). A time before the
        previous phase's end (an event that never came, or came late) adds nothing."""
        at = self.clock() if at is None else max(at, self._last)
        self.seconds[name] = self.seconds.get(name, 0.0) + (at - self._last)
        self._last = at

    @property
    def total_s(self) -> float:
        return self._last - self.started

    def rounded(self) -> dict[str, float]:
        """Seconds by phase to the millisecond, for the run's record."""
        return {name: round(s, 3) for name, s in self.seconds.items()}

    def line(self) -> str:
        """'12.4 s: checks 0.4 s, data 2.1 s, ...' for the end-of-fit log line."""
        parts = ", ".join(f"{name} {s:.2f} s" for name, s in self.seconds.items())
        return f"{self.total_s:.2f} s: {parts}"


class Arrivals:
    """When each rank of a stage said hello on its own channel (its task's Python is up; a
    rank's last-words connection does not count), and when the last of ``world`` did: the
    end of a stage's ``launch`` phase. A handler of Hello messages."""

    def __init__(self, world: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.world, self.clock = world, clock
        self.at: dict[int, float] = {}

    def reset(self, world: int) -> None:
        """A new stage (a relaunch) of ``world`` ranks."""
        self.world, self.at = world, {}

    def __call__(self, msg: Any, body: Any) -> None:
        if body.role == "":
            self.at.setdefault(msg.rank, self.clock())

    @property
    def all_up_at(self) -> float | None:
        return max(self.at.values()) if self.world and len(self.at) >= self.world else None
