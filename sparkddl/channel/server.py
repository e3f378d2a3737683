"""Driver end of the channel: an authenticated TCP server that ranks report to."""
from __future__ import annotations

import collections
import errno
import functools
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.channel import protocol
from sparkddl.channel.messages import LAST_WORDS, Body, Closed, Hello, LastWords, parse

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
CLOSE_JOIN_S = 2.0
# connections accepted but not yet authenticated: beyond this, the oldest is dropped, so a
# flood of idle connections holds a bounded number of threads and sockets, and a rank that
# connects during one still gets its handshake (a rank's takes milliseconds)
MAX_PENDING = 64
# threads in a handshake, the dropped strangers' included until they have ended: the accept
# loop waits (up to HANDSHAKE_SLOT_WAIT_S) for one to end before it starts another, so a flood
# holds a bounded number of threads however slowly a loaded host runs the dropped ones out
MAX_HANDSHAKES = 2 * MAX_PENDING
HANDSHAKE_SLOT_WAIT_S = 2.0
ACCEPT_RETRY_S = 0.05
REJECTIONS_LOGGED = 10  # then one line per 1,000
# a rank's last words (faulthandler's stacks of every thread): at most this much is kept
MAX_LAST_WORDS = 256 << 10
# when a rank's channel closes, how long its last-words connection may take to close too
# (both close when the process dies; their threads read them independently)
LAST_WORDS_WAIT_S = 2.0
LAST_WORDS_QUIET_S = 0.5  # once some have come: silence this long ends a rank's last words


@dataclass
class Message:
    """One frame received from a rank; ``reply`` sends a control frame back to that rank."""

    rank: int
    header: dict[str, Any]
    payload: bytes = b""
    reply: Callable[[dict[str, Any]], None] = lambda header: None

    @property
    def type(self) -> str:
        return str(self.header.get("type", ""))

    @functools.cached_property
    def body(self) -> Body | None:
        """The typed message (None for an unknown kind)."""
        return parse(self.header)


Handler = Callable[[Message], None]


class _Connection:
    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self.rank = -1
        self.lock = threading.Lock()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self.lock:
            protocol.send_frame(self.sock, header, payload)


