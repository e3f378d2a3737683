"""Wire format of the driver channel: mutual HMAC authentication, then framed messages.

A frame is a 4-byte big-endian header length, a UTF-8 JSON header, and an optional binary
payload whose length the header declares as ``size``. Payloads are opaque bytes; nothing
read from the network is ever unpickled.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from typing import Any

MAX_HEADER_BYTES = 1 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 64 << 20
NONCE_BYTES = 32
_LEN = struct.Struct(">I")


class ProtocolError(ConnectionError):
    """The peer broke the protocol: bad authentication, oversized or malformed frame."""


def new_secret() -> str:
    """A fresh per-run secret (hex) shipped to the ranks in the task spec."""
    return os.urandom(32).hex()


def _digest(secret: str, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), role + nonce, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    if payload:
        header = {**header, "size": len(payload)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw + payload)


def recv_frame(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES
               ) -> tuple[dict[str, Any], bytes]:
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {length} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(recv_exact(sock, length))
    except ValueError as exc:
        raise ProtocolError(f"malformed header: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    size = header.get("size", 0)
    if not isinstance(size, int) or size < 0:
        raise ProtocolError(f"bad payload size {size!r}")
    if size > max_payload:
        raise ProtocolError(f"payload of {size} bytes exceeds the {max_payload}-byte limit")
    return header, recv_exact(sock, size) if size else b""


def server_handshake(sock: socket.socket, secret: str) -> None:
    """Driver side: prove the client knows the secret, then prove we do."""
    nonce = os.urandom(NONCE_BYTES)
    sock.sendall(nonce)
    answer = recv_exact(sock, 32)
    client_nonce = recv_exact(sock, NONCE_BYTES)
    if not hmac.compare_digest(answer, _digest(secret, nonce, b"rank")):
        raise ProtocolError("client did not present the run's secret")
    sock.sendall(_digest(secret, client_nonce, b"driver"))


def client_handshake(sock: socket.socket, secret: str) -> None:
    """Rank side: answer the driver's challenge and check the driver's answer to ours."""
    nonce = recv_exact(sock, NONCE_BYTES)
    client_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(_digest(secret, nonce, b"rank") + client_nonce)
    answer = recv_exact(sock, 32)
    if not hmac.compare_digest(answer, _digest(secret, client_nonce, b"driver")):
        raise ProtocolError("driver did not prove it knows the run's secret")
