"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Each rank holds 1/N of every parameter, gradient and optimizer state. A shard unit's
parameters are all-gathered before its forward (and again before its backward when they were
freed after the forward); its gradients are reduce-scattered, averaged, at the end of the
backward pass, so each rank steps the optimizer on its own shard only.

Options:

* ``reshard_after_forward`` (default True): free a unit's gathered parameters after its
  forward and gather them again in the backward pass: less memory, one more all-gather per
  unit and step. The root unit always keeps them (they are needed first in the backward).
* ``min_params`` (default 1,000,000): going from the deepest submodules up, a submodule that
  holds at least this many parameters not already in a smaller unit becomes a unit of its
  own; the root takes the rest. Smaller units lower the peak (one unit's full parameters at a
  time), at one more all-gather and reduce-scatter each. A submodule whose parameter is also
  registered outside it (tied weights) stays in the enclosing unit.

What the ranks hold and return:

* ``full_state_dict`` / ``snapshot_state`` and ``optimizer_state_dict`` are collective and
  complete on rank 0 only (CPU tensors, the unwrapped module's keys; the optimizer's state
  and param groups keyed by parameter name). Every other rank returns ``{}``: a large model
  is never copied N times into host memory.
* ``load_optimizer_state_dict`` takes that full state on every rank; each keeps its shard.
* ``finalize`` does nothing and ``state_dict`` is empty: there is one model, in shards;
  the full weights come from ``full_state_dict``.
* Buffers are not sharded and not synchronized after ``wrap`` (rank 0's are broadcast
  there): BatchNorm statistics stay per rank, and the state dict holds rank 0's.

Communication (``comm_bytes``, the convention of :mod:`sparkddl.strategies.comm`: bytes a
rank hands to collectives) is counted from the units' shapes, exactly what FSDP hands to its
collectives: per unit and micro-batch, an all-gather of its padded shard in the forward
(and one in the backward if resharded), and per optimizer step a reduce-scatter of its
padded full gradient. State dicts and the setup broadcast are not counted. On a ring, an
all-gather or reduce-scatter of a whole model moves half what an allreduce of it does, so
with resharding FSDP puts 1.5x allreduce's traffic on the wire, though it counts 2x here.

Torch: the public ``torch.distributed.fsdp.fully_shard`` (torch >= 2.6, checked on 2.13)
runs on CPU (gloo) and CUDA (NCCL). torch 2.4/2.5 only have
``torch.distributed._composable.fsdp``; that one is used for CUDA modules only, since 2.4.1's
creates CUDA streams unconditionally, and a CPU module is refused in ``wrap``.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from sparkddl.errors import ConfigError
from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.comm import tensor_bytes
from sparkddl.strategies.tensors import broadcast_module
from sparkddl.task.context import collective

# the process-group backend each device type's collectives need: FSDP with a CUDA module on a
# gloo group crashes the process instead of raising (pytorch/pytorch#132471)
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


