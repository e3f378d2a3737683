"""Dynamic averaging (Kamp et al., 2018): average the models only when they have drifted.

Every ``check_every`` steps each rank measures how far its model has moved from the last
model all ranks agreed on (squared L2 distance over parameters and floating-point buffers);
one 8-byte allreduce gives the mean over ranks. If it exceeds ``threshold`` the models are
averaged and the average becomes the new reference. Quiet phases of training then cost
almost no communication; a huge threshold never averages (until ``finalize``), 0 averages
at every check where the replicas moved at all.

The distance is absolute, so a good threshold grows with the model's size and step size:
for the digits MLP (9.6k parameters, Adam at 3e-3, 2 ranks) eight steps drift about 1.3 in
the first epoch and 0.1 by the twelfth, and a fixed 0.1 averaged at almost every check,
like local SGD with ``period=check_every``; a 4.7x larger MLP drifts more still. So the
default, ``threshold="auto"``, takes the drift measured at the first check: the models are
averaged whenever they have moved, since the last average, as far as they moved in their
first ``check_every`` steps (while training moves fast that is every check or two, later
every several). It is kept in checkpoints, so a resumed run goes on with the same value.

Each epoch's history row carries the median ``drift`` measured at its checks (and
``checks``, ``syncs``), to choose a fixed threshold from. The distance from the reference,
not the replicas' spread, is what gives the schedule its shape: most of it is movement all
replicas share, which shrinks as training converges, while their spread stayed between
0.034 and 0.069 over all twelve epochs of the digits run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkddl.errors import CheckpointError
from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.tensors import (
    average_,
    broadcast_module,
    mean_over_ranks,
    model_state,
    squared_distance,
)


class DynamicAveraging(Strategy):
    name = "dynamic_averaging"
    replicas_differ = True
    @dataclass(frozen=True)
    class Options:
        threshold: float | str = option("auto", "mean squared drift from the last average "
                                        "above which models are averaged; auto: learned "
                                        "from the first checks")
        check_every: int = option(8, "steps between drift checks")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.steps = 0
        self.syncs = 0  # since the last end_epoch
        self.drifts: list[float] = []  # since the last end_epoch: the drift at each check
        threshold = self.options["threshold"]
        self.threshold = None if threshold == "auto" else float(threshold)
        self.state: list[Any] = []
        self.reference: list[Any] = []

    def check_options(self) -> None:
        value = self.options["threshold"]
        if value != "auto":
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            self._require("threshold", number and value >= 0, "a number >= 0 or \"auto\"")
        self.check_int("check_every", 1)

    def wrap(self, module: Any) -> Any:
        broadcast_module(module)
        self.state = model_state(module)
        self.reference = [t.detach().clone() for t in self.state]
        return module

    def step(self, optimizer: Any) -> None:
        optimizer.step()
        self.steps += 1
        if self.steps % self.options["check_every"] == 0:
            self.drifts.append(self._drift())
            if self.threshold is None:  # "auto": the first check sets it
                self.threshold = self.drifts[-1]
            if self.drifts[-1] > self.threshold:
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
        drifts = sorted(self.drifts)
        out = {**self.comm.take(), "syncs": self.syncs, "checks": len(drifts),
               "drift": drifts[len(drifts) // 2] if drifts else 0.0,
               "threshold": self.threshold if self.threshold is not None else 0.0}
        self.syncs, self.drifts = 0, []
        return out

    def finalize(self, module: Any) -> None:
        self._average()

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "threshold": self.threshold,
                "reference": [t.detach().cpu().clone() for t in self.reference]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["reference"]) != len(self.reference):
            raise CheckpointError(
                f"dynamic_averaging state holds {len(state['reference'])} reference tensors but "
                f"the wrapped model has {len(self.reference)}; restore the state of a run of "
                "the same model, after wrap()")
        self.steps = int(state["steps"])
        if self.options["threshold"] == "auto" and state.get("threshold") is not None:
            self.threshold = float(state["threshold"])
        for ref, saved in zip(self.reference, state["reference"]):
            ref.copy_(saved)
