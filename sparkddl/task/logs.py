"""Forward a rank's stdout, stderr and logging output to the driver, line by line, live."""
from __future__ import annotations

import io
import logging
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, TextIO

from sparkddl.channel.client import RankChannel
from sparkddl.channel.messages import Log

# a line longer than this is sent in pieces the driver stitches back together
CHUNK_CHARS = 1 << 20


class ChannelStream(io.TextIOBase):
    """A text stream that sends complete lines to the driver and also writes them through
    to the stream it replaced (so executor logs keep them). Once detached it only writes
    through, which keeps handlers that captured it during the task harmless afterwards."""

    def __init__(self, name: str, channel: RankChannel, original: TextIO | None):
        super().__init__()
        self.name = name
        self._channel: RankChannel | None = channel
        self._original = original
        self._buffer = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._write_through(text)
        with self._lock:
            if self._channel is None:
                return len(text)
            self._buffer += text
            *lines, self._buffer = self._buffer.split("\n")
            for line in lines:
                self._send(line)
        return len(text)

    def flush(self) -> None:
        if self._original is not None:
            try:
                self._original.flush()
            except (OSError, ValueError):
                pass

    def _write_through(self, text: str) -> None:
        if self._original is not None:
            try:
                self._original.write(text)
            except (OSError, ValueError):
                pass

    def detach_channel(self) -> None:
        with self._lock:
            if self._buffer and self._channel is not None:
                self._send(self._buffer)
            self._buffer = ""
            self._channel = None

    def _send(self, line: str) -> None:
        assert self._channel is not None
        for start in range(0, max(len(line), 1), CHUNK_CHARS):
            piece = line[start:start + CHUNK_CHARS]
            more = start + CHUNK_CHARS < len(line)
            self._channel.post(Log(self.name, more), piece.encode("utf-8", "replace"))


@contextmanager
def forward_output(channel: RankChannel, echo: bool = True) -> Iterator[None]:
    """Swap sys.stdout/sys.stderr for channel streams and route the library's own logging
    to stderr; restore the streams and the logging configuration afterwards (Spark reuses
    Python workers, so nothing may leak into the next task).

    ``echo`` also writes output to the executor's own streams (its log files); it is off in
    local mode, where those streams are the driver's terminal and every line would show twice.
    """
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    wrapped = {name: ChannelStream(name, channel, s if echo else None)
               for name, s in streams.items()}
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    ours = logging.getLogger("sparkddl")
    saved_ours = (list(ours.handlers), ours.level, ours.propagate)
    handler = logging.StreamHandler(wrapped["stderr"])
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    sys.stdout, sys.stderr = wrapped["stdout"], wrapped["stderr"]
    ours.handlers, ours.propagate = [handler], False
    ours.setLevel(logging.INFO)
    try:
        yield
    finally:
        for s in wrapped.values():
            s.detach_channel()
        sys.stdout, sys.stderr = streams["stdout"], streams["stderr"]
        root.handlers = saved_root[0]
        root.setLevel(saved_root[1])
        ours.handlers, ours.propagate = saved_ours[0], saved_ours[2]
        ours.setLevel(saved_ours[1])
