"""The driver channel over real loopback sockets: authentication, limits, live delivery."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from sparkddl.channel import DriverChannel, RankChannel
from sparkddl.channel import protocol


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
        assert [m.type for m in inbox.messages] == ["hello"]
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
