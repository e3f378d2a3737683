"""Process-group helpers for functions running under sparkddl (or torchrun)."""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from sparkddl.errors import ClusterError, ConfigError
from sparkddl.task import context

if TYPE_CHECKING:
    import torch

# on GPU, NCCL for CUDA tensors and gloo for the CPU tensors the library itself exchanges
# (checkpoint state, step counts): a plain "nccl" group refuses CPU tensors
GPU_BACKEND = "cpu:gloo,cuda:nccl"
BACKENDS = ("gloo", "nccl", GPU_BACKEND)


def init_process_group(backend: str | None = None, timeout_s: float | None = None) -> str:
    """Initialize the default process group for the calling rank and return its backend.

    ``backend`` defaults to NCCL when the run asked for GPUs (as ``cpu:gloo,cuda:nccl``, so
    CPU tensors can be exchanged too) and gloo otherwise. On GPU the rank's CUDA device is
    selected first. Does nothing if a group already exists.

    Args:
        backend: ``gloo``, ``nccl`` or ``cpu:gloo,cuda:nccl``; None for the default above.
        timeout_s: the collective timeout (default: the run's ``timeout``, else 1800 s).

    Raises:
        ConfigError: an unknown backend.
        ClusterError: NCCL without a GPU that torch sees.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return str(dist.get_backend())
    backend = backend or default_backend(_use_gpu())
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if "nccl" in backend:
        if not torch.cuda.is_available():
            raise ClusterError(
                "the NCCL backend needs CUDA but torch sees no GPU on this executor "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); install a "
                "CUDA build of torch on the executors or run with use_gpu=False")
        torch.cuda.set_device(local_device_index())
    if timeout_s is None:
        timeout_s = context.current().collective_timeout_s if context.is_active() else 1800.0
    with context.collective("init_process_group (waiting for every rank to join)"):
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return backend


def default_backend(use_gpu: bool) -> str:
    return GPU_BACKEND if use_gpu else "gloo"


# CUDA_VISIBLE_DEVICES when CUDA was first initialized in this process: Spark reuses Python
# workers, and CUDA keeps the devices it saw then, whatever later tasks set
_visible_at_cuda_init: str | None = None


def note_visible_devices() -> None:
    """Called when a task has set CUDA_VISIBLE_DEVICES: remember it if CUDA is not up yet."""
    global _visible_at_cuda_init
    import torch
    if not torch.cuda.is_initialized():
        _visible_at_cuda_init = os.environ.get("CUDA_VISIBLE_DEVICES")


def visible_at_cuda_init() -> str | None:
    """CUDA_VISIBLE_DEVICES as a task of this process saw it when it initialized CUDA, or
    None (CUDA not initialized by a rank, so every device is numbered as the host sees it)."""
    import torch
    return _visible_at_cuda_init if torch.cuda.is_initialized() else None


def local_device_index() -> int:
    """The CUDA device index this rank should use.

    When Spark assigned GPUs, CUDA_VISIBLE_DEVICES holds exactly this task's devices, so the
    first visible device is ours, unless CUDA was initialized by an earlier task of this
    reused worker, in which case the devices are numbered as that task saw them. Without an
    assignment (local mode) ranks on one host take devices round-robin by local rank.
    """
    import torch

    if context.is_active() and context.current().gpus:
        return task_device_index(context.current().gpus[0])
    count = max(torch.cuda.device_count(), 1)
    # the host's ranks as sparkddl counted them (TorchDistributor's contract sets LOCAL_RANK
    # to 0 on every rank), else as the launcher set them
    local_world = int(os.environ.get("SPARKDDL_LOCAL_WORLD_SIZE",
                                     os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if local_world > count:
        raise ClusterError(
            f"{local_world} ranks run on {socket.gethostname()} but it has {count} visible "
            "GPU(s): NCCL cannot put two ranks on one GPU; lower num_workers to the GPUs per "
            "host, or let Spark assign each rank a GPU of its own (a cluster master with "
            "spark.executor.resource.gpu.amount set)")
    return int(os.environ.get("SPARKDDL_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))) % count


def task_device_index(gpu: str) -> int:
    """The index of the task's GPU ``gpu`` as CUDA numbers devices in this process."""
    import torch
    return device_index(gpu, torch.cuda.is_initialized(), _visible_at_cuda_init)


def device_index(gpu: str, cuda_initialized: bool, visible_at_init: str | None) -> int:
    """Index of physical GPU ``gpu`` among the devices CUDA enumerated in this process."""
    if not cuda_initialized or visible_at_init is None:
        return 0
    seen = [d.strip() for d in visible_at_init.split(",")]
    if gpu not in seen:
        raise ClusterError(
            f"Spark assigned GPU {gpu} to this task, but CUDA was initialized in this reused "
            f"Python worker by an earlier task that saw only GPUs {visible_at_init}; set "
            "spark.python.worker.reuse=false for GPU training")
    return seen.index(gpu)


def device() -> "torch.device":  # torch is imported lazily
    """``cuda:<i>`` for a GPU run, ``cpu`` otherwise."""
    import torch

    if _use_gpu() and torch.cuda.is_available():
        return torch.device("cuda", local_device_index())
    return torch.device("cpu")


def _use_gpu() -> bool:
    if context.is_active():
        return context.current().use_gpu
    return os.environ.get("SPARKDDL_USE_GPU") == "1"
