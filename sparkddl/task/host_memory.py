"""Gradient averaging through shared memory, for ranks that all run on one host (CPU).

Over gloo, two ranks on one host average a 330 KB gradient bucket in 1.7-2.0 ms (loopback
TCP, several round trips), as long as the forward and backward pass of a small model
together. Here each rank writes its bucket (already divided by the world size, as DDP does)
into its own slot of one shared-memory file, tells every peer with one byte on a Unix socket,
waits for theirs, and adds the slots up in rank order: about 0.1 ms for the same bucket, and
every rank gets the same bits, because every rank adds the same numbers in the same order.

The bytes on the sockets are the only synchronization: a write on a socket and the peer's
read of it order the slot's contents (the kernel's locks make the write visible), on any CPU
architecture. Slots are double-buffered: a rank writes step ``k + 2``'s slot only after every
peer has said it reached step ``k + 1``, which each says only after it finished reading step
``k``'s slots. A peer that ends (its task failed, its worker was killed) closes its sockets,
so the ranks waiting for it fail at once with its rank named; a peer that hangs is waited for
up to the collective timeout.

A group forms only when every rank agrees (through the run's store): every rank on one host,
``/dev/shm`` there with room for the slots, and the sockets connected. Otherwise every rank
keeps the process group (gloo), and the fit runs as it did. The shared file is unlinked as
soon as every rank has mapped it, so nothing is left behind on any path.
"""
from __future__ import annotations

import logging
import mmap
import os
import socket
import sys
import uuid
from typing import TYPE_CHECKING, Any

from sparkddl.errors import SparkDDLError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SLOT_BYTES = 2 << 20  # per rank and half: a larger bucket goes through in pieces
_open: list["HostGroup"] = []  # closed when the rank's task ends (close_all)


class HostMemoryError(SparkDDLError, RuntimeError):
    """A peer left, or fell out of step, while ranks averaged through shared memory."""


def usable_here(world_size: int, local_world_size: int) -> bool:
    """Whether a group may form: the same answer on every rank of a world on one host."""
    return (world_size > 1 and local_world_size == world_size and sys.platform == "linux"
            and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK))


