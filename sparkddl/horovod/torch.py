"""``import sparkddl.horovod.torch as hvd``: Horovod's ``horovod.torch`` API over
torch.distributed, for HorovodRunner code (Horovod does not build against current torch).

Supported, with Horovod's semantics: ``init``, ``shutdown``, ``is_initialized``, ``rank``,
``size``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``,
``is_homogeneous``; ``allreduce``/``allreduce_`` (``Average``, ``Sum``, ``Min``, ``Max``,
``Product``, ``prescale_factor``/``postscale_factor``, ``Compression.none``/``fp16``),
``grouped_allreduce``/``grouped_allreduce_``, ``allgather`` (first dimensions may differ
between ranks), ``broadcast``/``broadcast_``, ``broadcast_object``, ``allgather_object``,
``barrier``, ``broadcast_parameters``, ``broadcast_optimizer_state``,
``DistributedOptimizer`` (``backward_passes_per_step``, ``op``, ``compression``,
``gradient_predivide_factor``, ``synchronize()``/``skip_synchronize()``), the ``*_async``
variants with ``poll``/``synchronize`` (they complete at once), and the ``*_built`` /
``*_enabled`` probes (no MPI, DDL or oneCCL: those say False).

Not supported: ``hvd.Adasum`` (NotImplementedError), process sets and MPI communicators,
``alltoall``, ``reducescatter``, sparse gradients (unless ``sparse_as_dense=True``),
autograd through the collectives, and Horovod's ``join`` for uneven data: ``join()`` is a
barrier here (every rank must make the same collective calls before it) returning
``size() - 1``. Outside any launcher ``init()`` makes a world of one (rank 0 of 1), in which
every operation is the identity.
"""
from __future__ import annotations

from sparkddl.horovod.basics import (
                                     ccl_built,
                                     cross_rank,
                                     cross_size,
                                     cuda_built,
                                     ddl_built,
                                     gloo_built,
                                     gloo_enabled,
                                     init,
                                     is_homogeneous,
                                     is_initialized,
                                     local_rank,
                                     local_size,
                                     mpi_built,
                                     mpi_enabled,
                                     mpi_threads_supported,
                                     nccl_built,
                                     rank,
                                     rocm_built,
                                     shutdown,
                                     size,
)
from sparkddl.horovod.collectives import (
                                     Adasum,
                                     Average,
                                     Compression,
                                     Compressor,
                                     Max,
                                     Min,
                                     Product,
                                     Sum,
                                     allgather,
                                     allgather_async,
                                     allgather_object,
                                     allreduce,
                                     allreduce_,
                                     allreduce_async,
                                     allreduce_async_,
                                     barrier,
                                     broadcast,
                                     broadcast_,
                                     broadcast_async,
                                     broadcast_async_,
                                     broadcast_object,
                                     broadcast_parameters,
                                     grouped_allreduce,
                                     grouped_allreduce_,
                                     grouped_allreduce_async,
                                     grouped_allreduce_async_,
                                     join,
                                     poll,
                                     synchronize,
)
from sparkddl.horovod.optimizer import DistributedOptimizer, broadcast_optimizer_state

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "Compressor",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "allgather_object", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_parameters", "barrier", "join", "poll",
    "synchronize", "DistributedOptimizer", "broadcast_optimizer_state",
]
