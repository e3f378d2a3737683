"""The model, optimizer, loss and metrics of a training job, in a form that travels.

Users give objects (a module or factory, an optimizer factory or instance, a loss module or
callable, metric names or callables) or, from presets, names. Everything is normalized on
the driver into picklable recipes that the ranks rebuild identically.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from sparkddl.errors import ConfigError

LOSSES = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss", "l1": "L1Loss",
          "bce_with_logits": "BCEWithLogitsLoss", "nll": "NLLLoss", "smooth_l1": "SmoothL1Loss"}
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop",
              "adagrad": "Adagrad"}


@dataclass
class OptimizerRecipe:
    """Rebuilds an optimizer on the ranks: a factory, or a class with all its settings."""

    factory: Callable[..., Any] | None = None
    cls: Any = None
    settings: dict[str, Any] = field(default_factory=dict)

    def build(self, params: Any, learning_rate: float | None = None) -> Any:
        opt = self.factory(params) if self.factory is not None else self.cls(params,
                                                                             **self.settings)
        if learning_rate is not None:  # asked for explicitly: not a silent rescaling
            for group in opt.param_groups:
                group["lr"] = learning_rate
        return opt


def model_factory(model: Any) -> Callable[[], Any]:
    """A zero-argument callable returning a fresh module (a module is deep-copied)."""
    import torch.nn as nn

    if isinstance(model, nn.Module):
        return _Copier(model)
    if isinstance(model, str):
        from sparkddl.models import build_model
        return _Copier(build_model(model))
    if callable(model):
        return model
    raise ConfigError(f"model must be a torch.nn.Module or a zero-argument factory returning "
                      f"one, got {type(model).__name__}")


class _Copier:
    def __init__(self, module: Any):
        self.module = module

    def __call__(self) -> Any:
        return copy.deepcopy(self.module)


def build_module(factory: Callable[[], Any]) -> Any:
    import torch.nn as nn
    try:
        module = factory()
    except Exception as exc:
        raise ConfigError(f"the model factory failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise ConfigError(f"the model factory returned a {type(module).__name__}, not a "
                          "torch.nn.Module")
    return module


def optimizer_recipe(optimizer: Any, **settings: Any) -> OptimizerRecipe:
    import torch

    if isinstance(optimizer, OptimizerRecipe):
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = optimizer.param_groups
        for g in groups:
            differs = {k: g[k] for k in optimizer.defaults
                       if k in g and g[k] != optimizer.defaults[k]}
            if differs:
                raise ConfigError(
                    f"the {type(optimizer).__name__} instance has parameter groups with their own "
                    f"settings ({differs}); pass a factory instead, e.g. "
                    "optimizer=lambda params: torch.optim.SGD(params, lr=...)")
        return OptimizerRecipe(cls=type(optimizer), settings=dict(optimizer.defaults))
    if isinstance(optimizer, str):
        name = OPTIMIZERS.get(optimizer.lower())
        if name is None:
            raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of "
                              f"{', '.join(OPTIMIZERS)} or pass a factory")
        return OptimizerRecipe(cls=getattr(torch.optim, name), settings=settings)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return OptimizerRecipe(cls=optimizer, settings=settings)
    if callable(optimizer):
        return OptimizerRecipe(factory=optimizer)
    raise ConfigError(f"optimizer must be a factory taking the model's parameters, an "
                      f"optimizer instance or a name, got {type(optimizer).__name__}")


# torch.optim.Optimizer's methods that torch wraps in torch._disable_dynamo
DYNAMO_DISABLED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


@contextmanager
def dynamo_left_unloaded() -> Iterator[None]:
    """While the driver builds throwaway optimizers to check them, their methods run as they
    are instead of importing torch._dynamo first.

    torch wraps ``Optimizer.add_param_group`` (and a few more) so that the first call imports
    torch._dynamo, only to run the method outside dynamo's tracing. That import is about a
    second of CPU, more than the rest of torch's. On a cold fit it came while the executors'
    Python workers imported torch on the same cores, and it made the executors' check
    0.3-0.4 s longer on 2 cores. Nothing is traced during the check, so the methods need no
    disabling. The wrapper caches what it would call as ``fn.__dynamo_disable``: set to the
    method itself for the check's duration and removed after, it skips the import. Where
    torch._dynamo is loaded already, or the wrappers are not as expected, nothing changes.
    """
    import sys

    import torch

    if "torch._dynamo" in sys.modules:
        yield
        return
    patched = []
    for name in DYNAMO_DISABLED:
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(fn) and getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", fn)  # the name torch reads, unmangled
            patched.append(fn)
    try:
        yield
    finally:
        for fn in patched:
            if getattr(fn, "__dynamo_disable", None) is fn:
                delattr(fn, "__dynamo_disable")


def check_optimizer(recipe: OptimizerRecipe, module: Any, learning_rate: float | None) -> Any:
    """Build it once on the driver against the real parameters: fail here, not on the ranks.
    Returns that throwaway optimizer (the scheduler's check builds on it)."""
    import torch
    try:
        with dynamo_left_unloaded():
            opt = recipe.build(module.parameters(), learning_rate)
    except Exception as exc:
        raise ConfigError(f"the optimizer could not be built on the model's parameters: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"the optimizer factory returned a {type(opt).__name__}, not a "
                          "torch.optim.Optimizer")
    return opt


def resolve_loss(loss: Any) -> Callable[..., Any]:
    import torch.nn as nn
    if isinstance(loss, str):
        name = LOSSES.get(loss.lower())
        if name is None:
            raise ConfigError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)} or pass "
                              "a module or callable")
        return getattr(nn, name)()
    if callable(loss):
        return loss
    raise ConfigError(f"loss must be a module, a callable (output, label) -> scalar, or a name; "
                      f"got {type(loss).__name__}")
