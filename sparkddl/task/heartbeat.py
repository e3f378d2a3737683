"""Every rank tells the driver, once a second, where it is and what it is doing, from the
moment it connects: the driver's watchdog fails a run whose ranks stop moving, and its
report names the rank, its step and its phase."""
from __future__ import annotations

import threading
from typing import Any

from sparkddl.channel import messages
from sparkddl.channel.client import RankChannel


class Heartbeat:
    """Sends the status as a Heartbeat every ``interval_s`` until stopped; the
    status dict is shared with the code that updates it (the rank's context)."""

    def __init__(self, channel: RankChannel, status: dict[str, Any], interval_s: float = 1.0):
        self.channel, self.status, self.interval_s = channel, status, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="sparkddl-heartbeat")

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + 5)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.channel.post(messages.Heartbeat.of(self.status))
