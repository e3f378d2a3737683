"""Tensor plumbing every strategy shares: buckets, flattening, averaging, broadcasting.

Parameters are averaged with :func:`average_` everywhere (local SGD, dynamic averaging,
gossip's final consensus), and gradients with :class:`GradientSync` wherever DDP is not used,
so that no strategy carries its own variant of either.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from sparkddl.strategies.comm import CommStats, tensor_bytes
from sparkddl.task.context import collective

if TYPE_CHECKING:
    import torch
    from torch.futures import Future

    # (flat bucket, parameter keys, parameter shapes) -> future of the averaged flat bucket
    Exchange = Callable[[torch.Tensor, list[int], list[torch.Size]], Future]

DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb
DISTANCE_CHUNK = 1 << 18  # elements per step of squared_distance (2 MiB of float64)


def model_state(module: Any) -> list["torch.Tensor"]:
    """Parameters and floating-point buffers: the tensors replicas must agree on.

    Integer buffers (BatchNorm's step counter) are left out: averaging cannot keep them
    integral, and they advance identically on every rank anyway.
    """
    return [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]


def bucketize(tensors: Sequence["torch.Tensor"], cap_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` in buckets of one dtype and device, each at most ``cap_bytes``
    (a tensor larger than the cap gets a bucket of its own). Order is kept, so every rank
    builds the same buckets from the same model."""
    buckets: list[list[int]] = []
    open_for: dict[tuple[Any, Any], tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        kind = (t.dtype, t.device)
        bucket, size = open_for.get(kind, (None, 0))
        if bucket is None or size + tensor_bytes(t) > cap_bytes:
            bucket, size = [], 0
            buckets.append(bucket)
        bucket.append(i)
        open_for[kind] = (bucket, size + tensor_bytes(t))
    return buckets


def flatten(tensors: Sequence["torch.Tensor"]) -> "torch.Tensor":
    """One new contiguous 1-D tensor holding ``tensors`` back to back."""
    import torch

    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(flat: "torch.Tensor", tensors: Sequence["torch.Tensor"]) -> None:
    """Copy ``flat`` (as made by :func:`flatten`) back into ``tensors``, in place."""
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.detach().copy_(part.view_as(t))


def allreduce_mean(flat: "torch.Tensor", comm: CommStats) -> "Future":
    """Start averaging ``flat`` over all ranks in place; the future yields ``flat``."""
    import torch.distributed as dist

    comm.add(tensor_bytes(flat))
    flat.div_(dist.get_world_size())  # before the sum, as DDP does: no overflow in low precision
    return dist.all_reduce(flat, async_op=True).get_future().then(lambda fut: fut.value()[0])  # pyright: ignore[reportOptionalMemberAccess]


def average_(tensors: Sequence["torch.Tensor"], comm: CommStats,
             cap_bytes: int = DEFAULT_BUCKET_BYTES, what: str = "averaging the model") -> None:
    """Replace every tensor by its mean over all ranks (buckets in flight together)."""
    import torch

    with torch.no_grad(), collective(what):
        pending = []
        for bucket in bucketize(tensors, cap_bytes):
            members = [tensors[i] for i in bucket]
            pending.append((members, allreduce_mean(flatten(members), comm)))
        for members, fut in pending:
            unflatten_into(fut.wait(), members)


def broadcast_(tensors: Sequence["torch.Tensor"], comm: CommStats | None = None,
               src: int = 0, cap_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Overwrite ``tensors`` on every rank with rank ``src``'s values."""
    import torch
    import torch.distributed as dist

    with torch.no_grad(), collective(f"a broadcast from rank {src}"):
        for bucket in bucketize(tensors, cap_bytes):
            members = [tensors[i] for i in bucket]
            flat = flatten(members)
            if comm is not None:
                comm.add(tensor_bytes(flat))
            dist.broadcast(flat, src)
            unflatten_into(flat, members)


def broadcast_module(module: Any) -> None:
    """Make every replica start from rank 0's parameters and buffers (setup, not counted)."""
    broadcast_([*module.parameters(), *module.buffers()])


def mean_over_ranks(value: "torch.Tensor", comm: CommStats, what: str) -> float:
    """The mean over all ranks of a scalar tensor (a drift or distance measure)."""
    import torch.distributed as dist

    comm.add(tensor_bytes(value))
    with collective(what):
        dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def squared_distance(tensors: Sequence["torch.Tensor"],
                     others: Sequence["torch.Tensor"]) -> "torch.Tensor":
    """Sum of squared differences, as a float64 scalar on the tensors' device."""
    import torch

    total = torch.zeros((), dtype=torch.float64, device=tensors[0].device)
    for a, b in zip(tensors, others):
        a, b = a.detach().reshape(-1), b.detach().reshape(-1)
        # in chunks: the float64 difference of a whole large tensor would briefly take
        # several times its size (6x for float32: two casts, the difference, its square)
        for i in range(0, a.numel(), DISTANCE_CHUNK):
            total += (a[i:i + DISTANCE_CHUNK].double()
                      - b[i:i + DISTANCE_CHUNK].double()).pow(2).sum()
    return total


class GradientSync:
    """Averages gradients after the backward pass, bucket by bucket, when DDP is not used.

    ``exchange`` averages one flat bucket over all ranks (plain or compressed); all buckets
    are started before the first is waited for, so their transfers overlap each other (but,
    unlike DDP, not the backward pass).
    """

    def __init__(self, params: Sequence["torch.Tensor"], cap_bytes: int, exchange: "Exchange"):
        self.params = list(params)
        self.exchange = exchange
        # last layers first: the order DDP fills its buckets in
        order = list(reversed(range(len(self.params))))
        self.buckets = [[order[i] for i in b]
                        for b in bucketize([self.params[i] for i in order], cap_bytes)]

    def __call__(self) -> None:
        import torch

        with torch.no_grad(), collective("the gradient exchange"):
            pending = []
            for bucket in self.buckets:
                members = [self.params[i] for i in bucket]
                for p in members:
                    if p.grad is None:  # unused this step: every rank must still send it
                        p.grad = torch.zeros_like(p)
                flat = flatten([p.grad for p in members])  # pyright: ignore[reportArgumentType] - filled above
                pending.append((members, self.exchange(flat, bucket, [p.shape for p in members])))
            for members, fut in pending:
                unflatten_into(fut.wait(), [p.grad for p in members])
