"""Timestamps of what sparkddl does on the driver and of what its ranks report, taken
without editing the library: wrappers around its driver-side functions and the arrival times
of the ranks' channel messages (wall clock: the ranks of a local master share the clock)."""
from __future__ import annotations

import functools
import time
from typing import Any

# what a phase of a run's timeline is, for breakdowns
DATA, CHECKS, LAUNCH, LOOP, END = ("DataFrame -> Parquet", "driver checks",
                                   "launch -> ranks training", "training loop",
                                   "teardown + results")


def recording(spans: list[tuple[str, float, float]], name: str, original: Any) -> Any:
    """``original``, appending (name, start, end) to ``spans`` on every call."""
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            spans.append((name, start, time.time()))
    return timed


class Trace:
    """Wall-clock timestamps of sparkddl's driver-side calls and of the ranks' messages as
    they reach the driver, taken by wrapping library functions (restored by ``close``)."""

    def __init__(self) -> None:
        from sparkddl.data import fingerprint, materialize
        from sparkddl.fit import inputs
        from sparkddl.launch import launcher, monitor
        self.spans: list[tuple[str, float, float]] = []
        self.messages: list[tuple[str, int, float, str]] = []
        self._saved: list[tuple[Any, str, Any]] = []
        for owner, names in [(inputs, ["prepare", "check_sample"]),
                             (launcher, ["run_stage"]),
                             (materialize, ["_size", "_profile", "_write", "_cached",
                                            "write_meta"]),
                             (fingerprint, ["plan_text", "input_file_identity",
                                            "identified_by_files"])]:
            for name in names:
                self._wrap(owner, name)
        self._wrap_monitor(monitor.StageMonitor)

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, recording(self.spans, name, original))

    def _wrap_monitor(self, cls: Any) -> None:
        original = cls.handle

        def handle(monitor: Any, msg: Any) -> None:
            text = msg.payload[:200].decode("utf-8", "replace") if msg.type == "log" else ""
            self.messages.append((msg.type, msg.rank, time.time(), text))
            return original(monitor, msg)
        self._saved.append((cls, "handle", original))
        cls.handle = handle

    def close(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def reset(self) -> None:
        self.spans.clear()
        self.messages.clear()

    def span(self, name: str) -> tuple[float, float]:
        found = [(s, e) for n, s, e in self.spans if n == name]
        return found[-1] if found else (float("nan"), float("nan"))

    def total(self, *names: str) -> float:
        return sum(e - s for n, s, e in self.spans if n in names)

    def first(self, kind: str, rank: int | None = None) -> float:
        times = [t for k, r, t, _ in self.messages if k == kind and rank in (None, r)]
        return min(times) if times else float("nan")

    def last(self, kind: str, rank: int | None = None) -> float:
        times = [t for k, r, t, _ in self.messages if k == kind and rank in (None, r)]
        return max(times) if times else float("nan")

    def launch_phases(self, stage_start: float) -> list[tuple[str, str, float, float]]:
        """Stage submitted -> rank 0's task connected to the driver channel -> every rank
        joined the rendezvous (each rank's first log line says so)."""
        hello = self.first("hello", 0)
        return [("stage submit -> rank 0's task connected (task launch, worker, unpickle)",
                 LAUNCH, stage_start, hello),
                ("-> every rank joined the rendezvous", LAUNCH, hello, self.joined())]

    def joined(self) -> float:
        """When the last rank's first log line ('rank r/N joined ...') arrived."""
        ranks = {r for k, r, _, _ in self.messages if k == "hello"}
        return max(self.first("log", r) for r in ranks) if ranks else float("nan")

    def materialize_phases(self) -> dict[str, float]:
        return {"fingerprint (plan + input files)": self.total(
                    "plan_text", "input_file_identity", "identified_by_files"),
                "cache lookups": self.total("_cached"),
                "count + first row (data identified by its files)": self.total("_size"),
                "profile job (other data: count, nulls, lengths, labels, content hash)":
                    self.total("_profile"),
                "write job (encode + check, Parquet) + footers": self.total("_write"),
                "write meta.json": self.total("write_meta")}
