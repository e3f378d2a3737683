"""Training strategies, chosen by name (``strategy=``) with options (``strategyOptions=``)."""
from __future__ import annotations

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

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (AllReduce, LocalSGD, DynamicAveraging, Gossip, StaleSynchronous,
                              FullyShardedDataParallel)}

__all__ = ["CommStats", "REGISTRY", "Strategy", "create"]


def create(name: str, options: dict[str, Any] | None = None) -> Strategy:
    """The strategy ``name`` with ``options``; unknown names and options list the valid ones."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(REGISTRY)}")
    return cls(**(options or {}))
