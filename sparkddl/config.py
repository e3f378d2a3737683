"""Typed, validated configuration: the schema of presets, CLI overrides and Params.

Spark ML Params (camelCase) are converted into these once, at the edge (``sparkddl.ml``);
the CLI builds them from TOML presets. Nothing below sees Params.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sparkddl.channel.protocol import DEFAULT_MAX_PAYLOAD_BYTES
from sparkddl.data.plan import READERS
from sparkddl.data.reader import POOL_TYPES
from sparkddl.errors import ConfigError
from sparkddl.train.metrics import MODES

FINAL_WEIGHTS = ("best", "last")


@dataclass
class StrategyConfig:
    name: str = "allreduce"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    """Everything a fit needs besides the model, optimizer and loss objects."""

    features: tuple[str, ...] = ("features",)
    label: str = "label"
    epochs: int = 10
    batch_size: int = 32  # per worker; the global batch is batch_size * num_workers
    num_workers: int = 2
    validation: float | str | None = None
    store: str = "file:///tmp/sparkddl"
    seed: int = 0
    snapshot_every: int = 1
    best_by: str | None = None  # default: val_loss with validation data, train_loss without
    best_mode: str = "auto"  # min | max | auto (min for losses and errors, else max)
    early_stopping_patience: int = 0  # evaluated snapshots without improvement; 0 = off
    final_weights: str = "best"
    learning_rate: float | None = None  # if set, overrides the optimizer's learning rate(s)
    metrics: Any = None  # names/callables, or a name -> callable dict; None: accuracy for
    # classifiers
    feature_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shuffle_buffer: int = 10_000
    reader_workers: int = 2
    reader_pool: str = "thread"
    reader: str = "auto"  # auto | petastorm | arrow
    use_gpu: bool = False
    timeout_s: float | None = None
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    progress: bool = True
    # snapshots larger than this go through the Store, with only a notice on the channel
    snapshot_channel_bytes: int = 32 << 20
    checkpoint_every: int = 1  # epochs; 0 = never
    checkpoint_every_steps: int = 0  # also every N steps inside epochs; 0 = never
    keep_checkpoints: int = 3
    max_restarts: int = 2  # barrier stage relaunches after a failure, resuming
    run_id: str | None = None  # resume this run from its last good checkpoint
    watchdog_s: float | None = 900.0  # a rank without progress this long fails the attempt

    def validate(self) -> "TrainConfig":
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        _positive_int("num_workers", self.num_workers)
        _positive_int("snapshot_every", self.snapshot_every)
        _positive_int("reader_workers", self.reader_workers)
        _non_negative_int("early_stopping_patience", self.early_stopping_patience)
        _non_negative_int("shuffle_buffer", self.shuffle_buffer)
        _non_negative_int("seed", self.seed)
        _positive_int("snapshot_channel_bytes", self.snapshot_channel_bytes)
        if self.snapshot_channel_bytes > DEFAULT_MAX_PAYLOAD_BYTES:
            raise ConfigError(f"snapshot_channel_bytes={self.snapshot_channel_bytes} exceeds the "
                              f"driver channel's {DEFAULT_MAX_PAYLOAD_BYTES}-byte frame limit; "
                              "larger snapshots go through the Store anyway")
        _non_negative_int("checkpoint_every", self.checkpoint_every)
        _non_negative_int("checkpoint_every_steps", self.checkpoint_every_steps)
        _positive_int("keep_checkpoints", self.keep_checkpoints)
        _non_negative_int("max_restarts", self.max_restarts)
        if self.run_id is not None and not (isinstance(self.run_id, str) and
                                            self.run_id.replace("-", "").isalnum()):
            raise ConfigError(f"run_id must be letters, digits and '-', got {self.run_id!r}")
        positive_seconds("watchdog timeout", self.watchdog_s)
        _choice("final_weights", self.final_weights, FINAL_WEIGHTS)
        _choice("reader_pool", self.reader_pool, POOL_TYPES)
        _choice("reader", self.reader, READERS)
        _choice("best_mode", self.best_mode, MODES)
        if not self.features or not all(isinstance(f, str) and f for f in self.features):
            raise ConfigError(f"features must name one or more columns, got {self.features!r}")
        if not isinstance(self.label, str) or not self.label:
            raise ConfigError(f"label must name a column, got {self.label!r}")
        if self.learning_rate is not None and not (
                isinstance(self.learning_rate, (int, float)) and self.learning_rate >= 0):
            raise ConfigError(f"learning_rate must be a non-negative number or unset, "
                              f"got {self.learning_rate!r}")
        positive_seconds("timeout", self.timeout_s)
        return self

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


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
