"""The optimizer step's knobs: learning-rate schedules, mixed precision, gradient clipping.

Everything here is built from the config on the ranks (and once on the driver, to fail
there): a :class:`SchedulerRecipe` makes the schedule, :func:`autocast` and :func:`scaler`
the precision, and :class:`OptimizerStep` is what strategies call as ``optimizer.step()``,
after they have synchronized the gradients: unscale (16-mixed), clip, step.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkddl.errors import ConfigError
from sparkddl.train.components import dynamo_left_unloaded

# name -> (torch.optim.lr_scheduler class, defaults); cosine and onecycle get the fit's length
SCHEDULERS = {"step": ("StepLR", {"step_size": 10}), "multistep": ("MultiStepLR", {}),
              "exponential": ("ExponentialLR", {"gamma": 0.95}),
              "cosine": ("CosineAnnealingLR", {}), "linear": ("LinearLR", {}),
              "onecycle": ("OneCycleLR", {}), "constant": ("ConstantLR", {})}


@dataclass
class SchedulerRecipe:
    """Rebuilds the learning-rate schedule on the ranks: a factory or a name with options."""

    factory: Callable[[Any], Any] | None = None
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    interval: str = "epoch"

    def build(self, optimizer: Any, epochs: int, optimizer_steps_per_epoch: int) -> Any:
        import torch
        if self.factory is not None:
            made = self.factory(optimizer)
        else:
            cls_name, defaults = SCHEDULERS[self.name]  # pyright: ignore[reportArgumentType] - no factory: a name
            total = epochs * (optimizer_steps_per_epoch if self.interval == "step" else 1)
            options = dict(defaults)
            if self.name == "cosine":
                options["T_max"] = total
            elif self.name == "onecycle":
                options.update(total_steps=total,
                               max_lr=[g["lr"] for g in optimizer.param_groups])
            options.update(self.options)
            made = getattr(torch.optim.lr_scheduler, cls_name)(optimizer, **options)
        if isinstance(made, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ConfigError("ReduceLROnPlateau needs a metric at every step; it is not "
                              "supported as lrScheduler: use a schedule of epochs or steps")
        if not (hasattr(made, "step") and hasattr(made, "state_dict")):
            raise ConfigError(f"the lrScheduler factory returned a {type(made).__name__}, not "
                              "a torch LR scheduler (it needs step() and state_dict())")
        return made


def scheduler_recipe(scheduler: Any, options: dict[str, Any], interval: str
                     ) -> SchedulerRecipe | None:
    if scheduler is None:
        return None
    if isinstance(scheduler, str):
        if scheduler.lower() not in SCHEDULERS:
            raise ConfigError(f"unknown lrScheduler {scheduler!r}; choose one of "
                              f"{', '.join(SCHEDULERS)} or pass a factory optimizer -> scheduler")
        return SchedulerRecipe(name=scheduler.lower(), options=dict(options), interval=interval)
    return SchedulerRecipe(factory=scheduler, interval=interval)


def check_scheduler(recipe: SchedulerRecipe | None, optimizer: Any, epochs: int,
                    optimizer_steps_per_epoch: int) -> None:
    """Build it once on the driver, on a throwaway optimizer: fail here, not on the ranks."""
    if recipe is None:
        return
    try:
        with dynamo_left_unloaded():
            recipe.build(optimizer, epochs, optimizer_steps_per_epoch)
    except ConfigError:
        raise
    except Exception as exc:
        what = f"{recipe.name!r} with {recipe.options}" if recipe.name else "factory"
        raise ConfigError(f"the lrScheduler {what} could not be built: "
                          f"{type(exc).__name__}: {exc}") from exc


def optimizer_steps(steps_per_epoch: int, passes: int) -> int:
    """Optimizer steps in an epoch of ``steps_per_epoch`` micro-batches."""
    return math.ceil(steps_per_epoch / passes)


def check_precision(precision: str, use_gpu: bool) -> None:
    if precision == "16-mixed" and not use_gpu:
        raise ConfigError("precision '16-mixed' (float16 with loss scaling) needs CUDA GPUs "
                          "(useGpu=True); on CPUs use 'bf16-mixed'")


def autocast(precision: str, device: Any) -> Any:
    """The forward pass's autocast context (a no-op for '32')."""
    import torch
    if precision == "32":
        return contextlib.nullcontext()
    if precision == "16-mixed" and device.type != "cuda":
        raise ConfigError(f"precision '16-mixed' needs a CUDA device; this rank runs on "
                          f"{device}; use 'bf16-mixed'")
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def scaler(precision: str) -> Any:
    """A GradScaler for '16-mixed' (None otherwise)."""
    if precision != "16-mixed":
        return None
    import torch
    return torch.amp.GradScaler("cuda")


class OptimizerStep:
    """What strategies call as ``optimizer.step()``: unscale (16-mixed), clip the already
    synchronized gradients, step (through the scaler). Everything else is the optimizer's."""

    def __init__(self, optimizer: Any, strategy: Any, params: list[Any],
                 clip_norm: float | None, clip_value: float | None, grad_scaler: Any):
        self.optimizer, self.strategy, self.params = optimizer, strategy, params
        self.clip_norm, self.clip_value, self.scaler = clip_norm, clip_value, grad_scaler
        self.last_norm: float | None = None  # the total norm before the last clip

    def step(self) -> None:
        import torch
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.clip_norm is not None:
            self.last_norm = self.strategy.clip_grad_norm_(self.params, self.clip_norm)
        if self.clip_value is not None:
            torch.nn.utils.clip_grad_value_(self.params, self.clip_value)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def __getattr__(self, name: str) -> Any:  # param_groups, state, zero_grad, ...
        return getattr(self.optimizer, name)
