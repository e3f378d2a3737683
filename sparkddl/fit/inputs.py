"""Everything checked and prepared on the driver before ranks launch: the components, the
data (prepared, sampled, planned into shards), the metrics and the best-snapshot metric."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from sparkddl import checkpoint
from sparkddl.config import TrainConfig
from sparkddl.data import DataSpec, PreparedData, look, prepare
from sparkddl.data.local import read_rows
from sparkddl.data.plan import ShardPlan
from sparkddl.errors import ConfigError
from sparkddl.export.program import input_specs
from sparkddl.fit.checks import ProblemInfo, check_finite, check_sample
from sparkddl.store import Store
from sparkddl.train.components import (
    OptimizerRecipe,
    build_module,
    check_optimizer,
    model_factory,
    optimizer_recipe,
    resolve_loss,
)
from sparkddl.train.metrics import per_batch, resolve_metrics
from sparkddl.train.optimization import (
    SchedulerRecipe,
    check_precision,
    check_scheduler,
    scheduler_recipe,
)
from sparkddl.train.steps import LossFn, loss_fn

log = logging.getLogger(__name__)


@dataclass
class FitInputs:
    factory: Callable[[], Any]
    optimizer: OptimizerRecipe
    loss: Callable[..., Any]
    store: Store
    data: PreparedData
    problem: ProblemInfo  # what the model predicts, from a sample of the data
    metrics: dict[str, Callable[..., Any]]
    best_by: str
    step_fn: LossFn  # model + loss (or the trainStep) on a batch
    scheduler: SchedulerRecipe | None
    transform_shapes: tuple[Any, ...] = ()  # what the transformFn gave the driver's sample


def _spec(config: TrainConfig) -> DataSpec:
    weight = (config.sample_weight,) if config.sample_weight else None
    return DataSpec.of(config.features, config.labels, extra=weight,
                       shapes=config.feature_shapes, raw=config.transform_fn is not None)


def prepare_data(df: Any, config: TrainConfig, store: Store, num_workers: int,
                 looked: PreparedData | str | None = None) -> PreparedData:
    """The fit's data, prepared (``looked``: what :func:`look_at_data` found already)."""
    return prepare(df, _spec(config), num_workers=num_workers, batch_size=config.batch_size,
                   store=store, validation=config.validation, seed=config.seed,
                   reader=config.reader, looked=looked)


def look_at_data(df: Any, config: TrainConfig) -> PreparedData | str:
    """The fit's data validated, and listed and planned where it is read in place, without
    writing anything (:func:`sparkddl.data.look`): what may run before the executors'
    Python has been found good."""
    return look(df, _spec(config), num_workers=config.num_workers,
                batch_size=config.batch_size, validation=config.validation, seed=config.seed,
                reader=config.reader)


def shard_plan(data: PreparedData, config: TrainConfig, num_workers: int,
               transform_shapes: Any = ()) -> ShardPlan:
    plan = data.train.plan(num_workers, config.batch_size, seed=config.seed,
                           shuffle_buffer=config.shuffle_buffer,
                           reader_workers=config.reader_workers, reader_pool=config.reader_pool,
                           reader=config.reader, cache_bytes=config.epoch_cache_mb << 20)
    if config.steps_per_epoch is not None and config.steps_per_epoch < plan.steps_per_epoch:
        plan = dataclasses.replace(plan, steps_per_epoch=config.steps_per_epoch)
    elif config.steps_per_epoch is not None and config.steps_per_epoch > plan.steps_per_epoch:
        log.warning("trainStepsPerEpoch=%d is more than one pass over each rank's shard (%d "
                    "steps): an epoch stays one pass; raise epochs to train longer",
                    config.steps_per_epoch, plan.steps_per_epoch)
    if config.transform_fn is None:
        return plan
    return dataclasses.replace(plan, transform=config.transform_fn,
                               transform_shapes=tuple(transform_shapes))


