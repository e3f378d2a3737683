"""Dynamic averaging (Kamp et al., 2018): average the models only when they have drifted.

Every ``check_every`` steps each rank measures how far its model has moved from the last
model all ranks agreed on (squared L2 distance over parameters and floating-point buffers);
one 8-byte allreduce gives the mean over ranks. If it exceeds ``threshold`` the models are
averaged and the average becomes the new reference. Quiet phases of training then cost
almost no communication; a huge threshold never averages (until ``finalize``), 0 averages
at every check where the replicas moved at all.

The distance is absolute, so a good threshold grows with the model's size and step size:
for the digits MLP (9.6k parameters, Adam at 3e-3, 2 ranks) eight steps drift about 1.0
early in training and less later; the default 0.1 then averages at most checks of the
first epochs and fewer as training settles.
"""
from __future__ import annotations

from typing import Any

from sparkddl.errors import CheckpointError
from sparkddl.strategies.base import Strategy
from sparkddl.strategies.tensors import (average_, broadcast_module, mean_over_ranks,
                                         model_state, squared_distance)


class DynamicAveraging(Strategy):
    name = "dynamic_averaging"
    replicas_differ = True
    OPTIONS = {"threshold": 0.1, "check_every": 8}

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.steps = 0
        self.syncs = 0  # since the last end_epoch
        self.state: list[Any] = []
        self.reference: list[Any] = []

    def check_options(self) -> None:
        self.check_number("threshold", 0)
        self.check_int("check_every", 1)

    def wrap(self, module: Any) -> Any:
        broadcast_module(module)
        self.state = model_state(module)
        self.reference = [t.detach().clone() for t in self.state]
        return module

    def step(self, optimizer: Any) -> None:
        optimizer.step()
        self.steps += 1
        due = self.steps % self.options["check_every"] == 0
        if due and self._drift() > self.options["threshold"]:
            self._average()
            self.syncs += 1

    def _drift(self) -> float:
        """Mean over ranks of each replica's squared distance from the reference."""
        return mean_over_ranks(squared_distance(self.state, self.reference), self.comm,
                               "the drift check")

    def _average(self) -> None:
        average_(self.state, self.comm)
        for ref, t in zip(self.reference, self.state):
            ref.copy_(t.detach())

    def end_epoch(self) -> dict[str, Any]:
        out = {**self.comm.take(), "syncs": self.syncs}
        self.syncs = 0
        return out

    def finalize(self, module: Any) -> None:
        self._average()

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps,
                "reference": [t.detach().cpu().clone() for t in self.reference]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["reference"]) != len(self.reference):
            raise CheckpointError(
                f"dynamic_averaging state holds {len(state['reference'])} reference tensors but "
                f"the wrapped model has {len(self.reference)}; restore the state of a run of "
                "the same model, after wrap()")
        self.steps = int(state["steps"])
        for ref, saved in zip(self.reference, state["reference"]):
            ref.copy_(saved)
