"""The one object that crosses from the driver to the barrier tasks."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    """Everything a rank needs; picklable, holds no Spark objects.

    ``payload`` is the cloudpickled ``(fn, args, kwargs)`` the rank runs. ``secret`` lets the
    rank authenticate to the driver channel; it is never logged.
    """

    run_id: str
    payload: bytes
    num_workers: int
    channel_host: str
    channel_port: int
    secret: str
    use_gpu: bool = False
    collective_timeout_s: float = 1800.0
    torch_threads: int | None = None
    attempt: int = 0
    echo_output: bool = True
    heartbeat_s: float = 1.0
    # the executors cannot reach the driver: messages travel back in the stage's rows
    offline: bool = False
    # modules the rank imports on a thread of its own while it waits in the rendezvous (a
    # first fit's Petastorm costs ~2 s), so that they are loaded by the first batch
    warm_imports: tuple[str, ...] = ()
    # pyspark TorchDistributor's environment: every task a one-process torchrun "node"
    # (LOCAL_RANK 0, LOCAL_WORLD_SIZE 1, GROUP_RANK = NODE_RANK = RANK); the host-local
    # values stay under SPARKDDL_LOCAL_RANK, SPARKDDL_LOCAL_WORLD_SIZE, SPARKDDL_NODE_RANK
    node_per_rank: bool = False

    def __repr__(self) -> str:  # keep the secret and the payload out of logs
        return (f"TaskSpec(run_id={self.run_id!r}, num_workers={self.num_workers}, "
                f"channel={self.channel_host}:{self.channel_port}, use_gpu={self.use_gpu}, "
                f"attempt={self.attempt})")
