"""``sparkddl.run``: run a function on N ranks of one Spark barrier stage."""
from __future__ import annotations

import logging
import uuid
from typing import Any, Callable

from sparkddl.channel.server import DriverChannel
from sparkddl.config import optional_positive_int, positive_seconds
from sparkddl.launch import preflight
from sparkddl.launch.pickling import serialize_call
from sparkddl.launch.stage import run_stage
from sparkddl.task.spec import TaskSpec

log = logging.getLogger(__name__)

DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def spark_session(spark: Any = None) -> Any:
    """The given session, the active one, or a new default one."""
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def spec_factory(sc: Any, run_id: str, payload: bytes, num_workers: int, *,
                 use_gpu: bool = False, timeout_s: float | None = None,
                 torch_threads: int | None = None, attempt: int = 0
                 ) -> Callable[[DriverChannel], TaskSpec]:
    """What every barrier stage launcher passes to ``run_stage``: the task spec, completed
    with the channel's address and secret once the channel is open."""
    def make_spec(channel: DriverChannel) -> TaskSpec:
        return TaskSpec(run_id=run_id, payload=payload, num_workers=num_workers,
                        channel_host=channel.host, channel_port=channel.port,
                        secret=channel.secret, use_gpu=use_gpu,
                        collective_timeout_s=timeout_s or DEFAULT_COLLECTIVE_TIMEOUT_S,
                        torch_threads=torch_threads, attempt=attempt,
                        echo_output=not preflight.is_local_master(sc.master))
    return make_spec


def run(fn: Callable[..., Any], *args: Any, num_workers: int | None = None, use_gpu: bool = False,
        timeout: float | None = None, spark: Any = None, torch_threads: int | None = None,
        **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` ranks and return rank 0's return value.

    Each rank runs inside its own task of one Spark barrier stage, with the environment a
    torchrun script expects (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), so ``torch.distributed.init_process_group()``
    works unmodified; :func:`sparkddl.init_process_group` does it for you (gloo on CPU, NCCL
    on GPU). Rank output is streamed to the driver prefixed with the rank.

    Args:
        num_workers: ranks to start; defaults to every task slot of the cluster.
        use_gpu: give each rank the GPU(s) Spark assigned to its task.
        timeout: wall-clock limit in seconds for the whole run (None: no limit); also the
            collective timeout of the process group the helper creates.
        spark: the SparkSession to use (default: the active one).
        torch_threads: intra-op threads per rank (default: spark.task.cpus).

    Raises:
        ConfigError / ClusterError before anything starts; TrainingFailedError, naming the
        failing rank(s) with their tracebacks, as soon as a rank fails or time runs out.
    """
    sc = spark_session(spark).sparkContext
    if num_workers is None:
        num_workers = preflight.available_workers(sc)
    preflight.check_num_workers(num_workers)
    positive_seconds("timeout", timeout)
    optional_positive_int("torch_threads", torch_threads)
    preflight.check_cluster(sc, num_workers, use_gpu)
    payload = serialize_call(fn, args, kwargs)
    run_id = new_run_id()
    make_spec = spec_factory(sc, run_id, payload, num_workers, use_gpu=use_gpu,
                             timeout_s=timeout, torch_threads=torch_threads)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    log.info("run %s: starting %s on %d rank(s)", run_id, name, num_workers)
    results = run_stage(sc, make_spec, timeout_s=timeout,
                        description=f"sparkddl.run({name}) x{num_workers}")
    from pyspark import cloudpickle
    return cloudpickle.loads(results[0]) if results else None
