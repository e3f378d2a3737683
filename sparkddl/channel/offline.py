"""The rank's channel where the executors cannot reach the driver (a Spark Connect client
outside the cluster's network): what a rank would have sent is kept, and travels back in
the barrier stage's output rows once the task ends; the driver then hands it to the same
handlers a live channel feeds. Heartbeats and progress are dropped (nobody watches live),
logs are kept up to a limit per rank (the first part, then a note of what was cut)."""
from __future__ import annotations

from typing import Any

from sparkddl.channel.messages import Body

LOG_LIMIT_BYTES = 1 << 20
DROPPED = ("heartbeat", "progress")


class OfflineChannel:
    offline = True

    def __init__(self, rank: int, log_limit: int = LOG_LIMIT_BYTES):
        self.rank, self.log_limit = rank, log_limit
        self.frames: list[tuple[dict[str, Any], bytes]] = []
        self.log_bytes = self.cut_bytes = 0

    def post(self, message: Body, payload: bytes = b"") -> None:
        self.send(message.header(), payload)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        kind = header.get("type")
        if kind in DROPPED:
            return
        if kind == "log":
            if self.log_bytes + len(payload) > self.log_limit:
                self.cut_bytes += len(payload)
                return
            self.log_bytes += len(payload)
        self.frames.append((header, bytes(payload)))

    def flush(self, timeout: float = 10.0) -> bool:
        return True

    def close(self, timeout: float = 10.0) -> None:
        if self.cut_bytes:
            note = (f"[{self.cut_bytes} bytes of this rank's output were cut: "
                    f"offline ranks keep the first {self.log_limit} bytes]\n")
            self.frames.append(({"type": "log", "stream": "stderr", "partial": False},
                                note.encode()))
            self.cut_bytes = 0

    def wait_for(self, kind: str, timeout: float) -> dict[str, Any]:
        raise RuntimeError(f"an offline rank receives nothing (waited for {kind!r})")
