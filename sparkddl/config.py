"""Typed, validated configuration: the schema of presets, CLI overrides and Params.

Spark ML Params (camelCase) are converted into these once, at the edge (``sparkddl.ml``);
the CLI builds them from TOML presets. Nothing below sees Params.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sparkddl.errors import ConfigError

FINAL_WEIGHTS = ("best", "last")
READERS = ("auto", "petastorm", "arrow")
POOL_TYPES = ("thread", "dummy")  # how a rank reads ahead
MODES = ("auto", "min", "max")  # whether a lower or a higher bestBy is better
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
SCHEDULER_INTERVALS = ("epoch", "step")
NON_FINITE = ("raise", "skip_batch")
EVALUATIONS = ("auto", "driver", "ranks", "cluster")  # where snapshots are evaluated
_NO_DEFAULT = object()


def _columns(value: Any) -> tuple[str, ...]:
    """One column name or several."""
    return (value,) if isinstance(value, str) else tuple(value)


def _metrics(value: Any) -> Any:
    """One name or callable, several, or a name -> callable dict."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str) or callable(value):
        return (value,)
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"metrics must be a metric name, a callable, a list of them or a "
                          f"name -> callable dict (e.g. ['accuracy', 'f1']), got "
                          f"{type(value).__name__} {value!r}")
    return tuple(value)


def _function(value: Any) -> Any:
    """A callable, or 'package.module:function' (how a preset names one), imported here."""
    if not isinstance(value, str) or ":" not in value:
        return value
    import importlib
    module, _, name = value.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {value!r} ({type(exc).__name__}: {exc}); name a "
                          "function as 'package.module:function' importable on the driver "
                          "and the executors") from exc


def _labels(value: Any) -> str | tuple[str, ...]:
    """One label column (a string), or several (a tuple)."""
    if isinstance(value, str):
        return value
    names = tuple(value)
    return names[0] if len(names) == 1 else names


def _precision(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _shapes(value: Any) -> dict[str, tuple[int, ...]]:
    return {k: per_row_shape(v) for k, v in (value or {}).items()}


def per_row_shape(shape: Any) -> tuple[int, ...]:
    """Without a leading -1 (the batch, as Horovod writes it): [-1, 1, 8, 8] -> (1, 8, 8)"""
    return tuple(shape)[1:] if len(shape) > 1 and shape[0] == -1 else tuple(shape)


def _options(value: Any) -> dict[str, Any]:
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"strategyOptions must be a dict of option -> value (e.g. "
                          f"{{'bucket_mb': 25}}), got {type(value).__name__} {value!r}")
    return dict(value or {})


def check_validation(value: Any) -> None:
    """None (or 0): no validation; a fraction strictly between 0 and 1; or a column name."""
    if value is None or isinstance(value, str) and value:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not (value == 0 or 0 < value < 1):
        raise ConfigError(f"validation={value!r} is not allowed: give the fraction of rows to "
                          "hold out, strictly between 0 and 1 (e.g. 0.2), the name of a "
                          "boolean/0-1 column marking the validation rows, or None for no "
                          "validation")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def optional_positive_int(name: str, value: Any) -> None:
    if value is not None:
        _positive_int(name, value)


