"""The contract every training strategy implements, and communication accounting."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sparkddl.errors import ConfigError
from sparkddl.strategies.comm import CommStats
from sparkddl.strategies.tensors import average_, model_state


def option(default: Any, doc: str) -> Any:
    """A field of a strategy's ``Options``: its default and what it does."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def options_of(cls: type) -> list[dict[str, Any]]:
    """A strategy's options: name, type, default and description (for docs and errors)."""
    if getattr(cls, "Options", None) is None:
        return [{"name": k, "type": type(v).__name__, "default": v, "doc": ""}
                for k, v in cls.OPTIONS.items()]
    return [{"name": f.name, "type": str(f.type), "default": f.default,
             "doc": f.metadata.get("doc", "")} for f in dataclasses.fields(cls.Options)]


class Strategy:
    """How replicas are kept in agreement.

    The training loop calls ``wrap`` once, then per step ``backward(loss)`` followed by
    ``step(optimizer)``, ``end_epoch()`` after each epoch, ``snapshot_state`` for a snapshot
    taken during training, and ``finalize`` before the final weights are taken. ``Options``
    declares every option as a typed field of a frozen dataclass, with its default and
    description (``option``); ``OPTIONS`` (name -> default) is derived from it (a
    strategy may also set ``OPTIONS`` alone). ``self.options`` holds the values by name,
    ``self.settings`` the same as an ``Options``. ``state_dict`` holds tensors and plain
    values only (loadable with ``torch.load(weights_only=True)``); restore it with
    ``load_state_dict`` after ``wrap``.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type | None] = None
    OPTIONS: ClassVar[dict[str, Any]] = {}
    # True where replicas hold different models between synchronizations (model averaging)
    replicas_differ: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Options" in vars(cls) and cls.Options is not None:
            cls.OPTIONS = {f.name: f.default for f in dataclasses.fields(cls.Options)}

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            valid = ", ".join(self.OPTIONS) or "none"
            raise ConfigError(f"unknown option(s) {', '.join(map(repr, unknown))} for strategy "
                              f"{self.name!r}; valid options: {valid}")
        self.options = {**self.OPTIONS, **options}
        self.comm = CommStats()
        self.check_options()
        self.settings = self.Options(**self.options) if self.Options is not None else None

    def check_options(self) -> None:
        """Validate ``self.options``; raise ConfigError naming the option."""

    def check_int(self, name: str, minimum: int) -> None:
        value = self.options[name]
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        self._require(name, ok, f"an integer >= {minimum}")

    def check_number(self, name: str, low: float, high: float | None = None,
                     low_inclusive: bool = True) -> None:
        value = self.options[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and (value >= low if low_inclusive else value > low)
        ok = ok and (high is None or value <= high)
        expected = f"a number {'>=' if low_inclusive else '>'} {low:g}"
        if high is not None:
            expected += f" and <= {high:g}"
        self._require(name, ok, expected)

    def check_bool(self, name: str) -> None:
        self._require(name, isinstance(self.options[name], bool), "true or false")

    def check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        self._require(name, self.options[name] in choices, f"one of {', '.join(choices)}")

    def _require(self, name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise ConfigError(f"strategy {self.name!r} option {name}={self.options[name]!r} is "
                              f"invalid; expected {expected}")

    def check_device(self, device_type: str) -> None:
        """On the driver, before launching: raise ConfigError if this strategy cannot run on
        ``device_type`` ("cpu" or "cuda") with the installed torch."""

    def wrap(self, module: Any) -> Any:
        """Return the module to run forward/backward on (may be ``module`` itself)."""
        return module

    def backward(self, loss: Any) -> None:
        """Run the backward pass (strategies that communicate inside it mark that)."""
        loss.backward()

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def end_epoch(self) -> dict[str, Any]:
        return self.comm.take()

    def finalize(self, module: Any) -> None:
        """Make every replica hold the model users expect at the end of training."""

    def snapshot_state(self, module: Any) -> dict[str, Any]:
        """The model to hand to the driver during training (every rank calls it).

        Where replicas differ, the mean of the replicas, averaged on copies so training
        itself is untouched; otherwise the module's own state."""
        state = module.state_dict()
        if not self.replicas_differ:
            return state
        import torch

        with torch.no_grad():
            shared = model_state(module)
            copies = [t.detach().clone() for t in shared]
            average_(copies, self.comm, what="averaging the replicas for a snapshot")
            mean = {(t.data_ptr(), tuple(t.shape)): c for t, c in zip(shared, copies)}
        return {k: mean.get((v.data_ptr(), tuple(v.shape)), v) for k, v in state.items()}

    def no_sync(self) -> Any:
        """Context for the backward passes of micro-batches that accumulate gradients
        (``backwardPassesPerStep``): no communication inside it. The strategy's own ``step``
        runs once per optimizer step, after the last micro-batch."""
        import contextlib
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: list[Any], max_norm: float) -> float:
        """Clip the (synchronized) gradients to a total norm; returns the norm before."""
        import torch
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        """The whole model's state (every rank calls it; sharded strategies gather here).
        Tensors may stay on the device; callers move them."""
        return module.state_dict()

    def optimizer_state_dict(self, module: Any, optimizer: Any) -> dict[str, Any]:
        """The optimizer's state for a checkpoint (every rank calls it)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, module: Any, optimizer: Any,
                                  state: dict[str, Any]) -> None:
        """Restore what ``optimizer_state_dict`` saved (after ``wrap``)."""
        optimizer.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
