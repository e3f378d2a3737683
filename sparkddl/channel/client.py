"""Rank end of the channel: one authenticated connection to the driver per task.

Frames are queued and sent by a background thread so that a rank printing or logging never
waits on the network; ``flush`` waits for the queue to drain (used before a task ends and
before a failing rank re-raises, so the driver sees the traceback first).
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from typing import Any, Callable

from sparkddl.channel import protocol
from sparkddl.channel.messages import LAST_WORDS, Body, Hello

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0

ControlHandler = Callable[[dict[str, Any]], None]


def connect(host: str, port: int, secret: str, hello: Hello) -> socket.socket:
    """An authenticated connection to the driver that has said ``hello`` (blocking mode)."""
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol.client_handshake(sock, secret)
        sock.settimeout(None)
        protocol.send_frame(sock, hello.header())
    except BaseException:
        sock.close()
        raise
    return sock


def open_last_words(host: str, port: int, secret: str, rank: int, label: str
                    ) -> socket.socket:
    """The rank's second connection, for faulthandler's text only (see messages.LAST_WORDS);
    nothing else is ever written to it, and the driver never writes back."""
    return connect(host, port, secret, Hello(rank, label, os.getpid(), role=LAST_WORDS))


class RankChannel:
    def __init__(self, host: str, port: int, secret: str, rank: int,
                 on_control: ControlHandler | None = None, label: str = "",
                 executor: str = ""):
        self.rank = rank
        # label: where the rank runs (its executor's address), as the driver names it
        self._sock = connect(host, port, secret, Hello(rank, label or socket.gethostname(),
                                                       os.getpid(), executor))
        # items are frames to send, or an Event to set once everything before it was sent
        self._queue: queue.Queue[tuple[dict[str, Any], bytes] | threading.Event | None] = \
            queue.Queue()
        self._on_control = on_control
        self._broken = False
        self._control: dict[str, dict[str, Any]] = {}
        self._control_arrived = threading.Condition()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name=f"sparkddl-rank{rank}-send")
        self._receiver = threading.Thread(target=self._recv_loop, daemon=True,
                                          name=f"sparkddl-rank{rank}-recv")
        self._sender.start()
        self._receiver.start()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if not self._broken:
            self._queue.put((header, payload))

    def post(self, message: Body, payload: bytes = b"") -> None:
        """Send a typed message (see ``sparkddl.channel.messages``)."""
        self.send(message.header(), payload)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued frame has been written; False if that took too long."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._sender.join(timeout)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._broken:
                continue
            try:
                protocol.send_frame(self._sock, *item)
            except OSError as exc:
                self._broken = True
                log.warning("rank %d lost its channel to the driver: %s", self.rank, exc)
            except Exception as exc:  # noqa: BLE001 - a bad frame (not JSON) must not stop the rest
                log.warning("rank %d could not send a %r frame: %s", self.rank,
                            item[0].get("type"), exc)

    def wait_for(self, kind: str, timeout: float) -> dict[str, Any]:
        """Block until the driver has sent a control frame of type ``kind``; return it."""
        with self._control_arrived:
            if not self._control_arrived.wait_for(lambda: kind in self._control or self._broken,
                                                  timeout):
                raise TimeoutError(f"rank {self.rank} waited {timeout:g}s for {kind!r} "
                                   "from the driver")
            if kind not in self._control:
                raise ConnectionError(f"rank {self.rank} lost its channel to the driver")
            return self._control[kind]

    def _recv_loop(self) -> None:
        try:
            while True:
                header, _ = protocol.recv_frame(self._sock, max_payload=0)
                with self._control_arrived:
                    self._control[str(header.get("type"))] = header
                    self._control_arrived.notify_all()
                if self._on_control is not None:
                    self._on_control(header)
        except (OSError, protocol.ProtocolError):
            pass
        with self._control_arrived:
            self._broken = True
            self._control_arrived.notify_all()
