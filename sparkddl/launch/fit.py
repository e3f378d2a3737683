"""Driver side of a fit: check everything, prepare the data, run the ranks, collect the
snapshots, and return the chosen weights with the history."""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from sparkddl import strategies
from sparkddl.channel.server import DriverChannel, Message
from sparkddl.config import TrainConfig
from sparkddl.data import DataSpec, PreparedData, prepare
from sparkddl.data.local import read_rows
from sparkddl.errors import ConfigError, TrainingFailedError
from sparkddl.launch import preflight
from sparkddl.launch.checks import TaskInfo, check_sample
from sparkddl.launch.evaluation import EvaluationResult, SnapshotEvaluator
from sparkddl.launch.pickling import serialize_call
from sparkddl.launch.progress import Progress
from sparkddl.launch.runner import DEFAULT_COLLECTIVE_TIMEOUT_S, new_run_id
from sparkddl.launch.stage import run_stage
from sparkddl.store import Store
from sparkddl.task.spec import TaskSpec
from sparkddl.train.components import (build_module, check_optimizer, model_factory,
                                       optimizer_recipe, resolve_loss)
from sparkddl.train.loop import train
from sparkddl.train.metrics import mode_of, resolve_metrics
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    run_id: str
    model_factory: Callable[[], Any]
    state: dict[str, Any]  # the chosen weights (best or last)
    chosen_epoch: int
    history: list[dict[str, Any]]
    task: TaskInfo
    best_by: str
    epochs_done: int
    stopped_early: bool
    steps_per_rank: list[int]
    fit_time_s: float
    data: PreparedData


def fit(spark: Any, df: Any, model: Any, optimizer: Any, loss: Any, config: TrainConfig
        ) -> FitResult:
    started = time.perf_counter()
    config.validate()
    _check_best_by_early(config)
    sc = spark.sparkContext
    preflight.check_cluster(sc, config.num_workers, config.use_gpu)
    strategies.create(config.strategy.name, config.strategy.options)  # unknown names/options
    factory = model_factory(model)
    module = build_module(factory)
    recipe = optimizer_recipe(optimizer)
    check_optimizer(recipe, module, config.learning_rate)
    loss_fn = resolve_loss(loss)
    store = Store.from_uri(config.store)
    store.check_writable()
    data = prepare(df, DataSpec.of(config.features, config.label, shapes=config.feature_shapes),
                   num_workers=config.num_workers, batch_size=config.batch_size, store=store,
                   validation=config.validation, seed=config.seed)
    task = check_sample(module, loss_fn, read_rows(data.train, limit=8), config.features,
                        config.label, data.label_range(config.label))
    metrics = resolve_metrics(config.metrics if config.metrics is not None else
                              (["accuracy"] if task.kind != "regression" else []))
    best_by = resolve_best_by(config.best_by, metrics, data.val is not None)
    plan = data.train.plan(config.num_workers, config.batch_size, seed=config.seed,
                           shuffle_buffer=config.shuffle_buffer,
                           reader_workers=config.reader_workers, reader_pool=config.reader_pool)
    run_id = new_run_id()
    spec = TrainSpec(run_id=run_id, model_factory=factory, optimizer=recipe, loss=loss_fn,
                     metrics=metrics, plan=plan, features=config.features, label=config.label,
                     epochs=config.epochs, snapshot_every=config.snapshot_every,
                     strategy=config.strategy, seed=config.seed, store_root=store.root,
                     learning_rate=config.learning_rate,
                     max_snapshot_bytes=config.snapshot_channel_bytes)
    payload = serialize_call(train, (spec,), {})
    evaluator = SnapshotEvaluator(factory, loss_fn, metrics,
                                  read_rows(data.val) if data.val is not None else None,
                                  config.features, config.label, best_by, mode_of(best_by),
                                  config.early_stopping_patience, store)
    progress = Progress(config.epochs, plan.steps_per_epoch, enabled=config.progress)
    log.info("fit %s: %d workers x batch %d, %d steps per epoch, %d epochs, strategy %s",
             run_id, config.num_workers, config.batch_size, plan.steps_per_epoch, config.epochs,
             config.strategy.name)

    def make_spec(channel: DriverChannel) -> TaskSpec:
        return TaskSpec(run_id=run_id, payload=payload, num_workers=config.num_workers,
                        channel_host=channel.host, channel_port=channel.port,
                        secret=channel.secret, use_gpu=config.use_gpu,
                        collective_timeout_s=config.timeout_s or DEFAULT_COLLECTIVE_TIMEOUT_S,
                        echo_output=not preflight.is_local_master(sc.master))

    try:
        results = run_stage(sc, make_spec, timeout_s=config.timeout_s,
                            hook=functools.partial(_on_message, evaluator, progress),
                            description=f"sparkddl fit {run_id}")
    finally:
        progress.close()
        evaluated = evaluator.close()
    from pyspark import cloudpickle
    summary = cloudpickle.loads(results[0])
    chosen = _choose(evaluated, config.final_weights, run_id)
    return FitResult(run_id=run_id, model_factory=factory, state=chosen.state,
                     chosen_epoch=chosen.epoch, history=evaluated.history, task=task,
                     best_by=best_by, epochs_done=summary["epochs_done"],
                     stopped_early=summary["stopped_early"],
                     steps_per_rank=summary["steps_per_rank"],
                     fit_time_s=time.perf_counter() - started, data=data)


def _on_message(evaluator: SnapshotEvaluator, progress: Progress, msg: Message) -> None:
    if msg.type == "progress":
        progress.update(msg.header["epoch"], msg.header["step"], msg.header["loss"])
    elif msg.type == "epoch":
        evaluator.record_epoch(msg.header["row"])
        progress.epoch(msg.header["row"])
    elif msg.type == "snapshot":
        evaluator.submit(msg.header, msg.payload, msg.reply)


def _choose(evaluated: EvaluationResult, final_weights: str, run_id: str) -> Any:
    chosen = evaluated.best if final_weights == "best" else evaluated.last
    chosen = chosen or evaluated.last
    if chosen is None:
        detail = "; ".join(evaluated.errors) or "no snapshot arrived"
        raise TrainingFailedError([], reason=f"fit {run_id} finished without a usable snapshot "
                                             f"({detail})")
    return chosen


def _check_best_by_early(config: TrainConfig) -> None:
    """What can be said of bestBy before the data is read (metrics are known later)."""
    if config.best_by is None:
        return
    if not config.best_by.startswith(("train_", "val_")):
        raise ConfigError(f"unknown bestBy {config.best_by!r}; it names train_loss, val_loss or "
                          "train_/val_ followed by a metric name, e.g. val_accuracy")
    if config.best_by.startswith("val_") and not config.validation:
        raise ConfigError(f"bestBy {config.best_by!r} needs validation data; set validation "
                          "(a fraction or a column) or use a train_ metric")


def resolve_best_by(best_by: str | None, metrics: dict[str, Any], has_val: bool) -> str:
    prefixes = ["train_"] + (["val_"] if has_val else [])
    valid = [p + m for p in prefixes for m in ["loss", *metrics]]
    chosen = best_by or ("val_loss" if has_val else "train_loss")
    if chosen not in valid:
        hint = " (val_* needs validation data: set validation)" if chosen.startswith("val_") \
            and not has_val else ""
        raise ConfigError(f"unknown bestBy {chosen!r}{hint}; choose one of {', '.join(valid)}")
    return chosen
