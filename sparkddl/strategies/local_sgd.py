"""Local SGD: ranks train on their own for ``period`` steps, then average their models.

With ``warmup_steps`` it is post-local SGD (Lin et al., 2020): synchronous gradient
averaging first, while the model changes fastest, then local steps. Communication falls to
one model-sized allreduce per ``period`` steps (two with ``average_optimizer_state``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.tensors import (
    DEFAULT_BUCKET_BYTES,
    GradientSync,
    allreduce_mean,
    average_,
    broadcast_module,
    model_state,
)

if TYPE_CHECKING:
    import torch


class LocalSGD(Strategy):
    name = "local_sgd"
    replicas_differ = True
    @dataclass(frozen=True)
    class Options:
        period: int = option(8, "steps between model averages")
        warmup_steps: int = option(0, "synchronous steps first (post-local SGD)")
        average_optimizer_state: bool = option(False, "average the optimizer's state too")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.steps = 0
        self.state: list[Any] = []
        self.sync: GradientSync | None = None

    def check_options(self) -> None:
        self.check_int("period", 1)
        self.check_int("warmup_steps", 0)
        self.check_bool("average_optimizer_state")

    def wrap(self, module: Any) -> Any:
        broadcast_module(module)
        self.state = model_state(module)
        self.sync = GradientSync(list(module.parameters()), DEFAULT_BUCKET_BYTES,
                                 lambda flat, keys, shapes: allreduce_mean(flat, self.comm))
        return module

    def step(self, optimizer: Any) -> None:
        warmup = self.options["warmup_steps"]
        if self.steps < warmup:
            self.sync()  # pyright: ignore[reportOptionalCall] - wrap made it
        optimizer.step()
        self.steps += 1
        local_steps = self.steps - warmup
        if local_steps > 0 and local_steps % self.options["period"] == 0:
            average_(self.state, self.comm)
            if self.options["average_optimizer_state"]:
                average_(optimizer_tensors(optimizer), self.comm)

    def finalize(self, module: Any) -> None:
        average_(self.state, self.comm)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])


def optimizer_tensors(optimizer: Any) -> list["torch.Tensor"]:
    """The optimizer's floating-point state (momentum, Adam's moments), in an order every
    rank agrees on: parameter order, then state name. Scalars are left out: they are step
    counts, equal on every rank, and Adam keeps them on the CPU even for CUDA parameters."""
    import torch

    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0:
                    out.append(value)
    return out
