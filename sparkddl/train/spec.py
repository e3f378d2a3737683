"""What the ranks of a fit need: one picklable object built on the driver."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.config import StrategyConfig
from sparkddl.data.plan import ShardPlan
from sparkddl.train.components import OptimizerRecipe


@dataclass
class TrainSpec:
    run_id: str
    model_factory: Callable[[], Any]
    optimizer: OptimizerRecipe
    loss: Callable[..., Any]
    metrics: dict[str, Callable[..., Any]]
    plan: ShardPlan
    features: tuple[str, ...]
    label: str
    epochs: int
    snapshot_every: int
    strategy: StrategyConfig
    seed: int
    store_root: str
    learning_rate: float | None = None
    max_snapshot_bytes: int = 32 << 20  # larger snapshots go through the Store
    progress_interval_s: float = 1.0
    checkpoint_every: int = 1  # epochs; 0 = never
    checkpoint_every_steps: int = 0  # also every N steps inside an epoch; 0 = never
    keep_checkpoints: int = 3
    resume_url: str | None = None  # the checkpoint to resume from, chosen by the driver
