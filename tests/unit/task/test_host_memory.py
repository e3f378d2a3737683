"""Averaging through shared memory on three real processes (no Spark): the mean, the same bits
on every rank, buckets larger than a slot and every float type, nothing left in /dev/shm,
every rank falling back together when one cannot join, and a peer that leaves or falls out
of step named at once. One spawn (with a timeout): a hang fails instead of blocking."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest
import torch

from sparkddl.task import host_memory
from tests.unit.dist_harness import run_ranks

pytestmark = pytest.mark.skipif(not host_memory.usable_here(3, 3),
                                reason="needs Linux and a writable /dev/shm")

WORLD = 3
SPAWN_TIMEOUT_S = 120


def _inputs(rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(dtype)


def _open(rank: int, world: int, largest: int = 4096) -> Any:
    from sparkddl.task import context
    return host_memory.HostGroup.open(context.current().store, rank, world, 30.0, largest,
                                      "unit")


def _ranks(rank: int, world: int) -> dict:
    before = {n for n in os.listdir(host_memory.SHM_DIR) if n.startswith("sparkddl-unit")}
    # a slot of 4 KiB: a bucket of 10,000 floats goes through in ten pieces
    group = _open(rank, world)
    assert group is not None
    out: dict[str, Any] = {"left": sorted(
        n for n in os.listdir(host_memory.SHM_DIR)
        if n.startswith("sparkddl-unit") and n not in before)}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        flat = _inputs(rank, dtype, 10_000)
        out[str(dtype)] = group.average_(flat).clone()
    out["ops"] = group.ops

    # rank 1 cannot map the memory: every rank keeps the process group
    saved = host_memory._attach
    if rank == 1:
        host_memory._attach = lambda path, size: (None, "refused for the test")
    out["refused"] = _open(rank, world) is None
    host_memory._attach = saved

    # a rank that counts one average more than its peers: both sides say so
    skewed = _open(rank, world)
    if rank == 1:
        skewed.ops += 1
    try:
        skewed.average_(torch.ones(8))
        out["skew"] = ""
    except host_memory.HostMemoryError as exc:
        out["skew"] = str(exc)
    skewed.close()

    # rank 2 leaves (its task ended): the others fail at once, naming it
    if rank == 2:
        time.sleep(0.5)
        host_memory.close_all()
        out["lost"], out["lost_s"] = "", 0.0
    else:
        start = time.monotonic()
        try:
            group.average_(torch.ones(8))
            out["lost"] = ""
        except host_memory.HostMemoryError as exc:
            out["lost"] = str(exc)
        out["lost_s"] = time.monotonic() - start
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return run_ranks(_ranks, world_size=WORLD, timeout_s=SPAWN_TIMEOUT_S)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
def test_every_rank_gets_the_mean_in_the_same_bits(runs, dtype):
    # the sum of the rank's inputs, each divided by the world first, in rank order
    expected = _inputs(0, dtype, 10_000) / WORLD
    for r in range(1, WORLD):
        expected = expected + _inputs(r, dtype, 10_000) / WORLD
    for result in runs:
        assert torch.equal(result[str(dtype)], runs[0][str(dtype)])
    torch.testing.assert_close(runs[0][str(dtype)], expected, rtol=0, atol=0)
    exact = sum(_inputs(r, torch.float64, 10_000) for r in range(WORLD)) / WORLD
    torch.testing.assert_close(runs[0][str(dtype)].double(), exact,
                               rtol=2e-2 if dtype.itemsize == 2 else 1e-5, atol=1e-2)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_large_buckets_go_through_in_pieces_and_nothing_is_left_in_dev_shm(runs):
    assert runs[0]["ops"] == sum(-(-10_000 // (4096 // size)) for size in (4, 8, 2, 2))
    assert all(r["left"] == [] for r in runs)
    assert not [n for n in os.listdir(host_memory.SHM_DIR) if n.startswith("sparkddl-unit")]


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_one_rank_that_cannot_join_makes_every_rank_keep_the_process_group(runs):
    assert [r["refused"] for r in runs] == [True] * WORLD


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_ranks_out_of_step_are_told_so(runs):
    for rank in (0, 1):
        assert "out of step" in runs[rank]["skew"], runs[rank]["skew"]
        assert "same number of optimizer steps" in runs[rank]["skew"]


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_a_peer_that_leaves_is_named_at_once(runs):
    for rank in (0, 1):
        assert runs[rank]["lost"].startswith("rank 2 left the gradient average"), \
            runs[rank]["lost"]
        assert runs[rank]["lost_s"] < 20  # not the 30 s timeout


def test_a_world_across_hosts_or_of_one_never_forms_a_group():
    assert not host_memory.usable_here(1, 1)
    assert not host_memory.usable_here(4, 2)
    assert host_memory.usable_here(2, 2) == (sys.platform == "linux")
