"""Averaging through shared memory on three real processes (no Spark): the mean, the same bits
on every rank, buckets larger than a slot and every float type, hundreds of averages with
one rank lagging at random, nothing named in /dev/shm, every rank falling back together when
one cannot join, and a peer that leaves or falls out of step named at once. One spawn (with
a timeout): a hang fails instead of blocking."""
from __future__ import annotations

import os
import random
import socket
import sys
import threading
import time
from typing import Any

import pytest
import torch

from sparkddl.task import host_memory
from tests.unit.dist_harness import run_ranks

pytestmark = pytest.mark.skipif(host_memory.usable_here() != "", reason="needs Linux")

WORLD = 3
SPAWN_TIMEOUT_S = 120


def _inputs(rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(dtype)


def _open(rank: int, world: int, largest: int = 4096, unable: str = "") -> Any:
    from sparkddl.task import context
    return host_memory.HostGroup.open(context.current().store, rank, world, 30.0, largest,
                                      unable)


def _lagging(rank: int, world: int, group: Any, ops: int = 300) -> bool:
    """``ops`` averages of a value new at each (rank * 1024 + op), rank 2 sleeping at random
    between its wait and its reads, and ranks 0 and 1 as fast as they go: a slot written
    again before rank 2 read it would show in rank 2's result (or theirs)."""
    meet = group._meet
    if rank == 2:
        def slow_meet() -> None:
            meet()
            time.sleep(random.random() * 0.002)
        group._meet = slow_meet
    good = True
    for op in range(ops):
        flat = torch.full((1000,), float(rank * 1024 + op), dtype=torch.float64)
        group.average_(flat)
        expected = torch.full((1000,), float(op), dtype=torch.float64) / world
        for r in range(1, world):
            expected = expected + torch.full((1000,), float(r * 1024 + op),
                                             dtype=torch.float64) / world
        good = good and torch.equal(flat, expected)
    group._meet = meet
    return good


def _impostor(n: int) -> None:
    """Connects to rank 1's socket of group ``n`` as soon as it is bound, claiming rank 2
    (with a store client of its own: a blocking get holds a client's socket)."""
    from datetime import timedelta

    import torch.distributed as dist

    from sparkddl.task import context
    ctx = context.current()
    store = dist.TCPStore(ctx.master_addr, ctx.master_port, is_master=False,
                          timeout=timedelta(seconds=30))
    nonce = store.get(f"sparkddl/host_memory/{n}/name").decode().split()[0]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(f"\0sparkddl-{nonce}-1")
            sock.sendall((2).to_bytes(4, "little"))
            time.sleep(3)  # held open while the group forms
            sock.close()
            return
        except OSError:
            sock.close()
            time.sleep(0.005)


def _ranks(rank: int, world: int) -> dict:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # a slot of 4 KiB: a bucket of 10,000 floats goes through in ten pieces
    group = _open(rank, world)
    assert group is not None
    out: dict[str, Any] = {"named": sorted(  # other processes' files come and go there
        n for n in (set(os.listdir("/dev/shm")) - before if os.path.isdir("/dev/shm") else ())
        if "sparkddl" in n)}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        flat = _inputs(rank, dtype, 10_000)
        out[str(dtype)] = group.average_(flat).clone()
    out["ops"] = group.ops
    out["lagging"] = _lagging(rank, world, group)

    # rank 1 cannot join (its parameters are elsewhere, say): every rank keeps gloo
    out["refused"] = _open(rank, world, unable="refused for the test" if rank == 1 else "")\
        is None

    # a rank that counts one average more than its peers: both sides say so
    skewed = _open(rank, world)
    if rank == 1:
        skewed.ops += 1
    try:
        skewed.average_(torch.ones(8))
        out["skew"] = ""
    except host_memory.HostMemoryError as exc:
        out["skew"] = str(exc)
    # every rank has looked before any closes: a rank that closed first would be seen as
    # leaving by a peer still writing to it
    torch.distributed.barrier()
    skewed.close()

    # another process (rank 0 here) connects to rank 1 first and claims to be rank 2: rank
    # 1 drops it (not rank 2's process), and the group forms with the real rank 2
    if rank == 0:
        thread = threading.Thread(target=_impostor, args=(4,), daemon=True)  # the 4th group
        thread.start()
    guarded = _open(rank, world)
    out["impostor"] = guarded is not None and torch.equal(
        guarded.average_(torch.full((8,), float(rank))), torch.full((8,), 1.0))
    if rank == 0:
        thread.join(timeout=20)
    if guarded is not None:
        guarded.close()

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
def test_large_buckets_go_through_in_pieces_and_nothing_is_named_in_dev_shm(runs):
    assert runs[0]["ops"] == sum(-(-10_000 // (4096 // size)) for size in (4, 8, 2, 2))
    assert all(r["named"] == [] for r in runs)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_a_rank_that_lags_at_random_never_reads_a_slot_written_again(runs):
    assert [r["lagging"] for r in runs] == [True] * WORLD


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_one_rank_that_cannot_join_makes_every_rank_keep_the_process_group(runs):
    assert [r["refused"] for r in runs] == [True] * WORLD


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_ranks_out_of_step_are_told_so(runs):
    for rank in (0, 1):
        assert "out of step" in runs[rank]["skew"], runs[rank]["skew"]
        assert "same number of optimizer steps" in runs[rank]["skew"]


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_a_process_that_claims_a_ranks_place_is_dropped(runs):
    assert [r["impostor"] for r in runs] == [True] * WORLD


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_a_peer_that_leaves_is_named_at_once(runs):
    for rank in (0, 1):
        assert runs[rank]["lost"].startswith("rank 2 left the gradient average"), \
            runs[rank]["lost"]
        assert runs[rank]["lost_s"] < 20  # not the 30 s timeout


def test_a_world_across_hosts_or_of_one_never_forms_a_group():
    assert not host_memory.one_host(1, 1)
    assert not host_memory.one_host(4, 2)
    assert host_memory.one_host(2, 2)
    assert (host_memory.usable_here() == "") == (sys.platform == "linux")
