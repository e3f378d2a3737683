"""hvd's ``DistributedOptimizer`` and ``broadcast_optimizer_state``.

``DistributedOptimizer(opt)`` returns ``opt`` itself with its class swapped for a subclass
of its own class (so ``isinstance(opt, torch.optim.SGD)`` holds and ``state_dict``,
``param_groups``, ``zero_grad``, LR schedulers work as before) whose ``step()`` first
averages the gradients across the ranks: one allreduce per gradient dtype and device, after
the whole backward pass (Horovod overlaps per-tensor allreduces with backward; the numbers
are the same).

``backward_passes_per_step=k`` is Horovod's: call ``loss.backward()`` up to k times, then
``step()`` once. autograd sums the k passes' gradients locally and ``step()`` applies that
sum averaged across the ranks (not divided by k, as in Horovod's torch optimizer); one more
backward pass before ``step()`` raises. Every ``step()`` reduces, whatever the count so far;
``zero_grad()`` starts the count again.

Gradients a rank did not compute count as zeros (a parameter with ``requires_grad`` gets
a zero gradient then, as with Horovod). A closure given to ``step()`` runs after the
reduction, so its gradients are not averaged (as with Horovod).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from sparkddl.horovod.basics import rank
from sparkddl.horovod.collectives import Average, Compressor, broadcast_object, reduce_, reduce_op


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: Any = None) -> None:
    """Give every rank the root rank's optimizer state and hyperparameters (``lr``,
    momentum buffers, Adam's moments, ...). The root's ``state_dict()`` is sent whole, on
    the CPU, and loaded by the others; a fresh optimizer's empty state works too."""
    state = _on_cpu(optimizer.state_dict()) if rank() == root_rank else None
    state = broadcast_object(state, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def _on_cpu(value: Any) -> Any:
    """``value`` with every tensor in it on the CPU, so no rank unpickles to a root's GPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


class _Sync:
    """What a DistributedOptimizer keeps besides its optimizer's own attributes."""

    def __init__(self, compression: type[Compressor], op: int, passes: int,
                 predivide: float, sparse_as_dense: bool):
        self.compression, self.op, self.passes = compression, op, passes
        self.predivide, self.sparse_as_dense = predivide, sparse_as_dense
        self.counts: dict[int, int] = {}  # backward passes per parameter since the last step
        self.synchronized = False
        self.skip = False
        self.hooks: list[Any] = []


class _DistributedOptimizer:
    """Mixed in before the user's optimizer class; see the module's docstring."""

    _hvd: _Sync
    param_groups: list[dict[str, Any]]  # the optimizer's, which comes after this class

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def synchronize(self) -> None:
        """Reduce the gradients across the ranks now (for code that reads or clips them
        before ``step()``, which then must run inside ``skip_synchronize()``)."""
        sync = self._hvd
        grads = []
        for p in self._params():
            if p.grad is None:  # another rank may have a gradient for it: send zeros
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                if not sync.sparse_as_dense:
                    raise NotImplementedError(
                        "sparse gradients cannot be reduced by sparkddl.horovod; pass "
                        "sparse_as_dense=True to DistributedOptimizer")
                p.grad = p.grad.to_dense()
            grads.append(p.grad)
        sent = [sync.compression.compress(g) for g in grads]
        pre, post = (1.0 / sync.predivide, sync.predivide) if sync.op == Average else (1, 1)
        reduce_([wire for wire, _ in sent], sync.op, pre, post)
        for grad, (wire, ctx) in zip(grads, sent):
            if wire is not grad:
                grad.copy_(sync.compression.decompress(wire, ctx))
        sync.synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this block applies the gradients as they are (after an
        explicit ``synchronize()``)."""
        self._hvd.skip = True
        try:
            yield
        finally:
            self._hvd.skip = False

    def step(self, closure: Any = None) -> Any:
        """Reduce the gradients across the ranks (unless synchronize() already did or
        inside skip_synchronize()), then take the optimizer's own step."""
        sync = self._hvd
        if not sync.skip:
            if sync.synchronized:
                warnings.warn("optimizer.step() after optimizer.synchronize() outside "
                              "optimizer.skip_synchronize(): the gradients were reduced "
                              "once already and are applied as they are", stacklevel=2)
            else:
                self.synchronize()
        sync.synchronized = False
        sync.counts.clear()
        return super().step(closure)  # pyright: ignore[reportAttributeAccessIssue]

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's zero_grad; the count of backward passes starts again."""
        self._hvd.counts.clear()
        self._hvd.synchronized = False
        super().zero_grad(*args, **kwargs)  # pyright: ignore[reportAttributeAccessIssue]

    def _count_pass(self, param: torch.Tensor) -> None:
        counts, limit = self._hvd.counts, self._hvd.passes
        counts[id(param)] = counts.get(id(param), 0) + 1
        if counts[id(param)] > limit:
            raise RuntimeError(
                f"a gradient was computed {counts[id(param)]} times since the last "
                f"optimizer.step() but DistributedOptimizer was told "
                f"backward_passes_per_step={limit}; raise backward_passes_per_step to "
                "accumulate gradients locally, or call step() (or zero_grad()) in between")


def DistributedOptimizer(optimizer: torch.optim.Optimizer,  # noqa: N802 - Horovod's name
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compressor,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None,
                         sparse_as_dense: bool = False) -> torch.optim.Optimizer:
    """``optimizer``, now reducing its gradients across the ranks in ``step()`` (see the
    module's docstring). ``named_parameters`` is checked (unique names, every parameter of
    the optimizer named) and otherwise unused; ``num_groups``/``groups`` are accepted and
    ignored (gradients go in one bucket per dtype and device)."""
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is a DistributedOptimizer already")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"DistributedOptimizer wraps a torch.optim.Optimizer, not "
                         f"{type(optimizer).__name__}")
    op = reduce_op(op)
    if op != Average and gradient_predivide_factor != 1.0:
        raise ValueError("gradient_predivide_factor applies to op=hvd.Average only")
    if isinstance(backward_passes_per_step, bool) or \
            not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got "
                         f"{backward_passes_per_step!r}")
    if named_parameters is not None:
        _check_names(optimizer, list(named_parameters))
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (_DistributedOptimizer, base), {})
    # (pyright still sees the optimizer's own class)
    optimizer._hvd = _Sync(  # pyright: ignore[reportAttributeAccessIssue]
        compression, op, backward_passes_per_step, gradient_predivide_factor, sparse_as_dense)
    _keep_scheduler_tracking(optimizer)
    for p in optimizer._params():  # pyright: ignore[reportAttributeAccessIssue]
        optimizer._hvd.hooks.append(  # pyright: ignore[reportAttributeAccessIssue]
            p.register_post_accumulate_grad_hook(
                optimizer._count_pass))  # pyright: ignore[reportAttributeAccessIssue]
    return optimizer


def _check_names(optimizer: torch.optim.Optimizer,
                 named: list[tuple[str, torch.Tensor]]) -> None:
    if any(not (isinstance(p, tuple) and len(p) == 2) for p in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, as "
                         "model.named_parameters() gives")
    names = [n for n, _ in named]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"named_parameters repeats the names {', '.join(repeated)}")
    unnamed = {id(p) for g in optimizer.param_groups for p in g["params"]} - \
        {id(p) for _, p in named}
    if unnamed:
        raise ValueError(f"named_parameters leaves out {len(unnamed)} of the optimizer's "
                         "parameters; pass model.named_parameters() of the model it trains")


def _keep_scheduler_tracking(optimizer: Any) -> None:
    """An LR scheduler made before wrapping replaced ``optimizer.step`` on the instance with
    a call of the old class's step: route it through the new step, keeping its mark."""
    old = optimizer.__dict__.pop("step", None)
    if old is None:
        return

    def step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return type(optimizer).step(optimizer, *args, **kwargs)

    step.__dict__.update(getattr(old, "__dict__", {}))
    optimizer.step = step
