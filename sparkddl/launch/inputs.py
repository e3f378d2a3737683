"""Everything checked and prepared on the driver before ranks launch: the components, the
data (prepared, sampled, planned into shards), the metrics and the best-snapshot metric."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.config import TrainConfig
from sparkddl.data import DataSpec, PreparedData, prepare
from sparkddl.data.local import read_rows
from sparkddl.data.plan import ShardPlan
from sparkddl.errors import ConfigError
from sparkddl.launch.checks import ProblemInfo, check_sample
from sparkddl.store import Store
from sparkddl.train.components import (OptimizerRecipe, build_module, check_optimizer,
                                       model_factory, optimizer_recipe, resolve_loss)
from sparkddl.train.metrics import resolve_metrics


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


def prepare_data(df: Any, config: TrainConfig, store: Store, num_workers: int) -> PreparedData:
    return prepare(df, DataSpec.of(config.features, config.label, shapes=config.feature_shapes),
                   num_workers=num_workers, batch_size=config.batch_size, store=store,
                   validation=config.validation, seed=config.seed, reader=config.reader)


def shard_plan(data: PreparedData, config: TrainConfig, num_workers: int) -> ShardPlan:
    return data.train.plan(num_workers, config.batch_size, seed=config.seed,
                           shuffle_buffer=config.shuffle_buffer,
                           reader_workers=config.reader_workers, reader_pool=config.reader_pool,
                           reader=config.reader)


def fit_inputs(df: Any, model: Any, optimizer: Any, loss: Any, config: TrainConfig
               ) -> FitInputs:
    factory = model_factory(model)
    module = build_module(factory)
    recipe = optimizer_recipe(optimizer)
    check_optimizer(recipe, module, config.learning_rate)
    loss_fn = resolve_loss(loss)
    store = Store.from_uri(config.store)
    store.check_writable()
    data = prepare_data(df, config, store, config.num_workers)
    problem = check_sample(module, loss_fn, read_rows(data.train, limit=8), config.features,
                           config.label, data.label_range(config.label))
    metrics = resolve_metrics(config.metrics if config.metrics is not None else
                              (["accuracy"] if problem.kind.is_classifier else []))
    best_by = resolve_best_by(config.best_by, metrics, data.val is not None)
    return FitInputs(factory, recipe, loss_fn, store, data, problem, metrics, best_by)


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
    prefixes = ["train_"] + (["val_"] if has_val else [])
    valid = [p + m for p in prefixes for m in ["loss", *metrics]]
    chosen = best_by or ("val_loss" if has_val else "train_loss")
    if chosen not in valid:
        hint = " (val_* needs validation data: set validation)" if chosen.startswith("val_") \
            and not has_val else ""
        raise ConfigError(f"unknown bestBy {chosen!r}{hint}; choose one of {', '.join(valid)}")
    return chosen
