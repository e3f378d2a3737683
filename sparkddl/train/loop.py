"""Executor side of a fit: the training loop every rank runs inside its barrier task.

Rank 0 reports to the driver through the channel: progress (rate-limited), one row of
epoch statistics (averaged over all ranks), model snapshots and checkpoints. Every rank keeps
its position in the context's status, which its heartbeats carry to the driver's watchdog.
The driver may ask to stop; the ranks agree on it in the same allreduce that sums the epoch
statistics, so they all stop after the same step.
"""
from __future__ import annotations

import contextlib
import io
import logging
import time
from typing import Any

from sparkddl import checkpoint, strategies
from sparkddl.channel import protocol
from sparkddl.channel.messages import Epoch, Progress, Snapshot
from sparkddl.data.reader import epoch_batches
from sparkddl.errors import NonFiniteLossError
from sparkddl.store import Store
from sparkddl.task import context, rss
from sparkddl.task.dist import device, init_process_group
from sparkddl.train import optimization, resume
from sparkddl.train.components import build_module
from sparkddl.train.evaluate import RankEvaluator
from sparkddl.train.feed import DeviceFeed
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)

# rank 0's vote in the epoch statistics: stop (early stopping, a callback) or stop to be
# relaunched on more ranks
STOP, REGROW = 1.0, 2.0


class _Run:
    """The state of one rank's training: model, optimizer, strategy, position."""

    def __init__(self, spec: TrainSpec):
        import torch
        self.spec, self.ctx = spec, context.current()
        cfg = spec.config
        rss.reset_peak()  # a reused Python worker's peak is an earlier task's
        init_process_group()
        self.dev = device()
        self.pos = resume.Position()
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.mark("building the model")  # the user's code: the watchdog's own limit applies
        self.module = build_module(spec.model_factory)
        self.mark("loading the checkpoint", starting=True)
        ckpt, self.pos = (resume.load(spec, self.ctx, self.module) if spec.resume_url
                          else (None, self.pos))
        self.module.to(self.dev)
        for cls in spec.strategies.values():  # the driver's own (a notebook's class, say)
            strategies.register(cls)
        self.strategy = strategies.create(cfg.strategy, cfg.strategy_options)
        self.mark("wrapping the model for its strategy", starting=True)
        self.model = self.strategy.wrap(self.module)
        self.raw_optimizer = spec.optimizer.build(self.module.parameters(), cfg.learning_rate)
        self.scaler = optimization.scaler(cfg.precision)
        self.optimizer = optimization.OptimizerStep(
            self.raw_optimizer, self.strategy, [p for p in self.module.parameters()
                                                if p.requires_grad],
            cfg.gradient_clip_norm, cfg.gradient_clip_value, self.scaler)
        self.passes = cfg.backward_passes_per_step
        self.scheduler = spec.scheduler.build(
            self.raw_optimizer, cfg.epochs,
            optimization.optimizer_steps(spec.plan.steps_per_epoch, self.passes)) \
            if spec.scheduler else None
        self.saved = resume.restore_rest(ckpt, self.ctx, self) if ckpt else None
        self.loss_fn = spec.loss_fn()
        self.loss_phase = lambda: self.mark("computing the loss")
        self.reporter = _Reporter(self.ctx, spec)
        self.evaluate = RankEvaluator(spec, self.dev, self.ctx.rank, self.ctx.world_size) \
            if spec.val is not None else None
        self.last_loss: Any = None
        self.epoch_lr = 0.0  # the learning rate as the current epoch started
        self.skipped = 0  # batches skipped for a non-finite loss, this epoch
        self.first_bad: Any = None  # CUDA: (epoch, step) code of the first non-finite loss
        self.mark("starting", starting=True)

    def mark(self, phase: str, epoch: int | None = None, step: int | None = None,
             starting: bool = False) -> None:
        """Record where this rank is, for heartbeats and failure reports. ``starting``: the
        library's own setup (first-time imports, process group and DDP construction), which
        a loaded machine may take seconds over; the watchdog gives it its start limit."""
        status = self.ctx.status
        status.update(phase=phase, steps=self.pos.global_steps, starting=starting)
        if epoch is not None:
            status["epoch"] = epoch
        if step is not None:
            status["step"] = step

    def checkpoint(self, done_epochs: int, steps_into_next: int, sums: Any) -> None:
        self.mark("writing a checkpoint")
        resume.save(self.spec, self.ctx, self, done_epochs, steps_into_next,
                    self.pos.global_steps, sums)


