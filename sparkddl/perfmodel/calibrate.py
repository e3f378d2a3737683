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
from sparkddl.perfmodel import memory
from sparkddl.task import context, rss
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
    batches = epoch_batches(spec.plan, ctx.rank, 0)
    batch = next(iter(batches))
    batches.close()  # the reader's threads stop: their buffers are priced from the plan
    runtime = rss.rss_bytes()  # with the reader's libraries loaded, before the model
    inputs = [batch[f].to(dev) for f in spec.config.features]
    label = batch[spec.config.labels[0]].to(dev)
    grown = _peak_growth(dev)
    step_s, backward_s = _local_step(spec, dev, inputs, label)
    footprint = _footprint(spec, dev, inputs, label, runtime, grown(), ctx.local_world_size)
    # a single worker has the machine to itself; every rank computing at once shares it
    alone_s = _local_step(spec, dev, inputs, label)[0] if ctx.rank == 0 else 0.0
    dist.barrier()
    out = {"world": ctx.world_size, "batch_size": spec.plan.batch_size,
           "torch_threads": torch.get_num_threads(), "step_s": step_s, "backward_s": backward_s,
           "step_alone_s": alone_s,
           "allreduce": _allreduce_sweep(dev), "reader_rows_s": _reader_rate(spec, reader_steps),
           "epoch_overhead_s": _epoch_overhead(spec, dev),
           "param_bytes": footprint["param_bytes"], "memory": footprint,
           "strategies": {c.label: _strategy_step(spec, dev, c, inputs, label)
                          for c in candidates if _runs_on(c, dev)}}
    # the slowest rank sets the pace of synchronous training
    pace = torch.tensor([out["step_s"], -out["reader_rows_s"]], dtype=torch.float64)
    dist.all_reduce(pace, op=dist.ReduceOp.MAX)
    out["step_s"], out["reader_rows_s"] = pace[0].item(), -pace[1].item()
    return out


def _peak_growth(dev: Any) -> Any:
    """From now: a function giving the peak growth of this rank's memory (host RSS on CPU,
    the CUDA caching allocator's reserved bytes on a GPU), or None where it cannot be
    measured (no /proc: not Linux)."""
    if dev.type == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats(dev)
        start = torch.cuda.memory_reserved(dev)
        return lambda: max(0, torch.cuda.max_memory_reserved(dev) - start)
    start = rss.rss_bytes()
    if not (start and rss.reset_peak()):
        return lambda: None
    return lambda: max(0, rss.peak_rss_bytes() - start)


def _footprint(spec: TrainSpec, dev: Any, inputs: list[Any], label: Any, runtime: int,
               grown: int | None, local_ranks: int) -> dict[str, Any]:
    """What :func:`sparkddl.perfmodel.memory.predict` needs: the model's parts after a real
    step, the activations at the batch size, the reader's buffers from the plan, the
    measured peak growth of the local steps (the rest of which is temporaries; None where
    it could not be measured), and the memory this host has per rank: what was available
    plus what the calibration's own ranks held, shared by as many ranks as it ran here."""
    from sparkddl.data.reader import queue_depth, reader_threads
    from sparkddl.strategies.fsdp import FullyShardedDataParallel
    from sparkddl.train.feed import AHEAD

    module = build_module(spec.model_factory).to(dev)
    params = list(module.parameters())
    opt = spec.optimizer.build(params, spec.config.learning_rate)
    acts = memory.activation_bytes(lambda: spec.loss(module(*inputs), label), params)
    opt.zero_grad(set_to_none=True)
    spec.loss(module(*inputs), label).backward()
    opt.step()
    plan = spec.plan
    row_bytes = sum(c.nbytes for c in plan.columns)
    group_bytes = max(plan.row_groups, default=0) * row_bytes
    out = {"runtime_bytes": runtime,
           "param_bytes": memory.tensor_bytes(params),
           "model_bytes": memory.tensor_bytes([*params, *module.buffers()]),
           "grad_bytes": memory.tensor_bytes([p for p in params if p.requires_grad]),
           "optimizer_bytes": memory.optimizer_bytes(opt),
           "activation_bytes": acts,
           "step_growth_bytes": grown, "device": dev.type,
           "checkpoint_every": spec.config.checkpoint_every,
           "reader_bytes": reader_threads(plan, 0) * (queue_depth(plan) + 1) * group_bytes
           + (AHEAD + 2) * plan.batch_size * row_bytes,
           # fsdp's units at its default min_params (other values fall back to one unit)
           "fsdp_units": {str(m): memory.unit_bytes(module, m)
                          for m in (FullyShardedDataParallel.OPTIONS["min_params"],)}}
    host = rss.available_bytes()
    out["available_bytes"] = (host + local_ranks * runtime) // max(1, local_ranks) if host else 0
    held = out["param_bytes"] + out["grad_bytes"] + out["optimizer_bytes"] + acts
    out["temporary_bytes"] = max(0, grown - held) if grown is not None else 0
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
        out[size] = _timed(lambda: dist.all_reduce(t))  # noqa: B023 - called right here
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


def _runs_on(cand: Candidate, dev: Any) -> bool:
    """Whether the installed torch runs this strategy on this device (fsdp on CPU needs
    torch >= 2.6); every rank decides alike, so their collectives still pair up."""
    from sparkddl.errors import ConfigError
    try:
        strategies.create(cand.name, cand.options).check_device(dev.type)
    except ConfigError:
        return False
    return True


def _strategy_step(spec: TrainSpec, dev: Any, cand: Candidate, inputs: list[Any],
                   label: Any) -> dict[str, float]:
    """Real steps of one strategy on a fresh replica: time, bytes and calls per step. For
    fsdp, ``bytes`` is the full size of what its all-gathers and reduce-scatters assemble
    (a ring moves (n-1)/n of it per rank, whatever n), not the shards it hands them."""
    import torch
    torch.manual_seed(spec.config.seed)
    module = build_module(spec.model_factory).to(dev)
    strategy = strategies.create(cand.name, cand.options)
    model = strategy.wrap(module)
    opt = spec.optimizer.build(module.parameters(), spec.config.learning_rate)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        strategy.backward(spec.loss(model(*inputs), label))
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
    out = {"step_s": elapsed / cand.steps, "bytes": stats["comm_bytes"] / cand.steps,
           "calls": stats["comm_calls"] / cand.steps}
    if cand.name == "fsdp":
        out["bytes"] = strategy.full_traffic_bytes()  # pyright: ignore[reportAttributeAccessIssue] - FSDP's
    return out
