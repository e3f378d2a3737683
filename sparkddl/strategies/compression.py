"""Gradient codecs: how one flat bucket of gradients is averaged over all ranks.

A codec's ``exchange`` starts the transfer and returns a future of the averaged bucket, so it
serves both as a DDP communication hook (overlap) and after the backward pass (no overlap).
Every collective is issued on the calling thread, in bucket order; the futures' callbacks
only decode. Issuing a collective from a callback would race the next bucket's hook and
could pair different collectives across ranks.

Codecs that drop information keep what they did not send (error feedback) and add it to the
next step's gradient. The residual is kept per parameter index, not per bucket, so it stays
valid when DDP rebuilds its buckets after the first step and when a run resumes from a
checkpoint with a fresh bucket layout.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkddl.strategies.comm import CommStats, tensor_bytes
from sparkddl.strategies.kernels import (
    _column_bytes,
    pack_bits,
    sign_and_mean_magnitude,
    signed_mean,
    subtract_signed,
    top_k_indices,
)
from sparkddl.strategies.tensors import allreduce_mean

if TYPE_CHECKING:
    import torch
    from torch.futures import Future

SCALE_BYTES = 4  # one float32 scale per bucket, sent as raw bytes next to the sign bits


class Codec:
    """Averages one flat gradient bucket over all ranks: exactly (this class) or lossily."""

    def __init__(self, comm: CommStats):
        self.comm = comm

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        """Start averaging ``flat`` (the gradients of parameters ``keys`` with ``shapes``,
        back to back); the future yields the averaged bucket (``flat`` itself, overwritten)."""
        return allreduce_mean(flat, self.comm)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Cast(Codec):
    """Sends the bucket in a 16-bit float type: half the bytes, the same averaging."""

    def __init__(self, comm: CommStats, dtype: "torch.dtype"):
        super().__init__(comm)
        self.dtype = dtype

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        import torch.distributed as dist

        low = flat.div(dist.get_world_size()).to(self.dtype)  # scaled first: no fp16 overflow
        self.comm.add(tensor_bytes(low))
        fut = dist.all_reduce(low, async_op=True).get_future()  # pyright: ignore[reportOptionalMemberAccess] - async_op: a Work
        return fut.then(lambda _: flat.copy_(low))


class ErrorFeedback(Codec):
    """A lossy codec's memory: per parameter, the part of its gradient not yet sent."""

    def __init__(self, comm: CommStats):
        super().__init__(comm)
        self.residual: dict[int, "torch.Tensor"] = {}
        # reused per bucket: a fresh bucket-sized tensor every step costs its page faults
        # (torch.abs into a new 19 MB tensor took 10 ms here, into a reused one 2.4 ms)
        self.buffers: dict[Any, "torch.Tensor"] = {}

    def buffer(self, name: str, keys: list[int], like: "torch.Tensor",
               dtype: Any = None) -> "torch.Tensor":
        """A tensor shaped like ``like`` (of ``dtype``), kept for this bucket and ``name``.
        A new bucket layout (DDP rebuilds its buckets after the first step) frees the buffers
        of the buckets it replaces; residuals still viewing them keep them alive until read."""
        import torch

        key = (name, tuple(keys))
        dtype = dtype or like.dtype
        buf = self.buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != dtype \
                or buf.device != like.device:
            mine = set(keys)
            for old in [k for k in self.buffers if k[1] != key[1] and mine.intersection(k[1])]:
                del self.buffers[old]
            buf = self.buffers[key] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return buf

    def add_residual(self, flat: "torch.Tensor", keys: list[int],
                     shapes: list["torch.Size"]) -> None:
        for key, part in zip(keys, flat.split([s.numel() for s in shapes])):
            if key in self.residual:
                part.add_(self.residual[key].to(part.device))

    def corrected(self, flat: "torch.Tensor", keys: list[int],
                  shapes: list["torch.Size"]) -> "torch.Tensor":
        """``flat`` plus what earlier steps did not send, in this bucket's residual buffer,
        which the codec then turns into the new residual in place; ``flat`` is left for the
        decoded mean. From the second step on the residual already lies in that buffer
        (:meth:`keep_residual` keeps views of it): one add. After a new bucket layout or a
        checkpoint's residual, it is gathered from wherever it lies."""
        acc = self.buffer("residual", keys, flat)
        sizes = [s.numel() for s in shapes]
        if self._in_place(acc, keys, sizes):
            return acc.add_(flat)
        # parts viewing this buffer would be overwritten by the copy: read them first
        kept = {key: self.residual[key].to(flat.device, copy=True) for key in keys
                if key in self.residual}
        acc.copy_(flat)
        for key, part in zip(keys, acc.split(sizes)):
            if key in kept:
                part.add_(kept[key])
        return acc

    def _in_place(self, acc: "torch.Tensor", keys: list[int], sizes: list[int]) -> bool:
        """Whether each of ``keys``' residual is the part of ``acc`` it would fill."""
        address = acc.data_ptr()
        for key, size in zip(keys, sizes):
            if not size:  # an empty tensor's view has no address to compare
                continue
            kept = self.residual.get(key)
            if kept is None or kept.device != acc.device or kept.data_ptr() != address \
                    or kept.numel() != size:
                return False
            address += size * acc.element_size()
        return True

    def keep_residual(self, residual: "torch.Tensor", keys: list[int],
                      shapes: list["torch.Size"]) -> None:
        for key, part in zip(keys, residual.split([s.numel() for s in shapes])):
            self.residual[key] = part

    def state_dict(self) -> dict[str, Any]:
        return {"residual": cpu_copies(self.residual)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residual = dict(state["residual"])


class TopK(ErrorFeedback):
    """Sends the ``ratio`` largest-magnitude entries of each bucket as (value, index) pairs.

    Ranks choose different entries, so the pairs are all-gathered and summed; the payload
    is values and int32 indices packed into one byte tensor: one collective per bucket.
    """

    def __init__(self, comm: CommStats, ratio: float):
        super().__init__(comm)
        self.ratio = ratio

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        acc = self.corrected(flat, keys, shapes)
        k = max(1, int(flat.numel() * self.ratio))
        index = top_k_indices(acc, k, self.buffer("above", keys, flat, torch.bool))
        values = acc.index_select(0, index).div_(world)  # the mean's division, on k entries
        acc.index_fill_(0, index, 0)  # what was not sent: the new residual, in place
        self.keep_residual(acc, keys, shapes)
        index_dtype = torch.int32 if flat.numel() < 2 ** 31 else torch.int64
        payload = torch.cat([values.view(torch.uint8), index.to(index_dtype).view(torch.uint8)])
        value_bytes = k * flat.element_size()

        def decode(rows: "torch.Tensor") -> "torch.Tensor":
            values = _column_bytes(rows, 0, value_bytes).view(flat.dtype)
            indices = _column_bytes(rows, value_bytes, None).view(index_dtype).long()
            flat.zero_()
            # rank by rank: indices are unique within a row, so even CUDA's atomic index_add_
            # sums in the same order on every replica and the replicas stay bit-identical
            for rank_values, rank_indices in zip(values, indices):
                flat.index_add_(0, rank_indices, rank_values)
            return flat

        return _all_gather_then(payload, decode, self.comm)


class Sign(ErrorFeedback):
    """1-bit compression: the sign of every entry (8 to a byte) and one scale per bucket.

    The scale is the mean magnitude, so the message keeps the bucket's L1 norm; what the
    signs lose goes into the residual (error feedback, as in 1-bit SGD and EF-SignSGD).
    A set bit is a negative entry (its sign bit: -0.0 counts as negative, as in copysign).
    """

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        import torch

        acc = self.corrected(flat, keys, shapes)
        negative = self.buffer("negative", keys, flat, torch.bool)
        scale = sign_and_mean_magnitude(acc, negative)
        subtract_signed(acc, scale)  # what the bits do not carry: acc - (±scale), in place
        self.keep_residual(acc, keys, shapes)
        # the scale first: at offset 0 of its row, where a float32 view of it may start
        payload = torch.cat([scale.reshape(1).view(torch.uint8), pack_bits(negative)])

        def decode(rows: "torch.Tensor") -> "torch.Tensor":
            scales = _column_bytes(rows, 0, SCALE_BYTES).view(torch.float32).reshape(-1)
            return signed_mean(rows[:, SCALE_BYTES:], scales, flat)

        return _all_gather_then(payload, decode, self.comm)


def _all_gather_then(payload: "torch.Tensor", decode: Any, comm: CommStats) -> "Future":
    """All-gather ``payload`` (same size on every rank); the future yields ``decode(rows)``
    with one row per rank."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    gathered = torch.empty(world * payload.numel(), dtype=payload.dtype, device=payload.device)
    comm.add(tensor_bytes(payload))
    fut = dist.all_gather_into_tensor(gathered, payload, async_op=True).get_future()  # pyright: ignore[reportOptionalMemberAccess] - async_op: a Work
    return fut.then(lambda _: decode(gathered.view(world, -1)))


def cpu_copies(tensors: dict[int, "torch.Tensor"]) -> dict[int, "torch.Tensor"]:
    return {key: t.detach().cpu().clone() for key, t in tensors.items()}
