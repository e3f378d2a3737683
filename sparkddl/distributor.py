"""``sparkddl.TorchDistributor``: pyspark's ``TorchDistributor`` API on sparkddl's launch
path, so that migrating is an import change.

``TorchDistributor(num_processes, local_mode, use_gpu).run(fn_or_script, *args)`` returns
rank 0's return value for a function and None for a script, like pyspark's. Distributed
mode (``local_mode=False``) is :func:`sparkddl.run` with ``num_workers=num_processes``: one
barrier task per process, each with its own GPU where ``use_gpu``; failures surface at once
with the rank's traceback. ``local_mode=True`` starts the processes on the driver's host
(:mod:`sparkddl.launch.local`), as pyspark does.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from sparkddl.errors import ClusterError, ConfigError, in_callers_words
from sparkddl.launch import preflight
from sparkddl.launch.local import run_local
from sparkddl.launch.runner import launch, spark_session
from sparkddl.session import cluster_context
from sparkddl.task.script import script

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
SSL_KEY = "pytorch.spark.distributor.ignoreSsl"
# a check's error in TorchDistributor's vocabulary: num_processes, not num_workers
NUM_PROCESSES = {"num_workers": "num_processes"}


class TorchDistributor:
    """Distributed PyTorch training on Spark, with pyspark's constructor and ``run``.

    Args:
        num_processes: processes (ranks) to start.
        local_mode: True: the processes run on the driver's host; False: one barrier task
            per process on the executors.
        use_gpu: give each process a GPU (the driver's in local mode, the one Spark
            assigned to its task otherwise).
        _ssl_conf: the conf key that allows training when ``spark.ssl.enabled`` is true
            (torch.distributed traffic is not encrypted), as pyspark's.
        spark: the SparkSession (default: the active one).

    Raises:
        ConfigError: ``num_processes`` is not a positive integer.
        ClusterError: Spark's SSL is on without the key above, or too few GPUs.
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True,
                 _ssl_conf: str = SSL_KEY, spark: SparkSession | None = None):
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or \
                num_processes < 1:
            raise ConfigError(f"num_processes must be a positive integer, got "
                              f"{num_processes!r}")
        self.num_processes, self.local_mode, self.use_gpu = num_processes, local_mode, use_gpu
        self.spark = spark_session(spark)
        self.ssl_conf = _ssl_conf
        self.gpus: list[str] | None = None  # local mode's CUDA devices, where use_gpu
        self.input_params = {"num_processes": num_processes, "local_mode": local_mode,
                             "use_gpu": use_gpu, "num_tasks": num_processes}
        self._check_encryption()
        if use_gpu and local_mode:
            self._check_driver_gpus()
        elif use_gpu:
            with in_callers_words(NUM_PROCESSES):
                preflight.check_cluster(cluster_context(self.spark), num_processes, True)

    def _check_encryption(self) -> None:
        """torch.distributed traffic is not encrypted: with Spark's SSL on, refuse unless
        the user says so (the same key as pyspark's). pyspark reads both keys through the
        session (``spark.conf.set`` included), whose copy of a SparkContext setting changed
        later can be stale: so SSL counts as on where either says so, and as ignored only
        where every value set says so."""
        ssl_on = "true" in self._conf("spark.ssl.enabled")
        ignored = {v for v in self._conf(self.ssl_conf) if v} == {"true"}
        if ssl_on and not ignored:
            raise ClusterError(
                "spark.ssl.enabled is true, but the ranks' torch.distributed traffic is not "
                f"encrypted; set {self.ssl_conf}=true to train anyway, on a network you trust")

    def _conf(self, key: str) -> tuple[str, str]:
        """(the session's value of ``key``, the SparkContext conf's), lower case, '' if unset."""
        context = cluster_context(self.spark).getConf().get(key, None)
        try:
            session = self.spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a conf the session cannot give
            session = None
        return str(session or "").lower(), str(context or "").lower()

    def _check_driver_gpus(self) -> None:
        """Count the driver's GPUs as pyspark does: those Spark gave the driver
        (``spark.driver.resource.gpu.*``) where it gave any, else every GPU torch sees here;
        more processes than GPUs is cut down to one per GPU, with a warning, as pyspark does."""
        self.gpus = cluster_context(self.spark).driver_gpus()
        if self.gpus is None:
            import torch
            self.gpus = [str(i) for i in range(torch.cuda.device_count())]
            where = ("torch sees none (CUDA_VISIBLE_DEVICES="
                     f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}) and Spark gave it none "
                     "(spark.driver.resource.gpu.amount)")
        else:
            where = "Spark gave it none"
        if not self.gpus:
            raise ClusterError(
                f"use_gpu=True with local_mode=True needs GPUs on the driver, but {where}; "
                "pass use_gpu=False, or local_mode=False to train on the executors' GPUs")
        if len(self.gpus) < self.num_processes:
            log.warning("num_processes=%d is more than the %d GPUs on the driver: running "
                        "%d processes, one per GPU (as pyspark's TorchDistributor does)",
                        self.num_processes, len(self.gpus), len(self.gpus))
            self.num_processes = len(self.gpus)
            self.input_params.update(num_processes=self.num_processes,
                                     num_tasks=self.num_processes)
        self.gpus = self.gpus[:self.num_processes]

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run ``train_object(*args, **kwargs)`` (or the script with ``args`` as its command
        line) on ``num_processes`` processes; rank 0's return value (None for a script).
        Every keyword goes to the function, whatever its name (``timeout``, ``spark``...).

        Each process gets pyspark's environment: in distributed mode every task is a
        torchrun node of one process (``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``,
        ``GROUP_RANK=NODE_RANK=RANK``; with ``use_gpu`` its GPU is device 0, so
        ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` works), the host-local
        values under ``SPARKDDL_LOCAL_RANK``/``SPARKDDL_LOCAL_WORLD_SIZE``/
        ``SPARKDDL_NODE_RANK``; in local mode one node of ``num_processes`` processes."""
        if self.local_mode:
            if isinstance(train_object, (str, os.PathLike)):
                train_object, args = script(train_object, tuple(str(a) for a in args)), ()
            return run_local(train_object, args, kwargs, self.num_processes, self.use_gpu,
                             gpus=self.gpus)
        if isinstance(train_object, (str, os.PathLike)):
            args = tuple(str(a) for a in args)  # pyspark converts them too
        with in_callers_words(NUM_PROCESSES):
            return launch(train_object, args, kwargs, num_workers=self.num_processes,
                          use_gpu=self.use_gpu, spark=self.spark, node_per_rank=True,
                          caller="TorchDistributor.run", workers_name="num_processes")