def positive_seconds(name: str, value: Any) -> None:
    """None (no limit) or a positive number of seconds."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or value <= 0):
        raise ConfigError(f"{name} must be positive seconds or unset (None), got {value!r}")


def _non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def option(default: Any, doc: str, *, param: str | None, convert: str | None = None,
           preset: str | None = "train", preset_default: Any = _NO_DEFAULT,
           preset_type: Any = None, normalize: Any = None, model_param: bool = False,
           choices: tuple[str, ...] | None = None, check: Any = None) -> Any:
    """A TrainConfig field and everything derived from it, declared once.

    ``param``: the Spark ML Param's name (camelCase; None: no Param), ``convert``: the name
    of its pyspark ``TypeConverters`` function (or of a converter in ``sparkddl.ml.param_schema``);
    ``preset``: the preset section holding the key (same snake_case name; None: not a preset
    key), with ``preset_default`` where a job's default differs and ``preset_type`` where
    TOML needs another type (lists for tuples); ``normalize``: turns a Param's or a preset's
    value into the config's; ``model_param``: the fitted TorchModel has the Param too;
    ``choices``: the values allowed, ``check``: ``check(name, value)`` raising a ConfigError
    (both run when a config is made; the choices also go into the Param's and the preset's
    docs).
    """
    if choices:
        doc = f"{doc} (one of: {', '.join(choices)})"
    meta = {"doc": doc, "param": param, "convert": convert, "preset": preset,
            "preset_default": default if preset_default is _NO_DEFAULT else preset_default,
            "preset_type": preset_type, "normalize": normalize, "model_param": model_param,
            "choices": choices, "check": check}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a fit needs besides the model, optimizer and loss objects: the one schema
    from which the Params of TorchEstimator/TorchModel, the preset's [data] and [train] keys,
    and their defaults and docs are derived (see ``option``). Checked when made: a config
    that exists is a valid one (a ConfigError names the option otherwise); changed only by
    :meth:`replace`, which checks again."""

    features: tuple[str, ...] = option(
        ("features",), "feature column, or a list of them; each a Vector, a fixed-length "
        "numeric array or a numeric column (several columns are passed to the model as "
        "several inputs)", param="featuresCol", convert="features", preset="data",
        preset_type=list[str], normalize=_columns, model_param=True)
    label: str | tuple[str, ...] = option(
        "label", "label column name, or a list of them (the model then returns one output "
        "per label; the loss is summed over the pairs)", param="labelCol", convert="labels",
        preset="data", preset_type=str | list[str], normalize=_labels)
    sample_weight: str | None = option(
        None, "column of per-row weights: the loss is sum(w * loss_i) / sum(w)",
        param="sampleWeightCol", preset="data")
    epochs: int = option(10, "passes over the training data", param="epochs", convert="toInt",
                         check=_positive_int)
    batch_size: int = option(32, "rows per step on each worker (global batch = batchSize x "
                             "numWorkers)", param="batchSize", convert="toInt", check=_positive_int)
    num_workers: int = option(2, "ranks (barrier tasks) to train with", param="numWorkers",
                              convert="toInt", check=_positive_int)
    validation: float | str | None = option(
        None, "fraction of rows held out for validation, or the name of a boolean/0-1 column "
        "marking them; None: no validation", param="validation", preset="data",
        preset_default=0.2)
    store: str = option("file:///tmp/sparkddl", "where data and run artifacts go (path, "
                        "file://, /Volumes/..., hdfs://, s3://, dbfs:/, gs://, abfss:// or "
                        "another fsspec filesystem)", param="store", convert="store",
                        preset_default="runs/store")
    seed: int = option(0, "seed for initialization, data order and the validation split",
                       param="seed", convert="toInt", preset="data", check=_non_negative_int)
    snapshot_every: int = option(1, "hand a model snapshot to the driver every N epochs",
                                 param="snapshotEvery", convert="toInt", check=_positive_int)
    evaluation: str = option(
        "auto", "where snapshots are evaluated on the validation split: driver (its own "
        "process streams the whole split for every snapshot), ranks (each rank its share of "
        "the split's row groups, the metrics merged exactly over the ranks; the ranks pause "
        "while they evaluate), cluster (a Spark job per snapshot on executor slots the fit "
        "does not hold, its tasks' metric states merged on the driver; the ranks never "
        "pause), auto (ranks from 1,000,000 validation rows where every rank gets a row "
        "group, else driver)", param="evaluation", convert="toString",
        choices=EVALUATIONS)
    best_by: str | None = option(
        None, "metric choosing the best snapshot (val_loss, val_accuracy, train_loss, ...); "
        "default val_loss, or train_loss without validation", param="bestBy")
    best_mode: str = option("auto", "min or max: whether a lower or a higher bestBy is better; "
                            "auto: min for losses and errors, max otherwise",
                            param="bestByMode", convert="toString", choices=MODES)
    early_stopping_patience: int = option(
        0, "stop after this many evaluated snapshots without improvement of bestBy; 0 = never",
        param="earlyStoppingPatience", convert="toInt", check=_non_negative_int)
    final_weights: str = option("best", "weights of the returned model: best or last",
                                param="finalWeights", convert="toString", choices=FINAL_WEIGHTS)
    learning_rate: float | None = option(
        None, "if set, overrides the optimizer's learning rate", param="learningRate",
        preset=None)  # presets set optimizer.lr
    metrics: Any = option(None, "metric names: means over rows (accuracy, mse, mae), exact "
                          "ones over the whole validation set from torchmetrics (f1, "
                          "precision, recall, auroc, average_precision, specificity, mcc, "
                          "cohen_kappa; r2, pearson, spearman, explained_variance, mape; "
                          "f1_micro etc. choose the average, macro by default), or "
                          "callables; default: accuracy for classifiers", param="metrics",
                          preset_type=list[str] | None, normalize=_metrics)
    feature_shapes: dict[str, tuple[int, ...]] = option(
        {}, "optional per-feature-column shape, e.g. {'features': [1, 8, 8]}",
        param="featureShapes", preset="data", preset_type=dict[str, list[int]],
        normalize=_shapes, model_param=True)
    steps_per_epoch: int | None = option(
        None, "at most this many steps per epoch on each rank (None: a pass over its shard)",
        param="trainStepsPerEpoch", convert="toInt", check=optional_positive_int)
    shuffle_buffer: int = option(10_000, "rows in each worker's shuffle buffer",
                                 param="shuffleBufferSize", convert="toInt",
                                 check=_non_negative_int)
    reader_workers: int = option(2, "threads reading Parquet ahead on each worker",
                                 param="readerWorkers", convert="toInt", check=_positive_int)
    epoch_cache_mb: int = option(
        0, "MiB of decoded rows each worker may keep in memory after the first epoch, so "
        "that later epochs read no Parquet (where its share does not fit, it reads every "
        "epoch); 0 = off", param="epochCacheMB", convert="toInt", check=_non_negative_int)
    reader_pool: str = option("thread", "how each worker reads ahead: thread (readerWorkers "
                              "threads) or dummy (inline, no threads)", param="readerPool",
                              convert="toString", choices=POOL_TYPES)
    reader: str = option("auto", "Parquet reader: auto (Petastorm where it loads, else Arrow), "
                         "petastorm or arrow", param="reader", convert="toString", choices=READERS)
    use_gpu: bool = option(False, "train on the GPUs Spark assigns to the tasks",
                           param="useGpu", convert="toBoolean")
    timeout_s: float | None = option(None, "wall-clock limit of the whole fit in seconds, all "
                                     "attempts together (None: no limit)", param="timeout")
    lr_scheduler: Any = option(
        None, "learning-rate schedule: a factory optimizer -> torch LR scheduler, or a name "
        "(step, multistep, exponential, cosine, linear, onecycle, constant) with "
        "lrSchedulerOptions", param="lrScheduler", preset_type=str | None)
    lr_scheduler_options: dict[str, Any] = option(
        {}, "keyword arguments of the named scheduler (e.g. {'step_size': 5, 'gamma': 0.5}); "
        "cosine and onecycle default to the whole fit's length", param="lrSchedulerOptions",
        normalize=_options)
    lr_scheduler_interval: str = option("epoch", "step the schedule every epoch or every "
                                        "optimizer step", param="lrSchedulerInterval",
                                        convert="toString", choices=SCHEDULER_INTERVALS)
    precision: str = option("32", "32, bf16-mixed (autocast to bfloat16, CPU and GPU) or "
                            "16-mixed (float16 autocast with loss scaling, GPU only); weights "
                            "and optimizer state stay float32", param="precision",
                            convert="toString", normalize=_precision, choices=PRECISIONS)
    backward_passes_per_step: int = option(
        1, "micro-batches whose gradients are accumulated per optimizer step (no "
        "communication on the first k-1)", param="backwardPassesPerStep", convert="toInt")
    gradient_clip_norm: float | None = option(
        None, "clip the synchronized gradients to this total L2 norm", param="gradientClipNorm")
    gradient_clip_value: float | None = option(
        None, "clamp each synchronized gradient element to [-v, v]", param="gradientClipValue")
    transform_fn: Any = option(
        None, "fn(batch) -> dict of tensors, run on every batch before the model sees it (on "
        "the ranks, in the reader's threads; on the driver; in TorchModel.transform): batch "
        "maps each column to a numpy array, object arrays of bytes/str for binary/string "
        "columns and a list of arrays for variable-length ones; what it does not return "
        "passes through. A preset names it as 'package.module:function'",
        param="transformFn", preset="data", preset_type=str | None, normalize=_function)
    train_step: Any = option(
        None, "fn(model, batch) -> scalar loss, replacing model(*features) and loss(output, "
        "label); batch is the dict column -> tensor; also computes val_loss", param="trainStep",
        preset=None)
    on_non_finite_loss: str = option(
        "raise", "a NaN/inf loss: raise (stop the fit naming epoch, step and rank) or "
        "skip_batch (every rank skips that step)", param="onNonFiniteLoss", convert="toString",
        choices=NON_FINITE)
    strategy: str = option("allreduce", "training strategy name", param="strategy",
                           convert="toString")
    strategy_options: dict[str, Any] = option({}, "options of the strategy (dict)",
                                              param="strategyOptions", normalize=_options)
    progress: bool = option(True, "show progress on the driver", param="progress",
                            convert="toBoolean")
    snapshot_channel_bytes: int = option(
        32 << 20, "snapshots larger than this (or than the channel's frame limit, 64 MiB) "
        "go through the Store, with only a notice on the channel", param=None, preset=None,
        check=_positive_int)
    checkpoint_every: int = option(1, "write a checkpoint every N epochs (0: never)",
                                   param="checkpointEvery", convert="toInt",
                                   check=_non_negative_int)
    checkpoint_every_steps: int = option(0, "also every N steps inside epochs (0: never)",
                                         param="checkpointEverySteps", convert="toInt",
                                         check=_non_negative_int)
    keep_checkpoints: int = option(3, "checkpoints kept per run (the newest)",
                                   param="keepCheckpoints", convert="toInt", check=_positive_int)
    max_restarts: int = option(2, "relaunches of the barrier stage after a failure, each "
                               "resuming from the last good checkpoint", param="maxRestarts",
                               convert="toInt", check=_non_negative_int)
    min_workers: int | None = option(
        None, "after a lost executor, go on with at least this many ranks from the last "
        "epoch checkpoint when fewer slots come back (elastic; None: numWorkers, no "
        "elasticity)", param="minWorkers", convert="toInt", check=optional_positive_int)
    slot_wait_s: float = option(120.0, "seconds to wait for task slots: at each launch (then "
                                "a ClusterError) and before a relaunch (then go on with "
                                "minWorkers ranks or fail)", param="slotWaitTimeout",
                                convert="toFloat")
    run_id: str | None = option(None, "resume this earlier run from its last good checkpoint "
                                "(None: a new run)", param="runId")
    watchdog_s: float | str | None = option(
        "auto", "seconds without progress on a rank before the attempt is failed; 'auto': "
        "20x the slowest step seen, at least 60 s (300 s up to the first step); None: no "
        "watchdog", param="watchdogTimeout")

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> "TrainConfig":
        """A config from field values as Params or presets give them (normalized here)."""
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                normalize = f.metadata["normalize"]
                out[f.name] = normalize(values[f.name]) if normalize else values[f.name]
        return cls(**out)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "TrainConfig":
        """Raise a ConfigError naming the first option out of range; else ``self``. Runs when
        the config is made; calling it again is harmless."""
        for f in dataclasses.fields(self):  # what each option declares
            value = getattr(self, f.name)
            if f.metadata["choices"]:
                _choice(f.name, value, f.metadata["choices"])
            if f.metadata["check"]:
                f.metadata["check"](f.name, value)
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ConfigError(f"min_workers={self.min_workers} is more than num_workers="
                              f"{self.num_workers}; it is the fewest ranks a fit goes on with")
        if self.slot_wait_s is None:
            raise ConfigError("slot_wait_s must be positive seconds: waiting for slots is "
                              "always bounded")
        positive_seconds("slot_wait_s", self.slot_wait_s)
        if self.run_id is not None and not (isinstance(self.run_id, str) and
                                            self.run_id.replace("-", "").isalnum()):
            raise ConfigError(f"run_id must be letters, digits and '-', got {self.run_id!r}")
        if self.watchdog_s != "auto":
            positive_seconds("watchdog timeout ('auto', seconds or None)", self.watchdog_s)
        check_validation(self.validation)
        if not self.features or not all(isinstance(f, str) and f for f in self.features):
            raise ConfigError(f"features must name one or more columns, got {self.features!r}")
        if not self.labels or not all(isinstance(c, str) and c for c in self.labels):
            raise ConfigError(f"label must name a column or several, got {self.label!r}")
        if self.sample_weight is not None and (not isinstance(self.sample_weight, str) or
                                               not self.sample_weight):
            raise ConfigError(f"sample_weight must name a column or be unset, got "
                              f"{self.sample_weight!r}")
        if isinstance(self.backward_passes_per_step, bool) or not isinstance(
                self.backward_passes_per_step, int) or self.backward_passes_per_step < 1:
            raise ConfigError(f"backward_passes_per_step must be an integer >= 1 (1: no "
                              f"accumulation), got {self.backward_passes_per_step!r}")
        for name in ("gradient_clip_norm", "gradient_clip_value"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not value > 0):
                raise ConfigError(f"{name} must be a positive number or unset, got {value!r}")
        if self.transform_fn is not None and not callable(self.transform_fn):
            raise ConfigError(f"transform_fn must be a function batch -> dict of tensors (or "
                              f"'package.module:function' in a preset), got "
                              f"{type(self.transform_fn).__name__}")
        if self.train_step is not None and not callable(self.train_step):
            raise ConfigError(f"train_step must be a function (model, batch) -> loss, got "
                              f"{type(self.train_step).__name__}")
        if self.lr_scheduler is not None and not (isinstance(self.lr_scheduler, str) or
                                                  callable(self.lr_scheduler)):
            raise ConfigError(f"lr_scheduler must be a name or a factory optimizer -> "
                              f"scheduler, got {type(self.lr_scheduler).__name__}")
        if self.strategy == "fsdp" and self.on_non_finite_loss == "skip_batch":
            raise ConfigError("on_non_finite_loss='skip_batch' is not supported with strategy "
                              "'fsdp' (a skipped batch's zero backward cannot reach sharded "
                              "parameters); use 'raise', or another strategy")
        if self.lr_scheduler is None and self.lr_scheduler_options:
            raise ConfigError("lr_scheduler_options are set but no lr_scheduler is; name one, "
                              "e.g. lr_scheduler='cosine'")
        if self.learning_rate is not None and not (
                isinstance(self.learning_rate, (int, float)) and self.learning_rate >= 0):
            raise ConfigError(f"learning_rate must be a non-negative number or unset, "
                              f"got {self.learning_rate!r}")
        positive_seconds("timeout", self.timeout_s)
        return self

    @property
    def labels(self) -> tuple[str, ...]:
        return (self.label,) if isinstance(self.label, str) else tuple(self.label)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