class FullyShardedDataParallel(Strategy):
    name = "fsdp"
    @dataclass(frozen=True)
    class Options:
        reshard_after_forward: bool = option(True, "free a unit's gathered parameters after "
                                             "its forward (gather them again for backward)")
        min_params: int = option(1_000_000, "parameters a submodule needs to be a shard "
                                 "unit of its own")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.root: Any = None  # the wrapped module (an FSDPModule)
        self.device: Any = None
        self.syncing = True  # False inside no_sync: gradients accumulate unreduced
        self.pass_cost = (0, 0)  # (bytes, calls) of one micro-batch's all-gathers
        self.reduce_cost = (0, 0)  # (bytes, calls) of one step's reduce-scatters

    def check_options(self) -> None:
        self.check_bool("reshard_after_forward")
        self.check_int("min_params", 1)
        problem = fsdp_problem()
        if problem:
            raise ConfigError(f"strategy='fsdp' {problem}")

    def check_device(self, device_type: str) -> None:
        problem = fsdp_problem(device_type)
        if problem:
            raise ConfigError(f"strategy='fsdp' {problem}")

    def wrap(self, module: Any) -> Any:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        self.device = _device_of(module)
        problem = fsdp_problem(self.device.type)
        if problem:
            raise ConfigError(f"strategy='fsdp' {problem}")
        backend, needed = str(dist.get_backend()), BACKENDS.get(self.device.type)
        if needed and needed not in backend:
            raise ConfigError(f"strategy='fsdp' with the model on {self.device} needs a "
                              f"{needed} process group, but it is {backend!r}; put the model "
                              f"on the device the process group was made for")
        fully_shard, _ = _fully_shard_api()
        broadcast_module(module)  # every rank shards the same weights: rank 0's, as DDP does
        world = dist.get_world_size()
        with collective("sharding the model with FSDP"):
            mesh = init_device_mesh(self.device.type, (world,))
            units = shard_units(module, self.options["min_params"])
            for unit, _ in units[:-1]:
                fully_shard(unit, mesh=mesh,  # pyright: ignore[reportOptionalCall]
                            reshard_after_forward=self.options["reshard_after_forward"])
            fully_shard(module, mesh=mesh, reshard_after_forward=False)  # pyright: ignore[reportOptionalCall]
        self.root = module
        self._plan_comm([(params, unit is not module and self.options["reshard_after_forward"])
                         for unit, params in units], world)
        return module

    def _plan_comm(self, units: list[tuple[list[Any], bool]], world: int) -> None:
        shards = [(sum(_shard_bytes(p, world) for p in params), resharded)
                  for params, resharded in units if params]
        gathers = [size for size, resharded in shards for _ in range(1 + resharded)]
        self.pass_cost = (sum(gathers), len(gathers))
        self.reduce_cost = (world * sum(size for size, _ in shards), len(shards))

    def full_traffic_bytes(self) -> int:
        """The full size of what one step's all-gathers and reduce-scatters assemble (each
        unit's padded parameters, once per gather, and its padded gradient): a ring moves
        (n - 1) / n of it per rank."""
        import torch.distributed as dist

        return self.pass_cost[0] * dist.get_world_size() + self.reduce_cost[0]

    def no_sync(self) -> Any:
        """Gradients accumulate unsharded (full size) on every rank until the backward pass
        outside this context reduce-scatters their sum; parameters are still gathered."""
        return contextlib.nullcontext() if self.root is None else self._no_sync()

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        self.root.set_requires_gradient_sync(False)
        self.syncing = False
        try:
            yield
        finally:
            self.root.set_requires_gradient_sync(True)
            self.syncing = True

    def backward(self, loss: Any) -> None:
        # FSDP gathers parameters and reduce-scatters gradients unit by unit inside autograd
        with collective("FSDP's all-gathers and gradient reduce-scatters (inside backward)"):
            loss.backward()
        self.comm.add(*self.pass_cost)  # this micro-batch's forward and backward gathers
        if self.syncing:
            self.comm.add(*self.reduce_cost)

    def clip_grad_norm_(self, parameters: list[Any], max_norm: float) -> float:
        """The norm over every rank's shards (one scalar allreduce); every rank must call it."""
        import torch
        import torch.distributed as dist

        grads = [p.grad for p in parameters if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for g in grads:
            squares += torch.linalg.vector_norm(_local(g), dtype=torch.float32).square()
        self.comm.add(tensor_bytes(squares))
        with collective("the gradient norm allreduce (clipping)"):
            dist.all_reduce(squares)
        total = math.sqrt(float(squares))
        coef = max_norm / (total + 1e-6)  # torch.nn.utils.clip_grad_norm_'s coefficient
        if not coef >= 1.0:  # NaN too: a non-finite norm spoils the gradients, as in torch
            with torch.no_grad():
                for g in grads:
                    g.mul_(coef)
        return total

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        """Collective. Rank 0: the whole model, CPU tensors; other ranks: ``{}``."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        with collective("gathering the full model from its FSDP shards"):
            state = get_model_state_dict(module, options=_full_options())
        return _copy_aliases(state, [*module.parameters(), *module.buffers()])

    def snapshot_state(self, module: Any) -> dict[str, Any]:
        return self.full_state_dict(module)

    def optimizer_state_dict(self, module: Any, optimizer: Any) -> dict[str, Any]:
        """Collective. Rank 0: the unsharded optimizer state (keyed by parameter name, CPU
        tensors, loadable with ``weights_only=True``); other ranks: ``{}``."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        optimizer = torch_optimizer(optimizer)
        with collective("gathering the optimizer state from its FSDP shards"):
            state = get_optimizer_state_dict(module, optimizer, options=_full_options())
        return _copy_aliases(state, [t for s in optimizer.state.values() for t in s.values()])

    def load_optimizer_state_dict(self, module: Any, optimizer: Any,
                                  state: dict[str, Any]) -> None:
        """Every rank passes the same full state; each keeps its own shard of it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        with collective("restoring the optimizer state into FSDP shards"):
            set_optimizer_state_dict(module, torch_optimizer(optimizer), optim_state_dict=state,
                                     options=StateDictOptions(full_state_dict=True))


def shard_units(root: Any, min_params: int) -> list[tuple[Any, list[Any]]]:
    """(module, the parameters it shards) for every unit, deepest first; the root is last."""
    everywhere = Counter(id(p) for _, p in root.named_parameters(remove_duplicate=False))
    taken: set[int] = set()
    units: list[tuple[Any, list[Any]]] = []

    def visit(module: Any) -> None:
        for child in module.children():
            visit(child)
        if module is root:
            return
        own = [p for p in module.parameters() if id(p) not in taken]
        if sum(p.numel() for p in own) < min_params:
            return
        inside = Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
        if any(inside[id(p)] != everywhere[id(p)] for p in own):
            return  # a parameter tied to one outside: FSDP needs both in the same unit
        taken.update(id(p) for p in own)
        units.append((module, own))

    visit(root)
    units.append((root, [p for p in root.parameters() if id(p) not in taken]))
    return units


def _shard_bytes(param: Any, world: int) -> int:
    """One rank's padded shard: FSDP splits dim 0 into ``world`` equal parts, padding the
    last ones (a scalar counts as one row)."""
    rows = param.shape[0] if param.dim() else 1
    return math.ceil(rows / world) * (param.numel() // max(rows, 1)) * param.element_size()


def _local(t: Any) -> Any:
    """This rank's shard of a DTensor (FSDP's parameters and gradients); ``t`` otherwise."""
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def _copy_aliases(state: Any, live: list[Any]) -> Any:
    """``state`` with copies of its tensors that are ``live`` ones: on the CPU the state
    dict helpers return what needs no gathering (buffers, Adam's step) as it is, and
    training would change a saved state under its holder."""
    import torch

    ptrs = {_local(t).data_ptr() for t in live if torch.is_tensor(t)}

    def copy(obj: Any) -> Any:
        if torch.is_tensor(obj):
            return obj.clone() if obj.data_ptr() in ptrs else obj
        if isinstance(obj, dict):
            return {k: copy(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(copy(v) for v in obj)
        return obj

    return copy(state)


def _device_of(module: Any) -> Any:
    for p in module.parameters():
        return p.device
    raise ConfigError(f"strategy='fsdp' needs a model with parameters to shard; "
                      f"{type(module).__name__} has none")


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload gathers to rank 0's host memory only: the other ranks get {}
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer behind a wrapper such as the loop's OptimizerStep (its
    ``optimizer`` attribute). The state dict helpers call ``step(closure=None)`` on an
    optimizer with no state yet, at learning rate 0: that must not clip or scale."""
    import torch

    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _fully_shard_api() -> tuple[Callable[..., Any] | None, bool]:
    """(fully_shard or None, whether it trains right on CPU devices). On CPU (gloo), torch
    2.7's reduce-scatter sums the ranks' gradients without averaging them (two ranks train
    with twice the gradient: seen on the Databricks 17.3 LTS ML stack); 2.13's averages them.
    The versions between are not checked, so CPU models need 2.13."""
    import torch

    try:
        from torch.distributed.fsdp import fully_shard
        release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
        return fully_shard, release >= (2, 13)
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard  # pyright: ignore[reportPrivateImportUsage]
        return fully_shard, False
    except ImportError:
        return None, False


def fsdp_problem(device_type: str | None = None) -> str | None:
    """Why this torch cannot run FSDP2 (on ``device_type``, where given), or None."""
    import torch

    fully_shard, on_cpu = _fully_shard_api()
    if fully_shard is None:
        return (f"needs FSDP2 (fully_shard), which torch {torch.__version__} does not have; "
                "install torch >= 2.6 (checked on 2.13), or >= 2.4 for CUDA models only")
    if device_type is not None and device_type != "cuda" and not on_cpu:
        return (f"runs on CUDA only with torch {torch.__version__}, but the model is on "
                f"{device_type}: on CPU, FSDP2 before torch 2.13 needs CUDA streams (before "
                "2.6) or sums the ranks' gradients without averaging them (seen on 2.7); "
                "install torch >= 2.13 (checked), use strategy='allreduce', or train on GPUs")
    return None