class HostGroup:
    """The ranks of one world on one host, averaging flat buckets through shared memory."""

    def __init__(self, rank: int, world: int, memory: mmap.mmap, slot_bytes: int,
                 peers: dict[int, socket.socket]):
        import torch

        self.rank, self.world, self.slot_bytes = rank, world, slot_bytes
        self.memory = memory
        self.raw = torch.frombuffer(memory, dtype=torch.uint8)
        self.peers = dict(sorted(peers.items()))
        self.ops = 0
        self.closed = False
        self._views: dict[tuple[int, Any], list["torch.Tensor"]] = {}

    @classmethod
    def open(cls, store: Any, rank: int, world: int, timeout_s: float, largest_bytes: int,
             tag: str) -> "HostGroup | None":
        """Every rank of the world calls this at the same point; each gets a group, or each
        gets None (and a log line says why). ``largest_bytes``: the largest bucket, which
        sizes the slots (up to SLOT_BYTES); ``tag`` names the run and attempt in the file's
        name."""
        # the groups this rank opened with this store (one per world): every rank counts
        # alike, whatever its Python worker served before
        n = store.add(f"sparkddl/host_memory/opened/{rank}", 1)
        key = f"sparkddl/host_memory/{n}"
        slot = max(4096, min(SLOT_BYTES, -(-largest_bytes // 4096) * 4096))
        size = 2 * world * slot
        path = ""
        memory: mmap.mmap | None = None
        listener: socket.socket | None = None
        peers: dict[int, socket.socket] = {}
        name = ""
        try:
            if rank == 0:
                path = os.path.join(SHM_DIR, f"sparkddl-{tag}-{uuid.uuid4().hex[:12]}")
                memory, why = _create(path, size)
                store.set(f"{key}/path", path if memory is not None else "")
            else:
                path = _text(store.get(f"{key}/path"))
                memory, why = _attach(path, size) if path else (None, "rank 0 could not")
            if memory is not None:
                name = "\0" + os.path.basename(path) if path else ""
                listener, why = _listen(f"{name}-{rank}", world)
            if not _agree(store, f"{key}/mapped", rank, world, memory is not None
                          and listener is not None, why):
                return None
            if rank == 0:
                _unlink(path)  # every rank has it mapped: the memory lives until they unmap
            why = ""
            try:
                for peer in range(rank):
                    peers[peer] = _connect(f"{name}-{peer}", rank, timeout_s)
            except OSError as exc:
                why = f"rank {rank} could not connect to a peer's socket ({exc})"
            if not _agree(store, f"{key}/linked", rank, world, not why, why):
                return None
            assert listener is not None
            listener.settimeout(timeout_s)
            for _ in range(world - rank - 1):
                conn, _ = listener.accept()
                conn.settimeout(timeout_s)
                peer = int.from_bytes(_recv_exactly(conn, 4), "little")
                peers[peer] = conn
            assert memory is not None
            group = cls(rank, world, memory, slot, peers)
            if rank == 0:
                log.info("gradients averaged through shared memory: %d ranks on this host, "
                         "slots of %d KiB", world, slot >> 10)
            peers = {}
            memory = None
            _open.append(group)
            return group
        finally:
            if rank == 0 and path:
                _unlink(path)
            if listener is not None:
                listener.close()
            for conn in peers.values():
                conn.close()
            if memory is not None:
                memory.close()

    def _slots(self, half: int, dtype: Any) -> list["torch.Tensor"]:
        views = self._views.get((half, dtype))
        if views is None:
            base = half * self.world * self.slot_bytes
            views = self._views[(half, dtype)] = [
                self.raw[base + r * self.slot_bytes:base + (r + 1) * self.slot_bytes].view(dtype)
                for r in range(self.world)]
        return views

    def average_(self, flat: "torch.Tensor") -> "torch.Tensor":
        """Replace ``flat`` (1-D, contiguous, on the CPU) by its mean over the ranks."""
        import torch

        if self.closed:
            raise HostMemoryError(f"rank {self.rank}: the shared-memory group is closed")
        per = self.slot_bytes // flat.element_size()
        for start in range(0, flat.numel(), per):
            part = flat[start:start + per]
            n = part.numel()
            slots = self._slots(self.ops & 1, flat.dtype)
            torch.div(part, self.world, out=slots[self.rank][:n])
            self._meet()
            torch.add(slots[0][:n], slots[1][:n], out=part)
            for other in slots[2:]:
                part.add_(other[:n])
            self.ops += 1
        return flat

    def _meet(self) -> None:
        """Tell every peer this rank's slot is written, and wait until each has said so."""
        mark = bytes((self.ops & 0xFF,))
        for peer, conn in self.peers.items():
            try:
                conn.sendall(mark)
            except OSError as exc:
                raise self._lost(peer, f"its connection closed ({exc.strerror or exc})") from exc
        for peer, conn in self.peers.items():
            try:
                got = conn.recv(1)
            except TimeoutError:
                raise HostMemoryError(
                    f"rank {self.rank} waited {conn.gettimeout():.0f} s for rank {peer} in the "
                    f"gradient average (shared memory); rank {peer} is stuck or far behind"
                ) from None
            except OSError as exc:
                raise self._lost(peer, f"its connection closed ({exc.strerror or exc})") from exc
            if not got:
                raise self._lost(peer, "its connection closed")
            if got != mark:
                raise HostMemoryError(
                    f"rank {self.rank} and rank {peer} are out of step in the gradient average "
                    f"(shared memory: average {got[0]} against {mark[0]}, counted mod 256); "
                    "every rank must run the same number of optimizer steps")

    def _lost(self, peer: int, how: str) -> HostMemoryError:
        # the sockets stay open until the task ends (close_all): a peer still waiting
        # finds the rank that left itself, not this one
        return HostMemoryError(
            f"rank {peer} left the gradient average while rank {self.rank} waited for it: "
            f"{how}; rank {peer}'s own error says why")

    def close(self) -> None:
        """Close the sockets (peers waiting on this rank fail at once); the memory goes with
        the last tensor viewing it."""
        if self.closed:
            return
        self.closed = True
        for conn in self.peers.values():
            conn.close()
        self._views.clear()
        if self in _open:
            _open.remove(self)


def close_all() -> None:
    """Close every group this process still has open (a rank's task has ended)."""
    for group in list(_open):
        group.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _create(path: str, size: int) -> tuple[mmap.mmap | None, str]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return None, f"could not create {path} ({exc})"
    try:
        # reserved now, not on first write: a full /dev/shm (64 MiB in a default Docker
        # container) is a clear fallback here rather than a SIGBUS in the middle of a step
        os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size), ""
    except OSError as exc:
        return None, f"no room for {size >> 20} MiB in {SHM_DIR} ({exc})"
    finally:
        os.close(fd)


def _attach(path: str, size: int) -> tuple[mmap.mmap | None, str]:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        return None, f"could not open {path} ({exc})"
    try:
        if os.fstat(fd).st_size != size:
            return None, f"{path} is not the size rank 0 made it"
        return mmap.mmap(fd, size), ""
    except OSError as exc:
        return None, f"could not map {path} ({exc})"
    finally:
        os.close(fd)


def _listen(name: str, world: int) -> tuple[socket.socket | None, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)  # the abstract namespace: no file, gone with the socket
        sock.listen(world)
        return sock, ""
    except OSError as exc:
        sock.close()
        return None, f"could not open a Unix socket ({exc})"


def _connect(name: str, rank: int, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(name)
        sock.sendall(rank.to_bytes(4, "little"))
        return sock
    except OSError:
        sock.close()
        raise


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise OSError("the peer closed its socket while joining")
        data += got
    return data


def _agree(store: Any, key: str, rank: int, world: int, ok: bool, why: str) -> bool:
    """Every rank says whether it is ready; all go on only if all are (else each logs the
    first reason it knows and falls back to the process group)."""
    store.set(f"{key}/{rank}", "" if ok else (why or "not ready"))
    reasons = [_text(store.get(f"{key}/{r}")) for r in range(world)]
    refused = [f"rank {r}: {text}" for r, text in enumerate(reasons) if text]
    if refused:
        if rank == 0:
            log.info("gradients averaged through the process group, not shared memory: %s",
                     refused[0])
        return False
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