def train(spec: TrainSpec) -> dict[str, Any]:
    from sparkddl.data.epoch_cache import drop_epoch_caches
    try:
        return _train(spec)
    finally:  # the epoch cache's memory: Spark's next task in this Python worker is another
        drop_epoch_caches()


def _train(spec: TrainSpec) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    run = _Run(spec)
    stopped, regrow, epoch = False, False, run.pos.epoch - 1
    for epoch in range(run.pos.epoch, spec.config.epochs + 1):
        row, vote = _epoch(run, epoch)
        stopped, regrow = vote == STOP, vote == REGROW and epoch < spec.config.epochs
        last = epoch == spec.config.epochs or stopped
        run.reporter.epoch(row)
        if epoch % spec.config.snapshot_every == 0 or last:
            if last:
                run.strategy.finalize(run.module)
                state = run.strategy.full_state_dict(run.module)
            else:  # replicas that may differ are averaged (on copies) for the snapshot
                state = run.strategy.snapshot_state(run.module)
            metrics = run.evaluate(state, epoch) if run.evaluate is not None else None
            run.reporter.snapshot(epoch, state, final=last, metrics=metrics)
        every = spec.config.checkpoint_every
        if regrow or (every and epoch % every == 0 and not last):
            run.checkpoint(epoch, 0, _zeros(run))
        if stopped or regrow:
            break
    run.mark("gathering step counts")
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(run.ctx.world_size)]
    with context.collective("the final step-count gather"):
        dist.all_gather(steps, torch.tensor([run.pos.global_steps]))
    return {"epochs_done": epoch, "stopped_early": stopped, "regrow": regrow,
            "steps_per_rank": [int(t.item()) for t in steps]}


def _zeros(run: _Run) -> Any:
    import torch
    return torch.zeros(3 + len(run.spec.metrics), dtype=torch.float64, device=run.dev)


def _epoch(run: _Run, epoch: int) -> tuple[dict[str, Any], bool]:
    """Train one epoch (or what is left of it after a resume); the rank-averaged row."""
    import torch
    import torch.distributed as dist

    spec, ctx = run.spec, run.ctx
    sums, skip = _zeros(run), 0
    if run.saved is not None and epoch == run.pos.epoch:  # resuming inside this epoch
        sums, skip = run.saved["sums"].to(run.dev), run.pos.skip_steps
    torch.manual_seed(hash((spec.config.seed, epoch, ctx.rank)) % (2**63))  # dropout etc.
    if run.saved is not None and epoch == run.pos.epoch and skip:
        torch.set_rng_state(run.saved["rng"])
        if "cuda_rng" in run.saved and run.dev.type == "cuda":
            torch.cuda.set_rng_state(run.saved["cuda_rng"], run.dev)
    lr = run.raw_optimizer.param_groups[0]["lr"]  # as the epoch starts
    if run.saved is not None and epoch == run.pos.epoch and skip:
        lr = run.saved.get("epoch_lr", lr)  # resumed inside the epoch: as it started
    run.epoch_lr = lr
    run.skipped, checkpoint_due = 0, False
    start = time.perf_counter()
    run.mark("reading data", epoch, 0)
    # closed on every path: a failing step must not leave reader threads behind
    # on a GPU the next batches are copied to it while this one computes (pinned ring, side
    # stream); on the CPU the reader's batches pass through
    with contextlib.closing(DeviceFeed(epoch_batches(spec.plan, ctx.rank, epoch - 1),
                                       run.dev)) as batches:
        for step, batch in enumerate(batches, 1):
            if step <= skip:
                run.mark("skipping steps done before the restart", epoch, step)
                continue  # the order is the same as before the restart, so skip them
            run.mark("forward pass", epoch, step)
            boundary = _step(run, batch, sums, epoch, step)
            run.pos.global_steps += 1
            run.mark("reading data")
            if run.reporter.progress(epoch, step, run.last_loss):
                _check_deferred(run)
            every = spec.config.checkpoint_every_steps
            checkpoint_due |= bool(every) and run.pos.global_steps % every == 0
            # only where no gradients are being accumulated: a checkpoint holds none
            if checkpoint_due and boundary and step < spec.plan.steps_per_epoch:
                run.checkpoint(epoch - 1, step, sums)
                checkpoint_due = False
    _check_deferred(run)
    run.mark("exchanging epoch statistics")
    comm = run.strategy.end_epoch()
    # only rank 0 hears the driver: its vote, summed, tells every rank (early stopping wins)
    sums[2] = STOP if ctx.stop_requested.is_set() else \
        REGROW if ctx.regrow_requested.is_set() else 0.0
    with context.collective("the epoch statistics allreduce"):
        dist.all_reduce(sums)  # control traffic: epoch statistics and the stop vote
    if run.scheduler is not None and spec.config.lr_scheduler_interval == "epoch":
        run.scheduler.step()
    elapsed = time.perf_counter() - start
    count = max(sums[1].item(), 1.0)
    row = {"epoch": epoch, "train_loss": sums[0].item() / count,
           **{f"train_{k}": sums[3 + i].item() / count for i, k in enumerate(spec.metrics)},
           "lr": lr,
           "samples_per_sec": sums[1].item() * (1 - skip / spec.plan.steps_per_epoch) / elapsed,
           "epoch_time_s": elapsed, "data_wait_s": batches.wait_s, **comm, "attempt": ctx.attempt,
           # the epoch's rows (over all its attempts) and those its last partial batches left
           "rows_trained": spec.plan.rows_per_epoch, "rows_skipped": spec.plan.rows_skipped,
           "world_size": ctx.world_size,
           "peak_rss_MB": rss.peak_rss_bytes() / 1e6}
    if spec.config.on_non_finite_loss == "skip_batch":
        row["skipped_batches"] = run.skipped
    return row, sums[2].item()


