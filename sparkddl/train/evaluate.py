"""Evaluating a snapshot over a validation split: the same computation on the driver (the
whole split, streamed), on the ranks (each rank its share of the split's row groups, the
sums and torchmetrics states merged over the ranks) and in a Spark job beside the fit (each
task a share, merged on the driver), so every metric is the same whichever computed it, up
to the order of floating-point additions."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from sparkddl.train.metrics import ExactMetric, per_batch
from sparkddl.train.steps import LossFn

EVAL_BATCH = 1024  # rows per forward pass
# evaluation="auto" evaluates on the ranks from this many validation rows (and where every
# rank gets a row group of the split); smaller splits are evaluated on the driver
RANKS_FROM_ROWS = 1_000_000


def evaluate(module: Any, step: LossFn, metrics: dict[str, Any], batches: Iterable[Any],
             merge: Callable[[Any], Any] | None = None) -> dict[str, float]:
    """``val_loss`` and ``val_<metric>`` of ``module`` over ``batches`` (dicts of tensors):
    row means (per-batch values weighted by their rows) and exact metrics from torchmetrics
    states over every row. ``merge`` sums a float64 tensor over the ranks (an allreduce);
    with it, the exact metrics' states are gathered over the ranks as they compute."""
    sums, exact = accumulate(module, step, metrics, batches)
    return finish(merge(sums) if merge is not None else sums, exact, metrics)


def accumulate(module: Any, step: LossFn, metrics: dict[str, Any], batches: Iterable[Any]
               ) -> tuple[Any, dict[str, Any]]:
    """What :func:`finish` turns into metrics, over ``batches``: the sums (rows, loss, each
    row-mean metric times rows; float64) and the exact metrics' torchmetrics objects.
    Parts of a split accumulated apart merge exactly (:func:`merge_parts`)."""
    import torch

    module.eval()
    means = per_batch(metrics)
    exact = {k: m.make() for k, m in metrics.items() if isinstance(m, ExactMetric)}
    sums = torch.zeros(2 + len(means), dtype=torch.float64)  # rows, loss, row-mean metrics
    with torch.no_grad():
        for batch in batches:
            loss, output, target = step(module, batch)
            n = len(batch[step.labels[0]])
            sums[0] += n
            sums[1] += float(loss) * n
            for i, fn in enumerate(means.values()):
                sums[2 + i] += float(fn(output, target)) * n
            for k, state in exact.items():  # whole-set state, not a mean of batches
                state.update(*metrics[k].inputs(output, target))
    return sums, exact


def merge_parts(parts: list[tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]]:
    """The sums and exact metrics' states of several parts of a split as one."""
    sums, exact = parts[0]
    for more, states in parts[1:]:
        sums = sums + more
        for k, state in exact.items():
            state.merge_state(states[k])
    return sums, exact


def finish(sums: Any, exact: dict[str, Any], metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics of :func:`accumulate`'s (merged) sums and states."""
    means = per_batch(metrics)
    rows = float(sums[0])
    out = {"val_loss": float(sums[1]) / max(rows, 1.0)}
    out.update({f"val_{k}": float(sums[2 + i]) / max(rows, 1.0)
                for i, k in enumerate(means)})
    for k, state in exact.items():  # on the ranks, compute() gathers every rank's state
        out[f"val_{k}"] = float(state.compute()) if rows else float("nan")
    return {"val_loss": out["val_loss"], **{f"val_{k}": out[f"val_{k}"] for k in metrics}}


class RankEvaluator:
    """On a rank (evaluation="ranks"): evaluates each snapshot on this rank's share of the
    validation split, a model of its own loaded with the snapshot's weights (training is
    untouched), the sums allreduced and the exact metrics' states gathered over the ranks.
    Every rank calls :meth:`__call__` with the same snapshot: it is collective."""

    def __init__(self, spec: Any, dev: Any, rank: int, world: int):
        self.spec, self.dev, self.rank, self.world = spec, dev, rank, world
        self.module: Any = None

    def __call__(self, state: dict[str, Any], epoch: int) -> dict[str, float]:
        import torch

        from sparkddl.data.local import validation_batches
        from sparkddl.train.components import build_module
        spec = self.spec
        if self.module is None:  # built once, without touching training's random state
            with torch.random.fork_rng(devices=[]):
                self.module = build_module(spec.model_factory).to(self.dev)
        started = time.perf_counter()
        self.module.load_state_dict(state)
        where = f"rank {self.rank}, epoch {epoch}"
        batches = ({k: v.to(self.dev) for k, v in b.items()} for b in validation_batches(
            spec.val, spec.plan.transform, spec.plan.transform_shapes, where, self.rank,
            self.world, EVAL_BATCH))
        out = evaluate(self.module, spec.loss_fn(), spec.eval_metrics, batches, _allreduce)
        return {**out, "val_time_s": time.perf_counter() - started}  # rank 0's, as sent


def _allreduce(sums: Any) -> Any:
    import torch.distributed as dist

    from sparkddl.task import context
    with context.collective("the validation metrics allreduce"):
        dist.all_reduce(sums)
    return sums
