"""A user's model factory FUNCTION (not a torch.nn.Module class), named in a preset as
``tests.integration.user_models:small_mlp``: rebuilding it from a saved file alone would
call a function the file names, which an untrusted load refuses."""
from __future__ import annotations

import torch


def small_mlp(in_features: int, num_classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(in_features, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, num_classes))