def _step(run: _Run, batch: dict[str, Any], sums: Any, epoch: int, step: int) -> bool:
    """One micro-batch: forward, loss, backward; the optimizer step (with the strategy's
    synchronization) after the last micro-batch of each accumulation window. Returns True
    at the end of a window."""
    import torch
    spec, cfg = run.spec, run.spec.config
    steps = spec.plan.steps_per_epoch
    first = (step - 1) // run.passes * run.passes + 1  # the window's first step
    window = min(run.passes, steps - first + 1)  # micro-batches in it (fewer at the end)
    last = step == first + window - 1
    batch = {k: v.to(run.dev, non_blocking=True) for k, v in batch.items()}
    if step == first:
        run.optimizer.zero_grad(set_to_none=True)
    with contextlib.nullcontext() if last else run.strategy.no_sync():
        with optimization.autocast(cfg.precision, run.dev):
            loss, output, target = run.loss_fn(run.model, batch, run.loss_phase)
        skip = _non_finite(run, loss, epoch, step)
        run.mark("backward pass")
        scaled = _nothing(run) if skip else loss / window
        if run.scaler is not None:
            scaled = run.scaler.scale(scaled)
        run.strategy.backward(scaled)
    if last:
        run.mark("optimizer step (and the strategy's synchronization)")
        run.strategy.step(run.optimizer)
        if run.scheduler is not None and cfg.lr_scheduler_interval == "step":
            run.scheduler.step()
    if skip:
        return last
    n = len(batch[spec.config.labels[0]]) if output is None else len(target)
    with torch.no_grad():
        sums[0] += loss.detach().double() * n
        sums[1] += n
        for i, fn in enumerate(spec.metrics.values()):
            sums[3 + i] += fn(output.detach().float(), target).double() * n  # pyright: ignore[reportOptionalMemberAccess]
    run.last_loss = loss
    return last


def _nothing(run: _Run) -> Any:
    """A zero loss that touches every parameter: a skipped batch's backward still runs the
    strategy's gradient hooks (DDP's allreduce) in step with the other ranks, adding zero."""
    return sum((p * 0).sum() for p in run.module.parameters() if p.requires_grad)


