"""Model averaging on two local gloo ranks (no Spark): local SGD, dynamic averaging and gossip
train, keep their replicas as they should, and snapshot the mean of the replicas."""
from __future__ import annotations

import pytest
import torch

from sparkddl.strategies.gossip import peer_offsets
from tests.unit.dist_harness import run_ranks
from tests.unit.strategies.harness import SPAWN_TIMEOUT_S, TEST_TIMEOUT_S, _flat, _mlp, _run

# ---- rank functions (one spawn each) ----


def _model_averaging(rank: int, world: int) -> dict:
    fast_decay = [0.1, 0.1, 0.001, 0.001]
    return {
        "local_sgd": _run("local_sgd", {"period": 4, "warmup_steps": 2,
                                        "average_optimizer_state": True}, rank, [0.05] * 4,
                          momentum=0.9),
        "dynamic_never": _run("dynamic_averaging", {"threshold": 1e12, "check_every": 4},
                              rank, [0.05] * 4),
        "dynamic_always": _run("dynamic_averaging", {"threshold": 0.0, "check_every": 4},
                               rank, [0.05] * 4),
        "dynamic_auto": _run("dynamic_averaging", {"check_every": 4}, rank, [0.05] * 4),
        "gossip_ring": _run("gossip", {}, rank, fast_decay),
        "gossip_exponential": _run("gossip", {"topology": "exponential"}, rank, [0.05] * 4),
    }


# ---- fixtures: one spawn per family of checks ----


@pytest.fixture(scope="module")
def averaging():
    return run_ranks(_model_averaging, timeout_s=SPAWN_TIMEOUT_S)


# ---- model averaging: local SGD, dynamic averaging, gossip ----

@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("label", ["local_sgd", "dynamic_never", "dynamic_always",
                                   "dynamic_auto", "gossip_ring", "gossip_exponential"])
def test_model_averaging_trains_and_finalize_agrees(averaging, label):
    runs = [r[label] for r in averaging]
    rows = runs[0]["rows"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], rows
    assert not torch.equal(runs[0]["params"], _flat(_mlp()))
    torch.testing.assert_close(runs[0]["params"], runs[1]["params"], rtol=0, atol=1e-7)
    assert all(r["roundtrip"] for r in runs)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("label", ["local_sgd", "dynamic_never", "gossip_ring"])
def test_snapshots_during_training_are_the_mean_of_the_replicas(averaging, label):
    probes = [r[label]["probe"] for r in averaging]
    assert not torch.allclose(probes[0]["local"], probes[1]["local"])  # replicas differ here
    mean = (probes[0]["local"] + probes[1]["local"]) / 2
    for probe in probes:
        assert probe["untouched"]  # averaged on copies: training goes on from its replica
        torch.testing.assert_close(probe["snapshot"], mean, rtol=0, atol=1e-6)
    if label != "gossip_ring":  # no step between the probe and finalize's average
        torch.testing.assert_close(averaging[0][label]["params"], mean, rtol=0, atol=1e-6)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_dynamic_averaging_syncs_by_threshold(averaging):
    for result in averaging:
        assert [row["syncs"] for row in result["dynamic_never"]["rows"]] == [0, 0, 0, 0]
        assert [row["comm_bytes"] for row in result["dynamic_never"]["rows"]] == [32] * 4
        assert [row["syncs"] for row in result["dynamic_always"]["rows"]] == [4, 4, 4, 4]
        state = result["dynamic_always"]["state"]
        assert state["steps"] == 64 and len(state["reference"]) == 4
        for label in ("dynamic_never", "dynamic_always"):
            rows = result[label]["rows"]
            assert [row["checks"] for row in rows] == [4] * 4
            assert all(row["drift"] > 0 for row in rows)
        # never averaged, the replicas keep moving away from the initial reference
        never = [row["drift"] for row in result["dynamic_never"]["rows"]]
        assert never[-1] > never[0]
    for result in averaging:  # "auto": the first check's drift, kept for the whole run
        rows = result["dynamic_auto"]["rows"]
        assert rows[0]["threshold"] > 0 and len({row["threshold"] for row in rows}) == 1
        assert result["dynamic_auto"]["state"]["threshold"] == rows[0]["threshold"]
        assert rows[0]["syncs"] < rows[0]["checks"]  # the first check only sets it
        assert 0 < sum(row["syncs"] for row in rows) < sum(row["checks"] for row in rows)
    # the drift is the mean over ranks: both report the same
    assert [r["drift"] for r in averaging[0]["dynamic_never"]["rows"]] == \
        [r["drift"] for r in averaging[1]["dynamic_never"]["rows"]]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_gossip_consensus_distance_shrinks_when_the_learning_rate_decays(averaging):
    rows = averaging[0]["gossip_ring"]["rows"]
    distances = [row["consensus_distance"] for row in rows]
    assert distances[0] > 0
    assert distances[3] < distances[1] / 10, distances
    model_bytes = sum(p.numel() * 4 for p in _mlp().parameters())
    assert rows[0]["comm_bytes"] == 16 * model_bytes  # one neighbour when there are 2 ranks
    assert rows[0]["control_bytes"] == model_bytes + 8


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_local_sgd_averages_every_period_after_warmup(averaging):
    rows = averaging[0]["local_sgd"]["rows"]
    model_bytes = sum(p.numel() * 4 for p in _mlp().parameters())
    # epoch 1: 2 synchronous steps, then averages after steps 6, 10, 14 (model + momentum)
    assert rows[0]["comm_bytes"] == 2 * model_bytes + 3 * 2 * model_bytes
    assert rows[1]["comm_bytes"] == 4 * 2 * model_bytes


def test_gossip_topologies():
    assert peer_offsets("ring", 2) == [1]
    assert peer_offsets("ring", 8) == [1, 7]
    assert peer_offsets("exponential", 8) == [1, 2, 4]
    assert peer_offsets("exponential", 6) == [1, 2, 4]
    assert peer_offsets("ring", 1) == peer_offsets("exponential", 1) == []