class DriverChannel:
    """Accepts rank connections that prove they hold the run's secret and hands every
    frame they send to ``handler`` (called on the connection's thread).

    ``rejected`` counts connections dropped for a bad handshake or an oversized/malformed
    frame; training is never affected by them.
    """

    def __init__(self, handler: Handler, bind_host: str = "0.0.0.0", advertise_host: str = "",
                 secret: str | None = None,
                 max_payload: int = protocol.DEFAULT_MAX_PAYLOAD_BYTES):
        self.secret = secret or protocol.new_secret()
        self._handler = handler
        self._max_payload = max_payload
        self._listener = socket.create_server((bind_host, 0), backlog=128)
        self.port = self._listener.getsockname()[1]
        self.host = advertise_host or socket.gethostname()
        self._conns: list[_Connection] = []
        self._pending: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        # rank -> its last-words connection, and an event set once that has been handled
        self._last_words: dict[int, tuple[_Connection, threading.Event]] = {}
        self._threads: list[threading.Thread] = []
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.rejected = 0
        self._thread = threading.Thread(target=self._accept_loop, name="sparkddl-channel",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def __enter__(self) -> "DriverChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_to_ranks(self, header: dict[str, Any]) -> None:
        """Send a control frame (e.g. a stop flag) to every connected rank."""
        with self._lock:
            conns = [c for c in self._conns if c.rank >= 0]
        for conn in conns:
            _send_quietly(conn, header)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
            threads = list(self._threads)
            quiet = [conn for conn, _ in self._last_words.values()]
        for conn in conns:
            _close_quietly(conn.sock)
        for conn in quiet:  # their threads block in recv(): a close alone does not wake them
            _drop(conn.sock)
        for thread in threads:  # they end once their socket is closed
            thread.join(CLOSE_JOIN_S)

    def _accept_loop(self) -> None:
        """Accept until closed; no error ends it (out of file descriptors or threads, a
        failing peer): it is logged, and accepting goes on."""
        while not self._closed.is_set():
            try:
                sock, addr = self._listener.accept()
            except OSError as exc:
                if self._closed.is_set():
                    return
                log.warning("channel: accept failed (%s); retrying", exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._evict_oldest()  # free a descriptor held by an idle stranger
                time.sleep(ACCEPT_RETRY_S)
                continue
            try:
                self._admit(sock, f"{addr[0]}:{addr[1]}")
            except Exception as exc:  # noqa: BLE001 - e.g. no thread could be started
                log.warning("channel: could not serve a connection from %s:%s (%s)",
                            addr[0], addr[1], exc)
                _close_quietly(sock)
                time.sleep(ACCEPT_RETRY_S)

    def _admit(self, sock: socket.socket, peer: str) -> None:
        conn = _Connection(sock, peer)
        with self._lock:
            while len(self._pending) >= MAX_PENDING:
                oldest, _ = self._pending.popitem(last=False)
                _drop(oldest.sock)  # its thread ends with a rejected handshake
            self._pending[conn] = None
        # a slot for its handshake: past the wait (threads that do not end), it goes on anyway
        slot = self._handshakes.acquire(timeout=HANDSHAKE_SLOT_WAIT_S)
        thread = threading.Thread(target=self._serve, args=(conn, slot), daemon=True,
                                  name=f"sparkddl-channel-{conn.peer}")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._pending.pop(conn, None)
            if slot:
                self._handshakes.release()
            raise

    def _evict_oldest(self) -> None:
        with self._lock:
            if not self._pending:
                return
            oldest, _ = self._pending.popitem(last=False)
        _drop(oldest.sock)

    def _serve(self, conn: _Connection, slot: bool = False) -> None:
        try:
            conn.sock.settimeout(HANDSHAKE_TIMEOUT_S)
            protocol.server_handshake(conn.sock, self.secret)
            header, _ = protocol.recv_frame(conn.sock, max_payload=0)
            if not isinstance(parse(header), Hello) or not isinstance(header.get("rank"), int):
                raise protocol.ProtocolError("first frame was not a hello with a rank")
            conn.rank = header["rank"]
            conn.sock.settimeout(None)
        except (OSError, protocol.ProtocolError) as exc:
            self._reject(conn, exc)
            return
        finally:
            with self._lock:
                self._pending.pop(conn, None)
            if slot:
                self._handshakes.release()
        if header.get("role") == LAST_WORDS:
            self._hear_last_words(conn, str(header.get("host", "")))
            return
        with self._lock:
            self._conns.append(conn)
        reply = functools.partial(_send_quietly, conn)
        self._dispatch(Message(conn.rank, header, reply=reply))
        try:
            while True:
                header, payload = protocol.recv_frame(conn.sock, self._max_payload)
                self._dispatch(Message(conn.rank, header, payload, reply))
        except protocol.ProtocolError as exc:
            self._reject(conn, exc)
            # the rank's later frames (its "done" too) are lost: the stage must not wait
            # for them
            self._dispatch(Message(conn.rank, Closed(dropped=True).header()))
        except OSError:  # the rank closed its end: normal at the end of a task, after "done"
            self._await_last_words(conn.rank)
            self._dispatch(Message(conn.rank, Closed().header()))
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            _close_quietly(conn.sock)

    def _hear_last_words(self, conn: _Connection, host: str) -> None:
        """Read a rank's last-words connection until it closes: nothing after a normal end;
        after a fatal signal, faulthandler's text, handed over as a LastWords message."""
        heard = threading.Event()
        with self._lock:
            self._last_words[conn.rank] = (conn, heard)
        chunks: list[bytes] = []
        try:
            while sum(map(len, chunks)) < MAX_LAST_WORDS:
                chunk = conn.sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                # faulthandler writes in one burst; a forked child holding the socket
                # open must not keep the driver from hearing it
                conn.sock.settimeout(LAST_WORDS_QUIET_S)
        except OSError:
            pass
        finally:
            _close_quietly(conn.sock)
        try:
            if chunks:
                self._dispatch(Message(conn.rank, LastWords(host).header(),
                                       b"".join(chunks)[:MAX_LAST_WORDS]))
        finally:
            heard.set()

    def _await_last_words(self, rank: int) -> None:
        """Before a rank's channel is reported closed: its last words, if it has any, so
        that a rank killed by a signal is never taken for one that died silently."""
        with self._lock:
            entry = self._last_words.get(rank)
        if entry is not None:
            entry[1].wait(LAST_WORDS_WAIT_S)

    def _dispatch(self, msg: Message) -> None:
        if self._closed.is_set():  # a stage that is over: its late frames must not count
            return
        try:
            self._handler(msg)
        except Exception:  # a bad handler must not take the channel down
            log.exception("channel handler failed on a %r message from rank %d", msg.type, msg.rank)

    def _reject(self, conn: _Connection, exc: Exception) -> None:
        if self._closed.is_set():
            return
        with self._lock:
            self.rejected += 1
            count = self.rejected
        who = f"rank {conn.rank}" if conn.rank >= 0 else conn.peer
        if conn.rank < 0 and isinstance(exc, ConnectionError):
            # closed before authenticating: a reachability probe or a port scan
            log.debug("channel: %s closed before its handshake (%s)", who, exc)
        elif count <= REJECTIONS_LOGGED or count % 1000 == 0:
            more = f" ({count} dropped so far)" if count > REJECTIONS_LOGGED else ""
            log.warning("channel dropped a connection from %s: %s%s", who, exc, more)
        _close_quietly(conn.sock)


def _send_quietly(conn: _Connection, header: dict[str, Any]) -> None:
    try:
        conn.send(header)
    except OSError as exc:  # the rank went away; its task failure is reported elsewhere
        log.debug("could not send %s to rank %d: %s", header.get("type"), conn.rank, exc)


def _drop(sock: socket.socket) -> None:
    """Wake the thread blocked reading ``sock`` (a close alone does not), then close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    _close_quietly(sock)


def _close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