def sample_through_transform(sample: dict[str, Any], config: TrainConfig
                             ) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The driver's sample as the model will see it (through the transformFn, if any), and
    the shapes the transform gave, which every rank's batches must keep."""
    if config.transform_fn is None:
        return sample, ()
    from sparkddl.data.transform import Shapes, apply
    shapes = Shapes()
    out = apply(config.transform_fn, sample, "the driver's sample of the training data",
                shapes)
    missing = [f for f in (*config.features, *config.labels) if f not in out]
    if missing:
        raise ConfigError(f"after the transformFn the batch has no column "
                          f"{', '.join(map(repr, missing))}; return the model's inputs under "
                          "the feature column names (numeric columns it does not return pass "
                          f"through; it returned {', '.join(out) or 'nothing'})")
    return {k: v.numpy() for k, v in out.items()}, shapes.record()


@dataclass
class Components:
    """The model, optimizer, loss and scheduler, built and checked on the driver: nothing of
    the data or the store yet (so it may run beside the check of the executors' Python)."""
    factory: Callable[[], Any]
    module: Any
    optimizer: OptimizerRecipe
    losses: Any  # one loss, or one per label
    step_fn: LossFn
    scheduler: SchedulerRecipe | None


def fit_components(model: Any, optimizer: Any, loss: Any, config: TrainConfig) -> Components:
    factory = model_factory(model)
    module = build_module(factory)
    recipe = optimizer_recipe(optimizer)
    checked = check_optimizer(recipe, module, config.learning_rate)
    check_precision(config.precision, config.use_gpu)
    losses = [resolve_loss(x) for x in loss] if isinstance(loss, (list, tuple)) else \
        resolve_loss(loss)
    step_fn = loss_fn(losses, config.features, config.labels, config.sample_weight,
                      config.train_step)
    resolve_metrics(config.metrics)  # unknown names fail before the data is prepared
    if config.train_step is not None and config.metrics:
        raise ConfigError("metrics need the model's output, which a trainStep does not "
                          "return; drop metrics (val_loss and train_loss are computed with "
                          "the trainStep) or drop trainStep")
    schedule = scheduler_recipe(config.lr_scheduler, config.lr_scheduler_options,
                                config.lr_scheduler_interval)
    # before the data is prepared (which may take long); the real length comes later
    check_scheduler(schedule, checked, config.epochs, optimizer_steps_per_epoch=1)
    return Components(factory, module, recipe, losses, step_fn, schedule)


def fit_inputs(df: Any, parts: Components, config: TrainConfig,
               looked: PreparedData | str | None = None) -> FitInputs:
    factory, module, recipe, losses = parts.factory, parts.module, parts.optimizer, parts.losses
    step_fn, schedule = parts.step_fn, parts.scheduler
    store = Store.from_uri(config.store)
    store.check_shared()
    store.check_writable()
    if config.run_id:  # before the data is prepared: a resume that cannot resume stops here
        checkpoint.check_resumable(store, config.run_id)
    data = prepare_data(df, config, store, config.num_workers, looked)
    sample, transform_shapes = sample_through_transform(read_rows(data.train, limit=8), config)
    check_finite(sample, config.features, config.on_non_finite_loss)
    problem = check_sample(module, step_fn, sample, data.label_range(config.labels[0])
                           if config.labels[0] not in {k for k, _, _ in transform_shapes}
                           else (None, None))  # a label the transform rewrites: its own
    problem = dataclasses.replace(problem, inputs=input_specs(sample, config.features))
    default = ["accuracy"] if problem.kind.is_classifier and config.train_step is None else []
    metrics = resolve_metrics(config.metrics if config.metrics is not None else default,
                              problem.kind.value, problem.output_width)
    best_by = resolve_best_by(config.best_by, metrics, data.val is not None)
    return FitInputs(factory, recipe, losses if not isinstance(losses, list) else losses[0],
                     store, data, problem, metrics, best_by, step_fn, schedule,
                     transform_shapes)


def check_best_by_early(config: TrainConfig) -> None:
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
    valid = [f"train_{m}" for m in ["loss", *per_batch(metrics)]]  # exact ones: val_ only
    if has_val:
        valid += [f"val_{m}" for m in ["loss", *metrics]]
    chosen = best_by or ("val_loss" if has_val else "train_loss")
    if chosen not in valid:
        hint = " (val_* needs validation data: set validation)" if chosen.startswith("val_") \
            and not has_val else ""
        raise ConfigError(f"unknown bestBy {chosen!r}{hint}; choose one of {', '.join(valid)}")
    return chosen
