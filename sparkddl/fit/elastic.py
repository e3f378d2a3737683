"""Elastic fits (minWorkers < numWorkers): after a lost executor, the fit goes on with the
ranks whose slots there are, from the last checkpoint at an epoch's end.

The batch rule: the global batch (batchSize x numWorkers) is kept when the new world
divides it, so the optimizer sees the same steps (same learning rate); otherwise each rank
keeps its batchSize, the global batch shrinks with the world, and the learning rate is left
as it was (scale it in a callback if your schedule needs it). The shards are planned again
for the new world with equal steps on every rank; model, optimizer and schedule come from
the checkpoint; each remaining rank takes its own saved state (RNG, strategy state); the
ranks beyond the new world leave theirs.

Strategies whose ranks keep state the others cannot take over (a parameter server's
clocks, gossip partners, local replicas between averagings, sharded optimizer state) are
refused up front.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from sparkddl.config import TrainConfig
from sparkddl.errors import ConfigError

ELASTIC_STRATEGIES = ("allreduce",)


def is_elastic(config: TrainConfig) -> bool:
    return config.min_workers is not None and config.min_workers < config.num_workers


def check_elastic(config: TrainConfig) -> None:
    if is_elastic(config) and config.strategy not in ELASTIC_STRATEGIES:
        raise ConfigError(
            f"minWorkers={config.min_workers} < numWorkers={config.num_workers} (elastic) needs "
            f"strategy {' or '.join(ELASTIC_STRATEGIES)}; strategy {config.strategy!r} keeps "
            "per-rank state that a smaller world cannot take over. Set minWorkers to "
            "numWorkers (or leave it unset), or use strategy 'allreduce'")


def per_rank_batch(batch_size: int, num_workers: int, world: int) -> int:
    """The per-rank batch on ``world`` ranks (see the module's rule)."""
    total = batch_size * num_workers
    return total // world if total % world == 0 else batch_size


def resized(spec: Any, world: int, replan: Callable[[TrainConfig], Any]) -> Any:
    """The fit's original ``spec`` (a TrainSpec) for ``world`` ranks: the batch by the rule,
    the shards planned anew by ``replan(config)``."""
    base = spec.config
    if world == base.num_workers:
        return spec
    batch = per_rank_batch(base.batch_size, base.num_workers, world)
    config = dataclasses.replace(base, num_workers=world, batch_size=batch)
    return dataclasses.replace(spec, config=config, plan=replan(config))
