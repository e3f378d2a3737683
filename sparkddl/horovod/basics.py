"""hvd's process-level calls (``init``, ``rank``, ``size``, ``local_rank``...) over
torch.distributed's default process group.

Under sparkddl (``sparkddl.run``, ``HorovodRunner``, ``TorchDistributor``) or torchrun the
group is joined from the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
without it, ``init()`` makes a world of one in this process, so a notebook cell or a plain
``python train.py`` works unchanged. Host-local values come from sparkddl's SPARKDDL_*
variables first: under TorchDistributor's contract LOCAL_RANK is 0 on every rank.
"""
from __future__ import annotations

import os
from typing import Any

# the hosts' layout as init() learned it, for the process group it was learned in (Spark
# reuses Python workers: a later task's group is another one)
_cross: dict[str, Any] = {}


def init(comm: object = None, process_sets: object = None) -> None:
    """Join the default process group (gloo on CPU; NCCL with gloo for CPU tensors when the
    run asked for GPUs). Does nothing if a group exists. ``comm`` and ``process_sets`` are
    Horovod's MPI communicator and process sets: only None is supported."""
    import torch.distributed as dist

    if comm is not None or process_sets is not None:
        raise NotImplementedError("sparkddl.horovod.torch.init() takes no MPI communicator "
                                  "or process sets: every rank is in the one global group")
    if not dist.is_initialized():
        if _launched():
            from sparkddl.task.dist import init_process_group
            init_process_group()
        else:  # no launcher: a world of one, rank 0, with a store in this process
            store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage] - it is public
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if _cross.get("group") is not dist.group.WORLD:
        _learn_layout()


def _launched() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _learn_layout() -> None:
    """Horovod's cross communicator holds the ranks with this rank's local rank, one per
    host: count them, since hosts may run different numbers of ranks."""
    import torch.distributed as dist

    mine = (local_rank(), _node_rank())
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    peers = sorted(node for local, node in every if local == mine[0])
    _cross.update(rank=peers.index(mine[1]), size=len(peers), group=dist.group.WORLD)


def shutdown() -> None:
    """Leave the default process group (``init()`` can join a new one after)."""
    import torch.distributed as dist

    from sparkddl.task.bootstrap import release_process_groups
    _cross.clear()
    if dist.is_initialized():
        # ended but kept, never freed: freeing a gloo group can deadlock its destructor
        # (torch 2.4's destroy_process_group hung 1 run in 4 here; see bootstrap._RETIRED)
        release_process_groups()


def is_initialized() -> bool:
    """Whether ``init()`` (or torch.distributed.init_process_group) has run."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def _check() -> None:
    if not is_initialized():
        raise ValueError("sparkddl.horovod.torch has not been initialized; call hvd.init() "
                         "first")


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    import torch.distributed as dist
    _check()
    return dist.get_rank()


def size() -> int:
    """The number of ranks."""
    import torch.distributed as dist
    _check()
    return dist.get_world_size()


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        if os.environ.get(name, "") != "":
            return int(os.environ[name])
    return default


def local_rank() -> int:
    """This rank's index among the ranks on its host; for a rank that Spark gave a GPU of
    its own (the only one it sees), that GPU's index, so that Horovod's
    ``torch.cuda.set_device(hvd.local_rank())`` selects it."""
    from sparkddl.task import context
    if context.is_active() and context.current().gpus:
        from sparkddl.task.dist import local_device_index
        return local_device_index()
    return _env_int(("SPARKDDL_LOCAL_RANK", "LOCAL_RANK"), 0) if _launched() else 0


def local_size() -> int:
    """The number of ranks on this rank's host."""
    return _env_int(("SPARKDDL_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"), 1) if _launched() else 1


def _node_rank() -> int:
    return _env_int(("SPARKDDL_NODE_RANK", "GROUP_RANK", "NODE_RANK"), 0) if _launched() else 0


def cross_rank() -> int:
    """This rank's index among the ranks of the same local rank (its host's index when
    every host runs as many ranks)."""
    _check()
    return int(_cross.get("rank", 0))


def cross_size() -> int:
    """The number of ranks with this rank's local rank (the number of hosts when every host
    runs as many ranks)."""
    _check()
    return int(_cross.get("size", 1))


def is_homogeneous() -> bool:
    """Whether every host runs as many ranks."""
    return size() == local_size() * cross_size()


def mpi_threads_supported() -> bool:
    """False: there is no MPI (nor IBM DDL, nor oneCCL) underneath, only torch.distributed."""
    return False


mpi_enabled = mpi_built = ddl_built = ccl_built = mpi_threads_supported


def gloo_enabled() -> bool:
    """Whether torch.distributed has gloo (the CPU backend used here)."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


gloo_built = gloo_enabled


def nccl_built() -> bool:
    """Whether torch was built with NCCL (the GPU backend used here)."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_nccl_available()


def cuda_built() -> bool:
    """Whether torch was built with CUDA."""
    import torch
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    """Whether torch was built for ROCm."""
    import torch
    return torch.version.hip is not None
