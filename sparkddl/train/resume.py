"""Checkpoints from the ranks' side: what goes in, and how a rank picks up from one.

Rank 0 writes the model, the optimizer and the position (epochs done, steps into the next
epoch); every rank contributes its own strategy state (error-feedback residuals, counters),
RNG state and partial epoch statistics, gathered to rank 0, so a resumed run continues each
rank exactly where it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkddl import checkpoint
from sparkddl.channel.messages import Checkpoint
from sparkddl.checkpoint.safe import load_plain
from sparkddl.store import Store
from sparkddl.task import context


@dataclass
class Position:
    epoch: int = 1  # the epoch to run (1-based)
    skip_steps: int = 0  # steps of that epoch already done
    global_steps: int = 0


def save(spec: Any, ctx: context.RankContext, run: Any, done_epochs: int,
         steps_into_next: int, global_steps: int, sums: Any) -> None:
    """Collective: every rank calls it; rank 0 writes the file and tells the driver. ``run``
    holds the module, optimizer, strategy and the optional scheduler and grad scaler."""
    import torch

    strategy = run.strategy
    model = strategy.full_state_dict(run.module)  # sharded strategies gather here
    optimizer = strategy.optimizer_state_dict(run.module, run.raw_optimizer)
    mine = {"strategy": strategy.state_dict(), "rng": torch.get_rng_state(),
            "sums": sums.detach().cpu().clone(), "epoch_lr": float(run.epoch_lr)}
    if sums.is_cuda:  # dropout on the GPU draws from the device's generator
        mine["cuda_rng"] = torch.cuda.get_rng_state(sums.device)
    everyone = gather_to_chief(mine, ctx)
    if everyone is None:
        return
    payload = {"epoch": done_epochs, "step": steps_into_next, "global_steps": global_steps,
               "model": {k: v.detach().cpu() for k, v in model.items()},
               "optimizer": optimizer, "ranks": everyone, "seed": spec.config.seed,
               "attempt": ctx.attempt}
    if run.scheduler is not None:
        payload["scheduler"] = run.scheduler.state_dict()
    if run.scaler is not None:
        payload["scaler"] = run.scaler.state_dict()
    store = Store.from_uri(spec.store_root)
    ref = checkpoint.save(store, spec.run_id, done_epochs, steps_into_next, payload,
                          spec.config.keep_checkpoints, fence=spec.fence,
                          protect=spec.resume_url)
    if ctx.channel is not None:
        ctx.channel.post(Checkpoint(done_epochs, steps_into_next, ref.url))


def load(spec: Any, ctx: context.RankContext, module: Any) -> tuple[dict[str, Any], Position]:
    """Load the checkpoint's model into ``module`` (before the strategy wraps it); return the
    checkpoint (for :func:`restore_rest`) and where to continue."""
    store = Store.from_uri(spec.store_root)
    ckpt = checkpoint.decode(store.read_bytes(spec.resume_url), spec.resume_url)
    module.load_state_dict(ckpt["model"])
    pos = Position(epoch=ckpt["epoch"] + 1, skip_steps=ckpt["step"],
                   global_steps=ckpt["global_steps"])
    return ckpt, pos


def restore_rest(ckpt: dict[str, Any], ctx: context.RankContext, run: Any
                 ) -> dict[str, Any] | None:
    """Optimizer, schedule, loss scale and this rank's strategy state; returns this rank's
    saved extras (None for a rank the checkpoint's world did not have)."""
    run.strategy.load_optimizer_state_dict(run.module, run.raw_optimizer, ckpt["optimizer"])
    if run.scheduler is not None and "scheduler" in ckpt:
        run.scheduler.load_state_dict(ckpt["scheduler"])
    if run.scaler is not None and "scaler" in ckpt:
        run.scaler.load_state_dict(ckpt["scaler"])
    if ctx.rank >= len(ckpt["ranks"]):  # an elastic fit grew back: this rank is new
        return None  # its strategy state starts fresh; the checkpoint is at an epoch's end
    mine = ckpt["ranks"][ctx.rank]
    run.strategy.load_state_dict(mine["strategy"])
    return mine


def gather_to_chief(state: dict[str, Any], ctx: context.RankContext) -> list[Any] | None:
    """Every rank's ``state`` on rank 0 (None elsewhere), serialized with ``torch.save`` and
    read back with ``weights_only=True``: bytes from other processes are never unpickled,
    and only rank 0 receives them."""
    import io

    import torch
    import torch.distributed as dist

    buf = io.BytesIO()
    torch.save(state, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(ctx.world_size)]
    with context.collective("gathering checkpoint state on rank 0"):
        dist.all_gather(sizes, torch.tensor([data.numel()]))
        longest = max(int(s.item()) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:data.numel()] = data
        parts = ([torch.zeros(longest, dtype=torch.uint8) for _ in sizes] if ctx.rank == 0
                 else None)
        dist.gather(padded, parts, dst=0)
    if parts is None:
        return None
    return [load_plain(p[:int(n.item())].numpy().tobytes(), f"rank {r}'s checkpoint state")
            for r, (p, n) in enumerate(zip(parts, sizes))]
