"""``HorovodRunner`` (Databricks' ``sparkdl.HorovodRunner``) on sparkddl's launch path, and
``sparkddl.horovod.torch``, Horovod's torch API over torch.distributed: notebooks written
for HorovodRunner run after two import changes, without Horovod installed.

``HorovodRunner(np).run(main, **kwargs)`` runs ``main(**kwargs)`` on ``np`` ranks of one
Spark barrier stage (``np > 0``) or on ``-np`` processes on the driver (``np < 0``, local
mode, as TorchDistributor's ``local_mode=True``) and returns rank 0's return value. Ranks use
GPUs when the cluster gives tasks GPUs (``spark.executor.resource.gpu.amount`` or, on a local
master, ``spark.task.resource.gpu.amount``) or, in local mode, when torch sees a GPU on the
driver: one GPU per rank. Rank output always reaches the driver prefixed with the rank, so
``driver_log_verbosity`` is checked and otherwise unused. Not supported: Horovod's MPI
launcher options, ``np=0``.
"""
from __future__ import annotations

from typing import Any, Callable

from sparkddl.errors import ConfigError

VERBOSITIES = ("all", "log_callback_only")


class HorovodRunner:
    """Run a Horovod training function on Spark: ``HorovodRunner(np=2).run(train, lr=0.1)``.

    Args:
        np: ranks on the cluster (``np > 0``), or minus the processes on the driver
            (``np < 0``, local mode).
        driver_log_verbosity: ``all`` or ``log_callback_only``; checked, otherwise unused
            (rank output always reaches the driver prefixed with the rank).

    Raises:
        ConfigError: ``np`` is 0 or not an integer, or an unknown verbosity.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "all"):  # its name
        if isinstance(np, bool) or not isinstance(np, int):
            raise ConfigError(f"np must be an integer (ranks on the cluster, or minus the "
                              f"processes on the driver), got {np!r}")
        if np == 0:
            raise ConfigError("np=0 asks for no processes; pass np > 0 for that many ranks "
                              "on the cluster or np < 0 for -np processes on the driver "
                              "(local mode)")
        if driver_log_verbosity not in VERBOSITIES:
            raise ConfigError(f"driver_log_verbosity must be one of {', '.join(VERBOSITIES)}, "
                              f"got {driver_log_verbosity!r}")
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank and return rank 0's return value; a rank's
        failure raises TrainingFailedError naming it, with its traceback."""
        if not callable(main):
            raise ConfigError(f"main must be a function, got {type(main).__name__}")
        if self.num_processor < 0:
            import torch

            from sparkddl.launch.local import run_local
            return run_local(main, (), kwargs, -self.num_processor, torch.cuda.is_available(),
                             caller="HorovodRunner.run")
        from sparkddl.launch.preflight import asks_for_gpus
        from sparkddl.launch.runner import launch, spark_session
        from sparkddl.session import cluster_context

        spark = spark_session()
        return launch(main, (), kwargs, num_workers=self.num_processor,
                      use_gpu=asks_for_gpus(cluster_context(spark)), spark=spark,
                      caller="HorovodRunner.run", workers_name="np", node_per_rank=False)
