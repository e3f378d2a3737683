"""A user's model factory FUNCTION (not a torch.nn.Module class), named in a preset as
``tests.integration.user_models:small_mlp``: rebuilding it from a saved file alone would
call a function the file names, which an untrusted load refuses."""
from __future__ import annotations

import torch


def small_mlp(in_features: int, num_classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(in_features, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, num_classes))


class NaNAfter(torch.nn.Module):
    """An MLP whose output turns NaN from its ``after``-th training forward pass on, as a
    diverging model's does: the driver's one-batch check passes, the ranks must catch it."""

    def __init__(self, after: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 10))
        self.after, self.calls = after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.training:
            self.calls += 1
            if self.calls >= self.after:
                return out * float("nan")
        return out


class TwoHeads(torch.nn.Module):
    """Digit class and parity from one trunk: one output per label column."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
        self.digit = torch.nn.Linear(64, 10)
        self.parity = torch.nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.digit(h), self.parity(h)


def digit_step(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """A custom training step (trainStep): the loss from the batch's columns by name."""
    return torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])


def vector_step(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """A broken trainStep: a loss per row, not a scalar."""
    return torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"],
                                             reduction="none")
