"""The driver channel over real loopback sockets: authentication, limits, live delivery."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from sparkddl.channel import DriverChannel, RankChannel, protocol


class Inbox:
    def __init__(self):
        self.messages = []
        self.arrived = threading.Condition()

    def __call__(self, msg):
        with self.arrived:
            self.messages.append(msg)
            self.arrived.notify_all()

    def wait_for(self, predicate, timeout=10.0):
        with self.arrived:
            assert self.arrived.wait_for(lambda: predicate(self.messages), timeout)


@pytest.fixture
def server():
    inbox = Inbox()
    with DriverChannel(inbox, bind_host="127.0.0.1", advertise_host="127.0.0.1") as ch:
        ch.inbox = inbox
        yield ch


def test_rank_with_the_secret_delivers_frames_in_order(server):
    client = RankChannel("127.0.0.1", server.port, server.secret, rank=3)
    for i in range(100):
        client.send({"type": "metric", "i": i}, payload=bytes([i]) * i)
    assert client.flush(10)
    server.inbox.wait_for(lambda m: len(m) == 101)
    assert server.inbox.messages[0].type == "hello" and server.inbox.messages[0].rank == 3
    got = server.inbox.messages[1:]
    assert [m.header["i"] for m in got] == list(range(100))
    assert all(m.payload == bytes([i]) * i and m.rank == 3 for i, m in enumerate(got))
    client.close()


def test_driver_control_frames_reach_the_rank(server):
    seen = []
    client = RankChannel("127.0.0.1", server.port, server.secret, rank=0, on_control=seen.append)
    server.inbox.wait_for(lambda m: any(x.type == "hello" for x in m))
    server.send_to_ranks({"type": "stop", "epoch": 4})
    assert client.wait_for("stop", timeout=10) == {"type": "stop", "epoch": 4}
    assert seen == [{"type": "stop", "epoch": 4}]
    client.close()


def test_wrong_secret_is_rejected_and_training_unaffected(server):
    with pytest.raises((protocol.ProtocolError, ConnectionError, OSError)):
        RankChannel("127.0.0.1", server.port, protocol.new_secret(), rank=0)
    deadline = time.time() + 5
    while server.rejected < 1 and time.time() < deadline:
        time.sleep(0.01)
    assert server.rejected == 1
    assert not server.inbox.messages  # nothing from the impostor reached the handler
    good = RankChannel("127.0.0.1", server.port, server.secret, rank=1)
    good.send({"type": "log"}, b"still fine")
    good.flush()
    server.inbox.wait_for(lambda m: any(x.payload == b"still fine" for x in m))
    good.close()


def test_client_refuses_a_driver_without_the_secret():
    """A fake driver that cannot answer the rank's challenge gets nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def fake_driver():
        conn, _ = listener.accept()
        conn.sendall(b"n" * protocol.NONCE_BYTES)
        protocol.recv_exact(conn, 32 + protocol.NONCE_BYTES)
        conn.sendall(b"x" * 32)
        conn.close()

    t = threading.Thread(target=fake_driver, daemon=True)
    t.start()
    with pytest.raises(protocol.ProtocolError, match="driver did not prove"):
        RankChannel("127.0.0.1", port, protocol.new_secret(), rank=0)
    t.join(5)
    listener.close()


def test_oversized_frame_is_dropped_without_reading_it():
    inbox = Inbox()
    with DriverChannel(inbox, bind_host="127.0.0.1", max_payload=1024) as server:
        client = RankChannel("127.0.0.1", server.port, server.secret, rank=0)
        client.send({"type": "snapshot"}, b"x" * 4096)
        client.flush()
        deadline = time.time() + 5
        while server.rejected < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert server.rejected == 1
        # the stage learns the rank is unheard from now on (it must not wait for its "done")
        inbox.wait_for(lambda m: len(m) == 2)
        assert [m.type for m in inbox.messages] == ["hello", "closed"]
        assert inbox.messages[1].body.dropped
        # a new, well-behaved connection still works
        other = RankChannel("127.0.0.1", server.port, server.secret, rank=1)
        other.send({"type": "metric"}, b"ok")
        other.flush()
        inbox.wait_for(lambda m: any(x.payload == b"ok" for x in m))
        other.close()
        client.close()


def test_huge_header_claim_is_rejected():
    inbox = Inbox()
    with DriverChannel(inbox, bind_host="127.0.0.1") as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        protocol.client_handshake(sock, server.secret)
        sock.sendall(struct.pack(">I", protocol.MAX_HEADER_BYTES + 1))
        deadline = time.time() + 5
        while server.rejected < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert server.rejected == 1 and not inbox.messages
        sock.close()


def test_silent_connection_times_out_of_the_handshake(monkeypatch):
    from sparkddl.channel import server as server_mod
    monkeypatch.setattr(server_mod, "HANDSHAKE_TIMEOUT_S", 0.3)
    with DriverChannel(Inbox(), bind_host="127.0.0.1") as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        deadline = time.time() + 5
        while server.rejected < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert server.rejected == 1
        sock.close()


def _channel_threads() -> int:
    return sum(t.name.startswith("sparkddl-channel-") for t in threading.enumerate())


def _eventually(predicate, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(120)
def test_ranks_join_during_a_flood_of_idle_connections(server):
    """Strangers open connections and never speak: at most MAX_PENDING of them wait for a
    handshake (the oldest is dropped), so threads stay bounded and ranks still join."""
    from sparkddl.channel.server import MAX_PENDING
    before = _channel_threads()
    idle, stop, peak = [], threading.Event(), [0]

    def flood():
        while not stop.is_set() and len(idle) < 800:
            idle.append(socket.create_connection(("127.0.0.1", server.port)))

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        joined = 0
        while flooder.is_alive() or joined < 5:
            client = RankChannel("127.0.0.1", server.port, server.secret, rank=joined)
            client.send({"type": "metric", "i": joined})
            assert client.flush(10)
            client.close()
            joined += 1
            assert len(server._pending) <= MAX_PENDING
            peak[0] = max(peak[0], _channel_threads() - before)
        server.inbox.wait_for(lambda msgs: sum(m.type == "metric" for m in msgs) == joined)
    finally:
        stop.set()
        flooder.join()
        for sock in idle:
            sock.close()
    assert len(idle) == 800 and joined >= 5
    # one thread per connection would have meant 800; dropped ones end as they are dropped
    assert peak[0] < len(idle) / 5, peak
    # every stranger is dropped exactly once (evicted, or its end closed), no rank is
    assert _eventually(lambda: server.rejected == len(idle)), server.rejected
    assert _eventually(lambda: _channel_threads() <= before)


@pytest.mark.timeout(60)
def test_the_accept_loop_survives_an_error_serving_a_connection(server, monkeypatch):
    real, failures = DriverChannel._admit, []

    def fail_once(self, sock, peer):
        if not failures:
            failures.append(peer)
            raise RuntimeError("can't start new thread")
        return real(self, sock, peer)

    monkeypatch.setattr(DriverChannel, "_admit", fail_once)
    first = socket.create_connection(("127.0.0.1", server.port))
    assert first.recv(1) == b""  # closed by the driver: it could not serve it
    client = RankChannel("127.0.0.1", server.port, server.secret, rank=0)
    client.send({"type": "metric", "i": 0})
    assert client.flush(10)
    server.inbox.wait_for(lambda msgs: any(m.type == "metric" for m in msgs))
    assert failures and server._thread.is_alive()
    client.close()
