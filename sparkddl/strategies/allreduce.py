"""Synchronous data parallelism: gradients averaged by allreduce every step (DDP)."""
from __future__ import annotations

from typing import Any

from sparkddl.strategies.base import Strategy, tensor_bytes


class AllReduce(Strategy):
    """DDP with gradient buckets allreduced while the backward pass is still running."""

    name = "allreduce"
    OPTIONS = {"bucket_cap_mb": 25}

    def wrap(self, module: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(module, bucket_cap_mb=self.options["bucket_cap_mb"])
        ddp.register_comm_hook(self, _counting_allreduce_hook)
        return ddp


def _counting_allreduce_hook(strategy, bucket):  # DDP checks these annotations: leave them off
    """DDP's default hook (average by allreduce), counting the payload."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    strategy.comm.add(tensor_bytes(buffer))
    buffer.div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
