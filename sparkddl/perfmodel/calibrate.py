"""Executor side of ``sparkddl plan``: measure, inside one short barrier stage, what the
performance model needs on this cluster with this model and data.

Every rank measures the same things at the same time (so they share the machine the way
training does): a training step without communication (and its backward pass alone; and,
on rank 0 while the others wait, the same step with the machine to itself), the
allreduce time for a sweep of sizes, the reader's rows/s on its shard, the per-epoch costs
(snapshot and checkpoint serialization), and, for every candidate strategy, a few real
steps: their time and the bytes and calls they send per step.
"""
from __future__ import annotations

import io
import statistics
import time
from dataclasses import dataclass
from typing import Any

from sparkddl import strategies
from sparkddl.data.reader import epoch_batches
from sparkddl.task import context
from sparkddl.task.dist import device, init_process_group
from sparkddl.train.components import build_module
from sparkddl.train.spec import TrainSpec

SIZES_BYTES = (1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24)  # 16 KiB .. 16 MiB
REPEATS = 5
WARMUP = 3


@dataclass
class Candidate:
    """A strategy to price: a label, its name and options, and steps to time."""

    label: str
    name: str
    options: dict[str, Any]
    steps: int = 8


def calibrate(spec: TrainSpec, candidates: list[Candidate], reader_steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ctx = context.current()
    init_process_group()
    dev = device()
    batch = next(iter(epoch_batches(spec.plan, ctx.rank, 0)))
    inputs = [batch[f].to(dev) for f in spec.config.features]
    label = batch[spec.config.labels[0]].to(dev)
    step_s, backward_s = _local_step(spec, dev, inputs, label)
    # a single worker has the machine to itself; every rank computing at once shares it
    alone_s = _local_step(spec, dev, inputs, label)[0] if ctx.rank == 0 else 0.0
    dist.barrier()
    out = {"world": ctx.world_size, "batch_size": spec.plan.batch_size,
           "torch_threads": torch.get_num_threads(), "step_s": step_s, "backward_s": backward_s,
           "step_alone_s": alone_s,
           "allreduce": _allreduce_sweep(dev), "reader_rows_s": _reader_rate(spec, reader_steps),
           "epoch_overhead_s": _epoch_overhead(spec, dev),
           "param_bytes": sum(p.numel() * p.element_size()
                              for p in build_module(spec.model_factory).parameters()),
           "strategies": {c.label: _strategy_step(spec, dev, c, inputs, label)
                          for c in candidates}}
    # the slowest rank sets the pace of synchronous training
    pace = torch.tensor([out["step_s"], -out["reader_rows_s"]], dtype=torch.float64)
    dist.all_reduce(pace, op=dist.ReduceOp.MAX)
    out["step_s"], out["reader_rows_s"] = pace[0].item(), -pace[1].item()
    return out


def _timed(fn: Any, repeats: int = REPEATS) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _local_step(spec: TrainSpec, dev: Any, inputs: list[Any], label: Any) -> tuple[float, float]:
    """A full training step with no communication, and its backward pass alone."""
    module = build_module(spec.model_factory).to(dev)
    opt = spec.optimizer.build(module.parameters(), spec.config.learning_rate)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        spec.loss(module(*inputs), label).backward()
        opt.step()

    def backward_only() -> None:
        loss = spec.loss(module(*inputs), label)
        start = time.perf_counter()
        loss.backward()
        holder.append(time.perf_counter() - start)

    holder: list[float] = []
    step_s = _timed(step)
    _timed(backward_only)
    return step_s, statistics.median(holder[WARMUP:])


def _allreduce_sweep(dev: Any) -> dict[int, float]:
    import torch
    import torch.distributed as dist
    out = {}
    for size in SIZES_BYTES:
        t = torch.ones(size // 4, device=dev)
        out[size] = _timed(lambda: dist.all_reduce(t))
    return out


def _reader_rate(spec: TrainSpec, steps: int) -> float:
    ctx = context.current()
    start, rows = time.perf_counter(), 0
    for i, batch in enumerate(epoch_batches(spec.plan, ctx.rank, 1)):
        rows += len(batch[spec.config.labels[0]])
        if i + 1 >= steps:
            break
    return rows / (time.perf_counter() - start)


def _epoch_overhead(spec: TrainSpec, dev: Any) -> float:
    """Serializing a snapshot and a checkpoint (twice the state) once per epoch."""
    import torch
    module = build_module(spec.model_factory).to(dev)

    def save() -> None:
        for _ in range(2):
            torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()},
                       io.BytesIO())
    return _timed(save, repeats=3)


def _strategy_step(spec: TrainSpec, dev: Any, cand: Candidate, inputs: list[Any],
                   label: Any) -> dict[str, float]:
    """Real steps of one strategy on a fresh replica: time, bytes and calls per step."""
    import torch
    torch.manual_seed(spec.config.seed)
    module = build_module(spec.model_factory).to(dev)
    strategy = strategies.create(cand.name, cand.options)
    model = strategy.wrap(module)
    opt = spec.optimizer.build(module.parameters(), spec.config.learning_rate)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        spec.loss(model(*inputs), label).backward()
        strategy.step(opt)

    for _ in range(WARMUP):
        step()
    strategy.end_epoch()  # counts from here
    start = time.perf_counter()
    for _ in range(cand.steps):
        step()
    elapsed = time.perf_counter() - start
    stats = strategy.end_epoch()
    strategy.finalize(module)
    return {"step_s": elapsed / cand.steps, "bytes": stats["comm_bytes"] / cand.steps,
            "calls": stats["comm_calls"] / cand.steps}
