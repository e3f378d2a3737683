"""Driver side of a fit: check everything, prepare the data, run the ranks (relaunching them
from the last good checkpoint after a failure), collect the snapshots, and return the
chosen weights with the history."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkddl import checkpoint, strategies
from sparkddl.channel.server import Message
from sparkddl.config import TrainConfig
from sparkddl.data import DataSpec, PreparedData, prepare
from sparkddl.data.local import read_rows
from sparkddl.errors import ClusterError, ConfigError, TrainingFailedError
from sparkddl.launch import preflight
from sparkddl.launch.checks import TaskInfo, check_sample
from sparkddl.launch.evaluation import EvaluationResult, SnapshotEvaluator
from sparkddl.launch.pickling import serialize_call
from sparkddl.launch.progress import Progress
from sparkddl.launch.runner import new_run_id, spec_factory
from sparkddl.launch.stage import run_stage
from sparkddl.store import Store
from sparkddl.train.components import (build_module, check_optimizer, model_factory,
                                       optimizer_recipe, resolve_loss)
from sparkddl.train.loop import train
from sparkddl.train.metrics import best_mode, resolve_metrics
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)


@dataclass
class Restart:
    """One failed attempt and how the next one picked up."""

    attempt: int  # the attempt that failed
    reason: str
    resumed_from_epoch: int  # epochs done in the checkpoint resumed from (0: from scratch)
    resumed_from_step: int
    steps_redone: int  # steps (per rank) the failed attempt did after that checkpoint
    failed_at: float  # time.monotonic() when the failure was raised on the driver
    resumed_at: float | None = None  # when the next attempt's first training step reported

    @property
    def recovery_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.failed_at


class _Dispatch:
    """Routes rank messages to the evaluator and the progress display; notes when training
    resumes after a restart and how far the failed attempt had got."""

    def __init__(self, evaluator: SnapshotEvaluator, progress: Progress):
        self.evaluator, self.progress = evaluator, progress
        self.steps = 0  # rank 0's latest global step count
        self.pending: Restart | None = None

    def __call__(self, msg: Message) -> None:
        h = msg.header
        if msg.type == "progress":
            if self.pending is not None:
                self.pending.resumed_at, self.pending = time.monotonic(), None
            self.progress.update(h["epoch"], h["step"], h["loss"])
        elif msg.type == "heartbeat" and msg.rank == 0:
            self.steps = int(h.get("steps") or 0)
        elif msg.type == "epoch":
            self.evaluator.record_epoch(h["row"])
            self.progress.epoch(h["row"])
        elif msg.type == "snapshot":
            self.evaluator.submit(h, msg.payload, msg.reply)
        elif msg.type == "checkpoint":
            self.evaluator.checkpointed(int(h["epoch"]))


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
    restarts: list[Restart] = field(default_factory=list)
    # snapshots the driver could not evaluate (the weights were chosen among the others)
    evaluation_errors: list[str] = field(default_factory=list)


def fit(spark: Any, df: Any, model: Any, optimizer: Any, loss: Any, config: TrainConfig
        ) -> FitResult:
    started = time.perf_counter()
    config.validate()
    _check_best_by_early(config)
    sc = spark.sparkContext
    preflight.check_cluster(sc, config.num_workers, config.use_gpu)
    strategies.create(config.strategy, config.strategy_options)  # unknown names/options
    factory, recipe, loss_fn, store, data, task, metrics, best_by = _prepare(
        df, model, optimizer, loss, config)
    run_id = config.run_id or new_run_id()
    plan = data.train.plan(config.num_workers, config.batch_size, seed=config.seed,
                           shuffle_buffer=config.shuffle_buffer,
                           reader_workers=config.reader_workers, reader_pool=config.reader_pool,
                           reader=config.reader)
    _record_run(store, run_id, data, config, plan.steps_per_epoch)
    spec = TrainSpec(run_id=run_id, model_factory=factory, optimizer=recipe, loss=loss_fn,
                     metrics=metrics, plan=plan, features=config.features, label=config.label,
                     epochs=config.epochs, snapshot_every=config.snapshot_every,
                     strategy=config.strategy_config, seed=config.seed, store_root=store.root,
                     learning_rate=config.learning_rate,
                     max_snapshot_bytes=config.snapshot_channel_bytes,
                     checkpoint_every=config.checkpoint_every,
                     checkpoint_every_steps=config.checkpoint_every_steps,
                     keep_checkpoints=config.keep_checkpoints)
    evaluator = SnapshotEvaluator(factory, loss_fn, metrics,
                                  read_rows(data.val) if data.val is not None else None,
                                  config.features, config.label, best_by,
                                  best_mode(best_by, config.best_mode),
                                  config.early_stopping_patience, store, run_id)
    progress = Progress(config.epochs, plan.steps_per_epoch, enabled=config.progress,
                        samples_per_step=config.batch_size * config.num_workers)
    log.info("fit %s: %d workers x batch %d, %d steps per epoch, %d epochs, strategy %s",
             run_id, config.num_workers, config.batch_size, plan.steps_per_epoch, config.epochs,
             config.strategy)
    try:
        summary, restarts = _attempts(sc, spec, config, store, evaluator, progress, started)
    finally:
        progress.close()
        evaluated = evaluator.close()
        _write_history(store, run_id, evaluated.history)
    if evaluated.errors:
        log.warning("fit %s: %d snapshot(s) could not be evaluated on the driver: %s", run_id,
                    len(evaluated.errors), "; ".join(evaluated.errors))
    chosen = _choose(evaluated, config.final_weights, run_id)
    return FitResult(run_id=run_id, model_factory=factory, state=chosen.state,
                     chosen_epoch=chosen.epoch, history=evaluated.history, task=task,
                     best_by=best_by, epochs_done=summary["epochs_done"],
                     stopped_early=summary["stopped_early"],
                     steps_per_rank=summary["steps_per_rank"],
                     fit_time_s=time.perf_counter() - started, data=data, restarts=restarts,
                     evaluation_errors=evaluated.errors)


def _prepare(df: Any, model: Any, optimizer: Any, loss: Any, config: TrainConfig) -> tuple:
    """Everything checked on the driver before launching: the components, the data (prepared
    and sampled), what the model predicts, the metrics and the best-snapshot metric."""
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
    return factory, recipe, loss_fn, store, data, task, metrics, best_by


def _attempts(sc: Any, spec: TrainSpec, config: TrainConfig, store: Store,
              evaluator: SnapshotEvaluator, progress: Progress, started: float
              ) -> tuple[dict[str, Any], list[Restart]]:
    """Launch the ranks; after a failure, relaunch from the last good checkpoint (or from the
    start), up to ``max_restarts`` times, within what is left of ``timeout_s``. A failure on
    every attempt ends with one error naming them all."""
    from pyspark import cloudpickle

    restarts: list[Restart] = []
    hook = _Dispatch(evaluator, progress)
    for attempt in range(config.max_restarts + 1):
        ref = checkpoint.latest_good(store, spec.run_id)
        if ref is not None or attempt > 0:  # forget what a failed attempt did after it
            evaluator.rewind(ref.epoch if ref else 0)
        if ref is not None:
            log.info("attempt %d resumes run %s from %s (epoch %d done, step %d)", attempt,
                     spec.run_id, ref.url, ref.epoch, ref.step)
        hook.steps = ref.epoch * spec.plan.steps_per_epoch + ref.step if ref else 0
        payload = serialize_call(train, (dataclasses.replace(
            spec, resume_url=ref.url if ref else None),), {})
        remaining = _remaining(config.timeout_s, started)
        try:
            results = run_stage(
                sc, spec_factory(sc, spec.run_id, payload, config.num_workers,
                                 use_gpu=config.use_gpu, timeout_s=remaining, attempt=attempt),
                timeout_s=remaining, hook=hook, watchdog_s=config.watchdog_s,
                description=f"sparkddl fit {spec.run_id} attempt {attempt}")
            return cloudpickle.loads(results[0]), restarts
        except TrainingFailedError as exc:
            if attempt == config.max_restarts or _remaining(config.timeout_s, started) == 0:
                raise TrainingFailedError(
                    exc.failures, exc.spark_error, attempts=attempt + 1,
                    reason=exc.reason if attempt == 0 else
                    f"{exc.reason} (failed on every one of {attempt + 1} attempts; the last "
                    "failure is shown)") from exc
            restarts.append(_restart(attempt, exc, store, spec, hook))
            hook.pending = restarts[-1]
            _wait_for_slots(sc, config, started)
    raise AssertionError("unreachable")


RELAUNCH_SLOT_WAIT_S = 120.0


def _wait_for_slots(sc: Any, config: TrainConfig, started: float) -> None:
    """A lost executor is replaced by the cluster manager: wait for its slots before the
    relaunch (Spark rechecks a barrier stage's slots only every 15 s). If they do not come in
    time, relaunch anyway: Spark keeps waiting for them itself, and the attempt still counts."""
    remaining = _remaining(config.timeout_s, started)
    wait_s = RELAUNCH_SLOT_WAIT_S if remaining is None else min(remaining, RELAUNCH_SLOT_WAIT_S)
    try:
        preflight.check_slots(sc, config.num_workers, wait_s=wait_s)
    except ClusterError as exc:
        log.warning("relaunching although %s", exc)


def _remaining(timeout_s: float | None, started: float) -> float | None:
    """What is left of the fit's time limit (None: no limit; 0: nothing left)."""
    if timeout_s is None:
        return None
    return max(timeout_s - (time.perf_counter() - started), 0.0)


def _restart(attempt: int, exc: TrainingFailedError, store: Store, spec: TrainSpec,
             hook: "_Dispatch") -> Restart:
    latest = checkpoint.latest_good(store, spec.run_id)
    epoch, step = (latest.epoch, latest.step) if latest else (0, 0)
    done_at_checkpoint = epoch * spec.plan.steps_per_epoch + step
    # a rank that reported its failure said exactly where it was; else: heartbeats
    reached = max([int(f.status.get("steps", 0)) for f in exc.failures] + [hook.steps])
    reason = str(exc).splitlines()[0]
    if exc.failures:  # the first failure is usually the cause
        first = exc.failures[0]
        reason = f"{reason} First: rank {first.rank}: {first.message}"[:1000]
    log.warning("attempt %d of run %s failed (%s); relaunching from %s", attempt, spec.run_id,
                reason, f"epoch {epoch} step {step}" if latest else "the start")
    return Restart(attempt, reason, epoch, step,
                   max(0, reached - done_at_checkpoint), time.monotonic())


def _record_run(store: Store, run_id: str, data: PreparedData, config: TrainConfig,
                steps_per_epoch: int) -> None:
    """runs/<id>/run.json: what the run trains on and how it is laid out, so a resume by run
    id can check both (a checkpoint's position and per-rank state fit only that layout)."""
    url = store.run_url(run_id, "run.json")
    layout = {"fingerprint": data.fingerprint, "num_workers": config.num_workers,
              "batch_size": config.batch_size, "steps_per_epoch": steps_per_epoch}
    if not store.exists(url):
        store.write_bytes(url, json.dumps({"run_id": run_id, "created": time.time(),
                                           **layout}).encode())
        return
    previous = json.loads(store.read_bytes(url))
    changed = {k: (previous.get(k), v) for k, v in layout.items() if previous.get(k) != v}
    if changed:
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        raise ConfigError(f"run {run_id} cannot be resumed with a different setup ({what}); "
                          "use the same data, numWorkers and batchSize, or leave runId unset "
                          "to start a new run")


def _write_history(store: Store, run_id: str, history: list[dict[str, Any]]) -> None:
    """runs/<id>/history.json, also when the fit failed: what was evaluated so far."""
    try:
        store.write_bytes(store.run_url(run_id, "history.json"),
                          json.dumps(history, indent=1, default=str).encode())
    except Exception as exc:  # noqa: BLE001 - never mask the fit's own outcome
        log.warning("could not write the history of run %s: %s", run_id, exc)


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
