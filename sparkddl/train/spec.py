"""What the ranks of a fit need: one picklable object built on the driver."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sparkddl.config import TrainConfig
from sparkddl.data.dataset import Dataset
from sparkddl.data.plan import ShardPlan
from sparkddl.train.components import OptimizerRecipe
from sparkddl.train.optimization import SchedulerRecipe
from sparkddl.train.steps import LossFn


@dataclass
class TrainSpec:
    """The training options (``config``, as the user gave them) and what the driver resolved
    for this run: the components, the shard plan, where the run's files go."""

    config: TrainConfig
    run_id: str
    model_factory: Callable[[], Any]
    optimizer: OptimizerRecipe
    loss: Callable[..., Any]
    metrics: dict[str, Callable[..., Any]]
    plan: ShardPlan
    store_root: str
    progress_interval_s: float = 1.0
    resume_url: str | None = None  # the checkpoint to resume from, chosen by the driver
    fence: str | None = None  # this attempt's token: only the current attempt writes
    scheduler: SchedulerRecipe | None = None
    step_fn: LossFn | None = None  # None: model(*features), loss(output, label)
    # strategies registered on the driver beyond the built-in ones, registered on each rank
    strategies: dict[str, Any] = field(default_factory=dict)
    # evaluation="ranks": the validation split, and the metrics (exact ones included) the
    # ranks evaluate each snapshot with; None: the driver evaluates
    val: Dataset | None = None
    eval_metrics: dict[str, Any] = field(default_factory=dict)

    def loss_fn(self) -> LossFn:
        if self.step_fn is not None:
            return self.step_fn
        return LossFn(self.config.features, self.config.labels, (self.loss,))
