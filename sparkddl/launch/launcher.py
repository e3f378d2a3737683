"""Launch the ranks: the one path from a function and its arguments to rank 0's result, used
by ``sparkddl.run``, ``TorchEstimator.fit`` and ``sparkddl plan``."""
from __future__ import annotations

import uuid
from typing import Any, Callable

from sparkddl.channel.server import DriverChannel
from sparkddl.launch import preflight
from sparkddl.launch.monitor import Handlers
from sparkddl.launch.pickling import serialize_call
from sparkddl.launch.stage import run_stage
from sparkddl.session import cluster_context
from sparkddl.task.spec import TaskSpec

DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def launch_ranks(sc: Any, fn: Callable[..., Any], args: tuple = (),
                 kwargs: dict[str, Any] | None = None, *, num_workers: int, run_id: str,
                 description: str, use_gpu: bool = False, timeout_s: float | None = None,
                 torch_threads: int | None = None, attempt: int = 0,
                 handlers: Handlers | None = None, watchdog_s: float | str | None = None,
                 warm_imports: tuple[str, ...] = (), slot_wait_s: float | None = None,
                 node_per_rank: bool = False) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` ranks of one barrier stage and return
    rank 0's return value (None if it returned nothing). ``timeout_s`` bounds the stage and
    is the collective timeout of the process group; ``handlers`` receive the ranks' messages;
    ``watchdog_s`` fails the stage when a rank stops making progress; ``warm_imports`` are
    imported on the ranks while they wait in the rendezvous; ``slot_wait_s`` bounds the wait
    for the stage's task slots (it is logged either way); ``node_per_rank`` gives the ranks
    pyspark TorchDistributor's environment (each task a torchrun node of one process)."""
    sc = cluster_context(sc)  # a SparkContext is taken as it is
    payload = serialize_call(fn, args, kwargs or {})

    def make_spec(channel: DriverChannel) -> TaskSpec:
        # completed with the channel's address and secret once the channel is open
        return TaskSpec(run_id=run_id, payload=payload, num_workers=num_workers,
                        channel_host=channel.host, channel_port=channel.port,
                        secret=channel.secret, use_gpu=use_gpu,
                        collective_timeout_s=timeout_s or DEFAULT_COLLECTIVE_TIMEOUT_S,
                        torch_threads=torch_threads, attempt=attempt,
                        echo_output=not preflight.is_local_master(sc.master),
                        warm_imports=warm_imports, node_per_rank=node_per_rank)

    results = run_stage(sc, make_spec, timeout_s=timeout_s, handlers=handlers,
                        watchdog_s=watchdog_s, description=description,
                        profile=preflight.stage_profile(sc, use_gpu), slot_wait_s=slot_wait_s)
    from pyspark import cloudpickle
    return cloudpickle.loads(results[0]) if results else None
