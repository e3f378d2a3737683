"""Executor side of a fit: the training loop every rank runs inside its barrier task.

Rank 0 reports to the driver through the channel: progress (rate-limited), one row of
epoch statistics (averaged over all ranks), and model snapshots. The driver may ask to stop;
the ranks agree on it in the same allreduce that sums the epoch statistics, so they all stop
after the same step.
"""
from __future__ import annotations

import io
import logging
import time
from typing import Any

from sparkddl import strategies
from sparkddl.data.reader import epoch_batches
from sparkddl.store import Store
from sparkddl.task import context
from sparkddl.task.dist import device, init_process_group
from sparkddl.train.components import build_module
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)


def train(spec: TrainSpec) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ctx = context.current()
    init_process_group()
    dev = device()
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    module = build_module(spec.model_factory).to(dev)
    strategy = strategies.create(spec.strategy.name, spec.strategy.options)
    model = strategy.wrap(module)
    optimizer = spec.optimizer.build(module.parameters(), spec.learning_rate)
    reporter = _Reporter(ctx, spec)
    steps = 0
    epoch = 0
    stopped = False
    for epoch in range(1, spec.epochs + 1):
        model.train()
        sums = torch.zeros(3 + len(spec.metrics), dtype=torch.float64, device=dev)
        start = time.perf_counter()
        for step, batch in enumerate(epoch_batches(spec.plan, ctx.rank, epoch - 1), 1):
            inputs = [batch[f].to(dev, non_blocking=True) for f in spec.features]
            label = batch[spec.label].to(dev, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            output = model(*inputs)
            loss = spec.loss(output, label)
            loss.backward()
            strategy.step(optimizer)
            n = len(label)
            with torch.no_grad():
                sums[0] += loss.detach().double() * n
                sums[1] += n
                for i, fn in enumerate(spec.metrics.values()):
                    sums[3 + i] += fn(output.detach(), label).double() * n
            steps += 1
            reporter.progress(epoch, step, loss)
        comm = strategy.end_epoch()
        sums[2] = float(ctx.stop_requested.is_set())
        dist.all_reduce(sums)  # control traffic: epoch statistics and the stop vote
        elapsed = time.perf_counter() - start
        count = sums[1].item()
        row = {"epoch": epoch, "train_loss": sums[0].item() / count,
               **{f"train_{k}": sums[3 + i].item() / count for i, k in enumerate(spec.metrics)},
               "samples_per_sec": count / elapsed, "epoch_time_s": elapsed, **comm,
               "attempt": ctx.attempt}
        stopped = sums[2].item() > 0
        last = epoch == spec.epochs or stopped
        reporter.epoch(row)
        if epoch % spec.snapshot_every == 0 or last:
            if last:
                strategy.finalize(module)
            reporter.snapshot(epoch, module.state_dict(), final=last)
        if stopped:
            break
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, steps)
    return {"epochs_done": epoch, "stopped_early": stopped, "steps_per_rank": everyone}


class _Reporter:
    """Rank 0's messages to the driver; other ranks send nothing."""

    def __init__(self, ctx: context.RankContext, spec: TrainSpec):
        self.ctx, self.spec = ctx, spec
        self.active = ctx.is_chief and ctx.channel is not None
        self._next_progress = 0.0

    def progress(self, epoch: int, step: int, loss: Any) -> None:
        now = time.monotonic()
        if not self.active or now < self._next_progress:
            return
        self._next_progress = now + self.spec.progress_interval_s
        self.ctx.channel.send({"type": "progress", "epoch": epoch, "step": step,
                               "steps": self.spec.plan.steps_per_epoch, "loss": loss.item()})

    def epoch(self, row: dict[str, Any]) -> None:
        if self.active:
            self.ctx.channel.send({"type": "epoch", "row": row})

    def snapshot(self, epoch: int, state: dict[str, Any], final: bool) -> None:
        if not self.active:
            return
        import torch
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state.items()}, buf)
        data = buf.getvalue()
        header = {"type": "snapshot", "epoch": epoch, "final": final}
        if len(data) <= self.spec.max_snapshot_bytes:
            self.ctx.channel.send(header, data)
            return
        # large models: through the Store, with only a notice on the channel
        store = Store.from_uri(self.spec.store_root)
        url = store.run_url(self.spec.run_id, "snapshots", f"epoch-{epoch:05d}.pt")
        store.write_bytes(url, data)
        self.ctx.channel.send({**header, "url": url})
