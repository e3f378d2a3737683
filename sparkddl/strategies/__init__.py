"""Training strategies, chosen by name (``strategy=``) with options (``strategyOptions=``).

:func:`describe` lists them with what each does; :func:`register` adds your own (a
:class:`Strategy` subclass with a ``name`` and its ``OPTIONS``), usable as a decorator. A fit
carries the strategies registered on the driver to its ranks, so a class defined in a
notebook works on the executors too."""
from __future__ import annotations

import sys
from typing import Any

from sparkddl.errors import ConfigError
from sparkddl.strategies.allreduce import AllReduce
from sparkddl.strategies.base import Strategy
from sparkddl.strategies.comm import CommStats
from sparkddl.strategies.dynamic import DynamicAveraging
from sparkddl.strategies.fsdp import FullyShardedDataParallel
from sparkddl.strategies.gossip import Gossip
from sparkddl.strategies.local_sgd import LocalSGD
from sparkddl.strategies.ssp import StaleSynchronous

BUILT_IN: tuple[type[Strategy], ...] = (AllReduce, LocalSGD, DynamicAveraging, Gossip,
                                        StaleSynchronous, FullyShardedDataParallel)
REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in BUILT_IN}

__all__ = ["BUILT_IN", "CommStats", "REGISTRY", "Strategy", "create", "describe", "register",
           "registered"]


def register(cls: type[Strategy]) -> type[Strategy]:
    """Make ``cls`` choosable as ``strategy=cls.name``; returns it (a decorator too).
    Registering a class again under its name replaces it; a built-in name is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ConfigError(f"register() takes a subclass of sparkddl.strategies.Strategy, got "
                          f"{cls!r}")
    if not isinstance(cls.name, str) or not cls.name:
        raise ConfigError(f"strategy class {cls.__name__} needs a name: set the class "
                          "attribute name = 'my_strategy'")
    builtin = {c.name: c for c in BUILT_IN}
    if cls.name in builtin and builtin[cls.name] is not cls:
        raise ConfigError(f"strategy name {cls.name!r} is built in; give {cls.__name__} "
                          "another name")
    REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Strategy]]:
    """The strategies registered here beyond the built-in ones (what a fit ships)."""
    return {name: cls for name, cls in REGISTRY.items() if cls not in BUILT_IN}


def describe() -> dict[str, str]:
    """Every strategy's name and what it does: the first line of its class docstring, else
    of its module's."""
    def first_line(cls: type[Strategy]) -> str:
        doc = cls.__doc__ or getattr(sys.modules.get(cls.__module__), "__doc__", "") or ""
        return (doc.strip().splitlines() or [""])[0]
    return {name: first_line(cls) for name, cls in REGISTRY.items()}


def create(name: str, options: dict[str, Any] | None = None) -> Strategy:
    """The strategy ``name`` with ``options``; unknown names and options list the valid ones."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(REGISTRY)} "
                          "(or register your own with sparkddl.strategies.register)")
    return cls(**(options or {}))