def _non_finite(run: _Run, loss: Any, epoch: int, step: int) -> bool:
    """Whether every rank skips this batch (skip_batch: the ranks agree in one small
    allreduce); with raise, a NaN/inf loss raises here on the CPU, and on a GPU at the next
    check (no host sync per step), naming where it first happened."""
    import torch
    import torch.distributed as dist
    if run.spec.config.on_non_finite_loss == "skip_batch":
        flags = torch.zeros(run.ctx.world_size, device=run.dev)
        flags[run.ctx.rank] = (~torch.isfinite(loss.detach())).float()
        with context.collective("agreeing on a non-finite loss"):
            dist.all_reduce(flags)
        bad = [r for r, f in enumerate(flags.tolist()) if f]
        if bad:
            run.skipped += 1
            log.warning("epoch %d step %d: non-finite loss on rank(s) %s; every rank skips "
                        "the batch", epoch, step, bad)
        return bool(bad)
    if run.dev.type != "cuda":
        if not torch.isfinite(loss.detach()):
            _raise_non_finite(run, float(loss.detach()), epoch, step)
        return False
    # fills, not copies: nothing here waits for the GPU
    code = torch.full((), epoch * 10**9 + step, dtype=torch.int64, device=run.dev)
    first = run.first_bad if run.first_bad is not None else \
        torch.full((), -1, dtype=torch.int64, device=run.dev)
    run.first_bad = torch.where((first < 0) & ~torch.isfinite(loss.detach()), code, first)
    return False


def _check_deferred(run: _Run) -> None:
    if run.first_bad is not None and int(run.first_bad) >= 0:
        epoch, step = divmod(int(run.first_bad), 10**9)
        _raise_non_finite(run, float("nan"), epoch, step)


def _raise_non_finite(run: _Run, value: float, epoch: int, step: int) -> None:
    raise NonFiniteLossError(
        f"non-finite loss ({value}) at epoch {epoch}, step {step} on rank {run.ctx.rank}. "
        "Check the features for NaN/inf (the driver samples only a few rows), lower the "
        "learning rate or clip gradients (gradientClipNorm); onNonFiniteLoss='skip_batch' "
        "skips such batches instead")


class _Reporter:
    """Rank 0's messages to the driver; other ranks send nothing."""

    def __init__(self, ctx: context.RankContext, spec: TrainSpec):
        self.ctx, self.spec = ctx, spec
        self.active = ctx.is_chief and ctx.channel is not None
        self._next_progress = 0.0

    def progress(self, epoch: int, step: int, loss: Any) -> bool:
        """Report (rank 0, rate-limited); True when it is time for the periodic checks."""
        now = time.monotonic()
        if now < self._next_progress:
            return False
        self._next_progress = now + self.spec.progress_interval_s
        if self.active and loss is not None:
            self.ctx.channel.post(Progress(epoch, step, self.spec.plan.steps_per_epoch,  # pyright: ignore[reportOptionalMemberAccess]
                                           loss.item()))
        return True

    def epoch(self, row: dict[str, Any]) -> None:
        if self.active:
            self.ctx.channel.post(Epoch(row))  # pyright: ignore[reportOptionalMemberAccess]

    def snapshot(self, epoch: int, state: dict[str, Any], final: bool,
                 metrics: dict[str, float] | None = None) -> None:
        if not self.active:
            return
        import torch
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state.items()}, buf)
        data = buf.getvalue()
        self.ctx.status["phase"] = "sending a snapshot to the driver"
        offline = getattr(self.ctx.channel, "offline", False)  # kept until the task ends
        if not offline and len(data) <= min(self.spec.config.snapshot_channel_bytes,
                                            protocol.DEFAULT_MAX_PAYLOAD_BYTES):
            self.ctx.channel.post(Snapshot(epoch, final, metrics=metrics), data)  # pyright: ignore[reportOptionalMemberAccess]
            return
        # large models: through the Store, with only a notice on the channel
        store = Store.from_uri(self.spec.store_root)
        # per attempt, and only by the current one: a cancelled attempt's rank still running
        # must not replace what the driver is about to read
        url = store.run_url(self.spec.run_id, "snapshots",
                            f"epoch-{epoch:05d}-attempt-{self.ctx.attempt}.pt")
        checkpoint.check_fence(store, self.spec.run_id, self.spec.fence)
        store.write_bytes(url, data)
        self.ctx.channel.post(Snapshot(epoch, final, url, metrics))  # pyright: ignore[reportOptionalMemberAccess]
