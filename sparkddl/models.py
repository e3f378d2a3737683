"""Built-in small models, and building a model from a name or an import target.

Built-in models remember their constructor arguments, so a saved TorchModel can rebuild
them by import, without unpickling code.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

from sparkddl.errors import ConfigError


class _Configured:
    """Mixin: the import target and keyword arguments that rebuild this module."""

    config: dict[str, Any]

    def sparkddl_config(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}:{type(self).__qualname__}", dict(self.config)


def _torch_nn() -> Any:
    import torch.nn as nn
    return nn


class MLP(_Configured, _torch_nn().Module):
    """Fully connected: in_features -> hidden... -> out_features, ReLU between layers."""

    def __init__(self, in_features: int, hidden: Iterable[int] = (128,), out_features: int = 10,
                 dropout: float = 0.0):
        super().__init__()
        nn = _torch_nn()
        hidden = [int(h) for h in hidden]
        self.config = {"in_features": int(in_features), "hidden": hidden,
                       "out_features": int(out_features), "dropout": float(dropout)}
        layers: list[Any] = []
        width = int(in_features)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, int(out_features)))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Any) -> Any:
        return self.net(x.flatten(1))


class CNN(_Configured, _torch_nn().Module):
    """Two 3x3 conv blocks and a linear head, for small square images [C, S, S] (or flat
    vectors of C*S*S values, reshaped)."""

    def __init__(self, in_channels: int = 1, image_size: int = 8,
                 channels: Iterable[int] = (16, 32), out_features: int = 10):
        super().__init__()
        nn = _torch_nn()
        channels = [int(c) for c in channels]
        self.config = {"in_channels": int(in_channels), "image_size": int(image_size),
                       "channels": channels, "out_features": int(out_features)}
        blocks: list[Any] = []
        width = int(in_channels)
        for c in channels:
            blocks += [nn.Conv2d(width, c, 3, padding=1), nn.ReLU()]
            width = c
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(2))
        self.head = nn.Linear(width * 4, int(out_features))

    def forward(self, x: Any) -> Any:
        c, s = self.config["in_channels"], self.config["image_size"]
        x = x.reshape(-1, c, s, s)
        return self.head(self.features(x).flatten(1))


BUILTIN: dict[str, Callable[..., Any]] = {"mlp": MLP, "cnn": CNN}


def import_target(target: str) -> Any:
    """``package.module:attribute`` -> the attribute, with errors naming what failed."""
    if ":" not in target:
        raise ConfigError(f"model {target!r} is neither a built-in ({', '.join(BUILTIN)}) nor "
                          "an import target of the form package.module:factory")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for model {target!r}: {exc}") \
            from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r} "
                              f"(model {target!r})")
        obj = getattr(obj, part)
    return obj


class NamedModel:
    """A zero-argument factory for a model given by name, which saves by name too."""

    def __init__(self, name: str, **kwargs: Any):
        self.name, self.kwargs = name, kwargs
        build_model(name, **kwargs)  # fail now, on the driver, with the explanatory error

    def __call__(self) -> Any:
        return build_model(self.name, **self.kwargs)

    def sparkddl_config(self) -> tuple[str, dict[str, Any]]:
        factory = BUILTIN.get(self.name.lower())
        target = f"{factory.__module__}:{factory.__qualname__}" if factory else self.name
        return target, dict(self.kwargs)


def build_model(name: str, **kwargs: Any) -> Any:
    """A built-in model by name (``mlp``, ``cnn``) or a factory by import target."""
    factory = BUILTIN.get(name.lower()) if ":" not in name else import_target(name)
    if factory is None:
        import_target(name)  # raises the explanatory error
    try:
        return factory(**kwargs)  # pyright: ignore[reportOptionalCall] - import_target raised
    except TypeError as exc:
        raise ConfigError(f"cannot build model {name!r} with {kwargs}: {exc}") from exc
