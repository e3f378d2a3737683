"""``sparkddl.run``: run a function on N ranks of one Spark barrier stage."""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from sparkddl.channel import messages
from sparkddl.config import optional_positive_int, positive_seconds
from sparkddl.errors import ConfigError
from sparkddl.launch import preflight
from sparkddl.launch.launcher import launch_ranks, new_run_id
from sparkddl.launch.phases import Arrivals, Phases
from sparkddl.session import cluster_context
from sparkddl.task.frameworks import warn_unsynced
from sparkddl.task.script import Script, script

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def spark_session(spark: Any = None) -> Any:
    """The given session, the active one, or a new default one."""
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def run(fn: Callable[..., Any] | str | os.PathLike, *args: Any, num_workers: int | None = None,
        use_gpu: bool = False, timeout: float | None = None, spark: SparkSession | None = None,
        torch_threads: int | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` ranks and return rank 0's return value.

    ``fn`` may also be the path of a Python file: it runs as ``__main__`` on every rank with
    ``sys.argv = [path, *args]`` (strings, as with torchrun), and the run returns None; a
    non-zero exit status fails it like an exception.

    Each rank runs inside its own task of one Spark barrier stage, with the environment a
    torchrun script expects (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), so ``torch.distributed.init_process_group()``
    works unmodified; ``sparkddl.init_process_group()`` does it for you (gloo on CPU, NCCL
    on GPU). Rank output is streamed to the driver prefixed with the rank.

    Args:
        fn: the function (pickled to the executors with its closure), or a script's path.
        *args: positional arguments of ``fn`` (a script's command line).
        num_workers: ranks to start; defaults to every task slot of the cluster.
        use_gpu: give each rank the GPU(s) Spark assigned to its task.
        timeout: wall-clock limit in seconds for the whole run (None: no limit); also the
            collective timeout of the process group the helper creates.
        spark: the SparkSession to use (default: the active one).
        torch_threads: intra-op threads per rank (default: spark.task.cpus).
        **kwargs: keyword arguments of ``fn`` (not for a script).

    Returns:
        Rank 0's return value (None for a script).

    Raises:
        ConfigError: a bad argument, before anything starts.
        ClusterError: the cluster cannot run the barrier stage (too few slots, GPUs, the
            executors' Python), before anything starts.
        TrainingFailedError: a rank failed or time ran out; it names the failing rank(s)
            with their tracebacks.
        JobCancelledError: the run's Spark job was cancelled, or the driver interrupted.
    """
    return launch(fn, args, kwargs, num_workers=num_workers, use_gpu=use_gpu, timeout=timeout,
                  spark=spark, torch_threads=torch_threads)


def launch(fn: Callable[..., Any] | str | os.PathLike, args: tuple, kwargs: dict[str, Any], *,
           num_workers: int | None, use_gpu: bool = False, timeout: float | None = None,
           spark: Any = None, torch_threads: int | None = None, node_per_rank: bool = False,
           caller: str = "sparkddl.run", workers_name: str = "num_workers") -> Any:
    """:func:`run` with the function's arguments apart from the run's own (so that a
    function may take keywords named like them: TorchDistributor passes every keyword on);
    ``caller`` and ``workers_name`` are the API's own words in messages."""
    if isinstance(fn, (str, os.PathLike)):
        if kwargs:
            raise ConfigError(f"a script takes command-line arguments only, not keyword "
                              f"arguments ({', '.join(kwargs)})")
        fn, args = script(fn, args), ()
    phases = Phases()
    sc = cluster_context(spark_session(spark))
    if num_workers is None:
        num_workers = preflight.available_workers(
            sc, profile=preflight.stage_profile(sc, use_gpu))
    preflight.check_num_workers(num_workers, workers_name)
    positive_seconds("timeout", timeout)
    optional_positive_int("torch_threads", torch_threads)
    # one check task per rank: the ranks get Python workers with torch imported
    preflight.start_cluster_checks(sc, num_workers, use_gpu)()
    run_id = new_run_id()
    name = (os.path.basename(fn.path) if isinstance(fn, Script)
            else getattr(fn, "__qualname__", type(fn).__name__))
    log.info("run %s: starting %s on %d rank(s)", run_id, name, num_workers)
    groups: dict[int, int] = {}  # rank -> the largest process group it formed
    arrivals = Arrivals(num_workers, phases.now)  # when each rank's task was up
    phases.end("checks")
    try:
        value = launch_ranks(sc, fn, args, kwargs, num_workers=num_workers, run_id=run_id,
                             use_gpu=use_gpu, timeout_s=timeout, torch_threads=torch_threads,
                             description=f"{caller}({name}) x{num_workers}",
                             node_per_rank=node_per_rank,
                             handlers={messages.Done: lambda msg, body: groups.update(
                                 {msg.rank: body.group}), messages.Hello: arrivals})
    finally:
        # launch: until every rank's task has started; running: the function, to the end
        phases.end("launch", arrivals.all_up_at)
        phases.end("running")
        log.info("run %s in %s", run_id, phases.line())
    warn_unsynced(num_workers, list(groups.values()), caller)
    return value

