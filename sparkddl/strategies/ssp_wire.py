"""The SSP strategy's wire (see :mod:`sparkddl.strategies.ssp`): queues and keys in the run's
TCPStore, push headers, the server's pull notices, and tensors as raw bytes (never pickles).
Payloads over the TCPStore's 8 MiB limit travel as chunk keys with only a notice queued."""
from __future__ import annotations

import struct
from typing import Any, Sequence

from sparkddl.errors import SparkDDLError
from sparkddl.strategies.comm import tensor_bytes

PUSH_QUEUE = "sparkddl/ssp/push"
# rank, clock, kind (PLAIN; FINAL: no update, answer at staleness 0; UNTIMED: the first push
# after wrap or an epoch's end, whose compute time includes that work), chunks of the update;
# a rank of ALARM is the server's own wake-up call (clock: the server's id)
PUSH_HEADER = struct.Struct("<qqqq")
PLAIN, FINAL, UNTIMED = 0, 1, 2
ALARM = -1
# the TCPStore refuses messages over 8 MiB: larger payloads go as keys of this size, with
# only a notice in the queue (several ranks push into one queue, so parts must not queue)
CHUNK_BYTES = 4 << 20


def pull_queue(rank: int) -> str:
    return f"sparkddl/ssp/pull/{rank}"


def put_chunks(store: Any, prefix: str, data: bytes) -> int:
    """Store ``data`` under ``prefix/0..n-1``; return n."""
    n = max(1, -(-len(data) // CHUNK_BYTES))
    for i in range(n):
        store.set(f"{prefix}/{i}", data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])
    return n


def take_chunks(store: Any, prefix: str, n: int) -> bytes:
    """Read and delete what :func:`put_chunks` stored."""
    parts = []
    for i in range(n):
        parts.append(store.get(f"{prefix}/{i}"))
        store.delete_key(f"{prefix}/{i}")
    return b"".join(parts)


def update_key(rank: int, clock: int) -> str:
    return f"sparkddl/ssp/update/{rank}/{clock}"


def answer_key(rank: int) -> str:
    """One answer per rank is outstanding at a time: its pull waits for it."""
    return f"sparkddl/ssp/answer/{rank}"


def encode_pull(clocks: Sequence[int], chunks: int, error: bytes = b"") -> bytes:
    """The server's notice: the clocks and the chunks of the model stored under
    :func:`answer_key`; no clocks means the server failed, with an error text."""
    return struct.pack(f"<q{len(clocks)}qq", len(clocks), *clocks, chunks) + error


def decode_pull(message: bytes, world: int, store: Any, rank: int) -> tuple[list[int], bytes]:
    """(clocks, model bytes) from a notice; raises with the server's error if it failed."""
    (count,) = struct.unpack_from("<q", message)
    if count != world:
        raise SparkDDLError(f"the SSP parameter server on rank 0 failed: "
                            f"{message[16:].decode(errors='replace')}; see rank 0's log")
    *clocks, chunks = struct.unpack_from(f"<{world}qq", message, 8)
    return list(clocks), take_chunks(store, answer_key(rank), chunks)


def pack(tensors: Sequence[Any]) -> bytes:
    """Tensors' raw bytes, back to back (no pickle: safe to read from the network)."""
    import torch

    return b"".join(t.detach().reshape(-1).cpu().view(torch.uint8).numpy().tobytes()
                    for t in tensors)


def unpack(data: bytes, like: Sequence[Any]) -> list[Any]:
    """CPU tensors shaped and typed like ``like`` from :func:`pack`'s bytes."""
    import torch

    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out, offset = [], 0
    for t in like:
        n = tensor_bytes(t)
        out.append(raw[offset:offset + n].clone().view(t.dtype).view(t.shape))
        offset += n
    return out


def store_queue_problem() -> str | None:
    """Why this torch cannot run SSP (its push/pull messages are TCPStore queues), or None.
    torch 2.13 has them; 2.4.1, 2.6.0 and 2.7.0 (tested here) do not."""
    import torch
    from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage]
    if all(hasattr(TCPStore, a) for a in ("queue_push", "queue_pop")):
        return None
    return (f"needs TCPStore.queue_push/queue_pop, which torch {torch.__version__} does not "
            "have (torch 2.13 does)")


def _connection(store: Any) -> Any:
    """A new client connection to ``store``'s server (``TCPStore.clone`` is torch >= 2.5;
    before that, a client to the same host and port)."""
    if hasattr(store, "clone"):
        return store.clone()
    from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage]
    return TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)
