"""Elastic fits: the batch rule and which strategies may shrink (no Spark)."""
from __future__ import annotations

import pytest

from sparkddl.config import TrainConfig
from sparkddl.errors import ConfigError
from sparkddl.fit.elastic import check_elastic, per_rank_batch


def test_the_global_batch_is_kept_where_the_new_world_divides_it():
    assert per_rank_batch(32, 2, 1) == 64  # 64 rows a step either way
    assert per_rank_batch(32, 4, 2) == 64
    assert per_rank_batch(30, 4, 3) == 40
    assert per_rank_batch(32, 3, 2) == 48


def test_otherwise_each_rank_keeps_its_batch():
    assert per_rank_batch(25, 3, 2) == 25  # 75 rows do not split over 2 ranks


def test_strategies_with_per_rank_state_refuse_min_workers_up_front():
    config = TrainConfig(features="f", num_workers=3, min_workers=2, strategy="ssp")
    with pytest.raises(ConfigError, match="strategy 'ssp' keeps per-rank state"):
        check_elastic(config)
    check_elastic(TrainConfig(features="f", num_workers=3, min_workers=2))  # allreduce
    check_elastic(TrainConfig(features="f", num_workers=3, strategy="ssp"))  # not elastic


def test_min_workers_above_num_workers_is_a_config_error():
    with pytest.raises(ConfigError, match="min_workers=3 is more than num_workers=2"):
        TrainConfig(features="f", num_workers=2, min_workers=3).validate()
