"""evaluation="cluster": each snapshot evaluated by a Spark job beside the fit, on executor
slots the barrier stage does not hold, so that the ranks never pause for it and the driver
does no per-row work.

The job has one task per part of the validation split (its rows shared out as to ranks, by
row ranges: :func:`sparkddl.data.plan.shard_pieces`); each task builds the model, loads the
snapshot, streams its
part in batches and returns what :func:`sparkddl.train.evaluate.accumulate` gives (the sums
and the exact metrics' torchmetrics states), which the driver merges and finishes: the
metrics are those the driver or the ranks compute on the same split. The job is a
DataFrame job (``spark.range(parts).mapInArrow``), so it runs on classic sessions and on
Spark Connect alike, in the fit's job group and tags.
"""
from __future__ import annotations

import io
import logging
import pickle
from typing import Any, Callable, Iterator

from sparkddl.data import Dataset
from sparkddl.errors import ConfigError
from sparkddl.launch.jobs import CallerScope

log = logging.getLogger(__name__)

MAX_PARTS = 64  # tasks per evaluation job at most: each builds the model once


def free_slots(sc: Any, num_workers: int) -> int | None:
    """Task slots the barrier stage of ``num_workers`` leaves free, or None where the client
    cannot count them."""
    slots = sc.task_slots()
    if slots is None:
        slots = sc.named_slots()
    return None if slots is None else slots - num_workers


def check_free_slots(sc: Any, num_workers: int) -> int | None:
    """The slots free beside the fit's ranks; a ConfigError where there are none (checked
    before the data is prepared)."""
    free = free_slots(sc, num_workers)
    if free is not None and free < 1:
        raise ConfigError(
            f"evaluation='cluster' needs executor slots the fit's {num_workers} ranks do not "
            f"hold, and the cluster has {free + num_workers}; add executors (or cores), lower "
            "numWorkers, or use evaluation='ranks' or 'driver'")
    return free


def cluster_parts(sc: Any, num_workers: int, val: Dataset) -> int:
    """How many tasks evaluate each snapshot: one per free slot (parts share the split's
    rows, whatever its row groups)."""
    free = check_free_slots(sc, num_workers)
    return max(1, min(free if free is not None else 1, val.rows, MAX_PARTS))


class ClusterEvaluator:
    """Called by the driver's evaluator thread with each snapshot's weights; returns the
    metrics. ``scope`` and ``tag``: the fit's job group and tags, carried onto the job."""

    def __init__(self, spark: Any, sc: Any, factory: Callable[[], Any], step: Any,
                 metrics: dict[str, Any], val: Dataset, transform: Any, shapes: Any,
                 parts: int, scope: CallerScope, tag: str):
        self.spark, self.sc, self.parts, self.scope, self.tag = spark, sc, parts, scope, tag
        self.metrics = metrics
        self.fixed = (factory, step, metrics, val, transform, shapes)

    def __call__(self, state: dict[str, Any], epoch: int) -> dict[str, float]:
        import torch

        from sparkddl.train.evaluate import finish, merge_parts
        buf = io.BytesIO()
        torch.save(state, buf)
        fixed, weights, parts = self.fixed, buf.getvalue(), self.parts

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa
            for batch in batches:
                for part in batch.column(0).to_pylist():
                    out = evaluate_part(fixed, weights, part, parts, epoch)
                    yield pa.record_batch([pa.array([part]), pa.array([out], pa.binary())],
                                          names=["part", "state"])

        self.scope.enter(self.sc, self.tag, f"sparkddl: evaluating the snapshot of epoch {epoch}")
        try:
            rows = (self.spark.range(parts, numPartitions=parts)
                    .mapInArrow(run, "part long, state binary").collect())
        finally:
            self.scope.leave(self.sc, self.tag)
        got = sorted((r["part"], r["state"]) for r in rows)
        if [p for p, _ in got] != list(range(parts)):
            raise RuntimeError(f"the evaluation job of epoch {epoch} returned parts "
                               f"{[p for p, _ in got]} of {parts}")
        sums, exact = merge_parts([pickle.loads(s) for _, s in got])
        return finish(sums, exact, self.metrics)


def evaluate_part(fixed: tuple[Any, ...], weights: bytes, part: int, parts: int,
                  epoch: int) -> bytes:
    """In a task: the sums and exact metrics' states of the snapshot over part ``part`` of
    ``parts`` of the validation split, pickled."""
    import torch

    from sparkddl.checkpoint.safe import load_plain
    from sparkddl.data.local import validation_batches
    from sparkddl.train.components import build_module
    from sparkddl.train.evaluate import EVAL_BATCH, accumulate

    factory, step, metrics, val, transform, shapes = fixed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a task holds one slot (the Python worker may be reused)
    try:
        module = build_module(factory)
        module.load_state_dict(load_plain(weights, f"the snapshot of epoch {epoch}",
                                          map_location="cpu"))
        batches = validation_batches(val, transform, shapes,
                                     f"evaluation task {part} of epoch {epoch}", part, parts,
                                     EVAL_BATCH)
        return pickle.dumps(accumulate(module, step, metrics, batches))
    finally:
        torch.set_num_threads(threads)
