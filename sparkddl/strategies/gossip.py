"""Gossip: decentralized averaging with graph neighbours, no global collective per step.

D-PSGD (Lian et al., 2017): at every step, rank r sends its model to ranks r + o and
receives from ranks r - o (mod world) for every offset o of the topology, by point-to-point
isend/irecv, replaces its model by the uniform mean of its own and the received ones, and
then applies its own gradient (computed at its pre-mixing model) with the optimizer. Every
rank has as many senders as receivers, so the mixing matrix is doubly stochastic: the mean
over ranks evolves like SGD on the averaged gradient while replicas only approximately
agree (with two ranks, mixing is exact averaging and replicas differ by the last local step).

- ``ring``: offsets +1 and -1 (two neighbours; one when there are only two ranks).
- ``exponential``: offsets 1, 2, 4, ... < world (log2(world) peers, a short diameter).

``consensus_distance`` in ``end_epoch``: the mean over ranks of each replica's squared
distance from the replicas' mean. Measuring it takes one model-sized allreduce plus one
scalar allreduce per epoch; that traffic is not part of the algorithm, so it is reported
separately as ``control_bytes`` and not in ``comm_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.comm import CommStats, tensor_bytes
from sparkddl.strategies.tensors import (
    DEFAULT_BUCKET_BYTES,
    average_,
    broadcast_module,
    bucketize,
    flatten,
    mean_over_ranks,
    model_state,
    squared_distance,
    unflatten_into,
)
from sparkddl.task.context import collective

TOPOLOGIES = ("ring", "exponential")


def peer_offsets(topology: str, world: int) -> list[int]:
    """Distinct non-zero offsets (mod ``world``) a rank sends to (+o) and receives from (-o)."""
    if topology == "ring":
        raw = [1, -1]
    else:
        raw = [1 << i for i in range(world.bit_length()) if 1 << i < world]
    return sorted({o % world for o in raw} - {0})


class Gossip(Strategy):
    name = "gossip"
    replicas_differ = True
    @dataclass(frozen=True)
    class Options:
        topology: str = option("ring", "peers each rank averages with: ring or exponential")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.control = CommStats()  # measuring consensus: reported apart from comm_bytes
        self.state: list[Any] = []
        self.buckets: list[list[int]] = []
        self.offsets: list[int] = []

    def check_options(self) -> None:
        self.check_choice("topology", TOPOLOGIES)

    def wrap(self, module: Any) -> Any:
        import torch.distributed as dist

        broadcast_module(module)
        self.state = model_state(module)
        self.buckets = bucketize(self.state, DEFAULT_BUCKET_BYTES)
        self.offsets = peer_offsets(self.options["topology"], dist.get_world_size())
        return module

    def step(self, optimizer: Any) -> None:
        if self.offsets:
            self._mix()
        optimizer.step()

    def _mix(self) -> None:
        """Average with the neighbours; every bucket's transfers start before any is awaited."""
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        pending = []
        with torch.no_grad(), collective("the exchange with gossip neighbours"):
            for tag, bucket in enumerate(self.buckets):
                members = [self.state[i] for i in bucket]
                mine = flatten(members)
                inbox = [torch.empty_like(mine) for _ in self.offsets]
                ops = [dist.P2POp(dist.isend, mine, (rank + o) % world, tag=tag)
                       for o in self.offsets]
                ops += [dist.P2POp(dist.irecv, box, (rank - o) % world, tag=tag)
                        for o, box in zip(self.offsets, inbox)]
                self.comm.add(tensor_bytes(mine) * len(self.offsets), calls=len(self.offsets))
                pending.append((members, mine, inbox, dist.batch_isend_irecv(ops)))
            for members, mine, inbox, works in pending:
                for work in works:
                    work.wait()
                mixed = torch.stack([mine, *inbox]).mean(0)
                unflatten_into(mixed, members)

    def consensus_distance(self) -> float:
        """Mean over ranks of the squared distance of each replica from the replicas' mean."""
        mean = [t.detach().clone() for t in self.state]
        average_(mean, self.control, what="measuring the consensus distance")
        return mean_over_ranks(squared_distance(self.state, mean), self.control,
                               "measuring the consensus distance")

    def end_epoch(self) -> dict[str, Any]:
        distance = self.consensus_distance()
        control = self.control.take()
        return {**self.comm.take(), "consensus_distance": distance,
                "control_bytes": control["comm_bytes"], "control_calls": control["comm_calls"]}

    def finalize(self, module: Any) -> None:
        average_(self.state, self.comm)
