"""Communication accounting every strategy shares: bytes handed to collectives, and calls."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CommStats:
    """Payload bytes this rank hands to collectives, and how many calls, since the last reset."""

    bytes: int = 0
    calls: int = 0

    def add(self, nbytes: int, calls: int = 1) -> None:
        self.bytes += int(nbytes)
        self.calls += calls

    def take(self) -> dict[str, int]:
        out = {"comm_bytes": self.bytes, "comm_calls": self.calls}
        self.bytes = self.calls = 0
        return out


def tensor_bytes(t: Any) -> int:
    return t.numel() * t.element_size()
