"""hvd's collectives over torch.distributed's default process group.

Semantics follow Horovod's: ``allreduce`` averages by default and returns a new tensor
(``allreduce_`` works in place), ``allgather`` concatenates along the first dimension, whose
size may differ between ranks, ``broadcast`` takes the root's value. Differences: every call
runs at once (the ``*_async`` calls return a handle that is already done), ``name`` is
accepted and unused, results carry no autograd history, and there are no process sets.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from sparkddl.horovod.basics import rank, size
from sparkddl.strategies.tensors import flatten, unflatten_into

# Horovod's reduction constants (hvd.Average, hvd.Sum, ...)
Average, Sum, Adasum, Min, Max, Product = range(6)
_TORCH_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
              Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, ctx)`` before the
    allreduce, ``decompress(tensor, ctx) -> tensor`` after it. This one sends as is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send, and what decompress needs to undo the change."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor as the caller's."""
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``tensor`` as float16 (other dtypes as they are), and its dtype."""
        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor`` back in the dtype it had before compress."""
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as Horovod names them."""
    none = Compressor
    fp16 = FP16Compressor


def reduce_op(op: int | None, average: bool | None = None) -> int:
    """Horovod's rule: ``op`` wins, ``average`` is its old spelling, Average by default."""
    if op is not None and average is not None:
        raise ValueError("pass op or the older average argument, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("hvd.Adasum is not supported by sparkddl.horovod: there is "
                                  "no torch.distributed equivalent; use hvd.Average")
    if op not in _TORCH_OPS:
        raise ValueError(f"unknown reduction op {op!r}; choose one of hvd.Average, hvd.Sum, "
                         "hvd.Min, hvd.Max, hvd.Product")
    return op


def coalesced(tensors: Iterable[torch.Tensor], fn: Callable[[torch.Tensor], object]) -> None:
    """Apply the in-place collective ``fn`` to ``tensors`` with one call per (device, dtype):
    flattened into one buffer, copied back after (the strategies' own helpers)."""
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.device, t.dtype), []).append(t)
    for group in buckets.values():
        if len(group) == 1 and group[0].is_contiguous():
            fn(group[0])
            continue
        flat = flatten(group)
        fn(flat)
        unflatten_into(flat, group)


def reduce_(tensors: Iterable[torch.Tensor], op: int, prescale_factor: float = 1.0,
            postscale_factor: float = 1.0) -> None:
    """Reduce ``tensors`` in place across the ranks; Average divides the sum by size()
    (integer tensors with floor division, as their dtype allows)."""
    n = size()

    def one(flat: torch.Tensor) -> None:
        _scale(flat, prescale_factor)
        dist.all_reduce(flat, op=_TORCH_OPS[op])
        if op == Average and not (flat.is_floating_point() or flat.is_complex()):
            flat.div_(n, rounding_mode="floor")
            _scale(flat, postscale_factor)
        else:
            _scale(flat, postscale_factor / n if op == Average else postscale_factor)

    with torch.no_grad():
        coalesced(tensors, one)


def _scale(t: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if not (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"prescale/postscale factors need floating-point tensors, not "
                         f"{t.dtype}")
    t.mul_(factor)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` across the ranks in place (Average by default) and return it."""
    reduce_([tensor], reduce_op(op, average), prescale_factor, postscale_factor)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compressor, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """The reduction of ``tensor`` across the ranks (Average by default), as a new tensor;
    ``compression`` changes what travels (``Compression.fp16``)."""
    wire, ctx = compression.compress(tensor.detach())
    if wire.data_ptr() == tensor.data_ptr():  # the caller's storage: reduce a copy
        wire = wire.clone()
    allreduce_(wire, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(wire, ctx)


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``allreduce_`` of every tensor, with one collective per dtype and device."""
    reduce_(tensors, reduce_op(op, average), prescale_factor, postscale_factor)
    return tensors


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None,
                      name: str | None = None, op: int | None = None,
                      prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``allreduce`` of every tensor (new tensors), with one collective per dtype and device."""
    return grouped_allreduce_([t.detach().clone() for t in tensors], average, name, op,
                              prescale_factor, postscale_factor)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order. The first
    dimension may differ between ranks; the others and the dtype must not."""
    mine = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach().contiguous()
    shapes = allgather_object((tuple(mine.shape), str(mine.dtype)))
    if len({(s[1:], d) for s, d in shapes}) > 1:
        raise ValueError(f"allgather needs the same dtype and trailing dimensions on every "
                         f"rank; the ranks have (shape, dtype) {shapes}")
    longest = max(s[0] for s, _ in shapes)
    padded = mine.new_zeros((longest, *mine.shape[1:]))
    padded[:mine.shape[0]] = mine
    parts = [torch.empty_like(padded) for _ in shapes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:s[0]] for p, (s, _) in zip(parts, shapes)])


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with the root rank's, in place, and return it."""
    _check_root(root_rank)
    with torch.no_grad():
        coalesced([tensor], lambda flat: dist.broadcast(flat, src=root_rank))
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """The root rank's ``tensor``, as a new tensor."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def _check_root(root_rank: int) -> None:
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < size():
        raise ValueError(f"root_rank must be a rank, 0 to {size() - 1}; got {root_rank!r}")


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """The root rank's ``obj`` (any picklable object) on every rank."""
    _check_root(root_rank)
    box = [obj if rank() == root_rank else None]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's ``obj`` (any picklable object), in rank order."""
    every: list[Any] = [None] * size()
    dist.all_gather_object(every, obj)
    return every


def barrier() -> None:
    """Wait until every rank has called barrier()."""
    size()  # raises when not initialized
    dist.barrier()


def join(device: int = -1) -> int:
    """A barrier. Horovod's join lets ranks that ran out of data stop while the others
    still reduce; here every rank must make the same collective calls before it, since
    torch.distributed has no such mode. Returns size() - 1 (Horovod returns the rank that
    joined last, which is not tracked here)."""
    barrier()
    return size() - 1


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every rank's parameters with the root rank's, in place: ``params`` is a
    ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors."""
    if isinstance(params, dict):
        items = [t for _, t in sorted(params.items())]
    elif isinstance(params, Iterable):
        items = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ValueError(f"broadcast_parameters takes a state_dict, named_parameters() or a "
                         f"list of tensors, not {type(params).__name__}")
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    _check_root(root_rank)
    with torch.no_grad():
        coalesced(tensors, lambda flat: dist.broadcast(flat, src=root_rank))


class _Done:
    """What the ``*_async`` calls return: the result, already there."""

    def __init__(self, result: Any):
        self.result = result


def _later(fn: Callable[..., Any]) -> Callable[..., _Done]:
    def run_now(*args: Any, **kwargs: Any) -> _Done:
        return _Done(fn(*args, **kwargs))
    run_now.__name__ = f"{fn.__name__.rstrip('_')}_async{'_' if fn.__name__[-1] == '_' else ''}"
    run_now.__doc__ = f"``{fn.__name__}``, run at once; ``synchronize(handle)`` gives its result."
    return run_now


allreduce_async, allreduce_async_ = _later(allreduce), _later(allreduce_)
allgather_async, broadcast_async, broadcast_async_ = \
    _later(allgather), _later(broadcast), _later(broadcast_)
grouped_allreduce_async, grouped_allreduce_async_ = \
    _later(grouped_allreduce), _later(grouped_allreduce_)


def poll(handle: _Done) -> bool:
    """True: every operation has finished by the time its handle is returned."""
    return True


def synchronize(handle: _Done) -> Any:
    """The result of the ``*_async`` call that returned ``handle``."""
    return handle.result
