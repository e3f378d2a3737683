"""Strategy names and options: what is unknown or invalid is named with what is valid (no
processes)."""
from __future__ import annotations

import pytest

from sparkddl import strategies
from sparkddl.errors import ConfigError

# ---- configuration errors (no processes) ----

def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown strategy 'gosip'; choose one of allreduce, "
                                          r"local_sgd, dynamic_averaging, gossip, ssp"):
        strategies.create("gosip")


@pytest.mark.parametrize("name,options,valid", [
    ("allreduce", {"bucket_size": 1}, "bucket_cap_mb, overlap, compression, rank, ratio"),
    ("local_sgd", {"periode": 4}, "period, warmup_steps, average_optimizer_state"),
    ("dynamic_averaging", {"treshold": 1}, "threshold, check_every"),
    ("gossip", {"graph": "ring"}, "topology"),
    ("ssp", {"stale": 1}, "staleness, min_staleness"),
])
def test_unknown_options_list_the_valid_ones(name, options, valid):
    with pytest.raises(ConfigError, match=f"unknown option.*{name}.*valid options: {valid}"):
        strategies.create(name, options)


@pytest.mark.parametrize("name,options,message", [
    ("local_sgd", {"period": 0}, r"option period=0 is invalid; expected an integer >= 1"),
    ("local_sgd", {"period": 2.5}, r"option period=2.5 is invalid"),
    ("local_sgd", {"average_optimizer_state": "yes"}, r"average_optimizer_state='yes'"),
    ("allreduce", {"compression": "topk", "ratio": 1.5},
     r"option ratio=1.5 is invalid; expected a number > 0 and <= 1"),
    ("allreduce", {"compression": "powersgd", "rank": 0}, r"option rank=0 is invalid"),
    ("allreduce", {"compression": "zip"}, r"compression='zip' is invalid; expected one of none, "
                                          r"fp16, bf16, powersgd, topk, sign"),
    ("allreduce", {"overlap": 1}, r"option overlap=1 is invalid; expected true or false"),
    ("allreduce", {"bucket_cap_mb": 0}, r"bucket_cap_mb=0 is invalid; expected a number > 0"),
    ("allreduce", {"ratio": 0.1}, r"option ratio only applies with compression=topk"),
    ("allreduce", {"compression": "fp16", "rank": 4}, r"rank only applies with "
                                                      r"compression=powersgd"),
    ("dynamic_averaging", {"threshold": -1}, r"threshold=-1 is invalid; expected a number >= 0"),
    ("dynamic_averaging", {"threshold": "high"},
     r"threshold='high' is invalid; expected a number >= 0 or \"auto\""),
    ("dynamic_averaging", {"check_every": 0}, r"check_every=0 is invalid"),
    ("gossip", {"topology": "star"}, r"topology='star' is invalid; expected one of ring, "
                                     r"exponential"),
    ("ssp", {"staleness": -1}, r"staleness=-1 is invalid; expected an integer >= 0"),
    ("ssp", {"min_staleness": -1}, r"min_staleness=-1 is invalid; expected an integer >= 0"),
    ("ssp", {"staleness": 2, "min_staleness": 3},
     r"min_staleness=3 is above staleness=2; the lower bound must be <= staleness"),
])
def test_bad_option_values_name_the_option(name, options, message):
    with pytest.raises(ConfigError, match=message):
        strategies.create(name, options)
