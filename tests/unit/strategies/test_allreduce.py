"""Synchronous allreduce on two local gloo ranks (no Spark), with every compression and with
and without overlap: equivalence with one rank on the whole batch, training, bytes per epoch.
Each fixture spawns the ranks once (with a timeout); a hang fails instead of blocking."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparkddl import strategies
from tests.unit.dist_harness import run_ranks
from tests.unit.strategies.harness import (
    COMPRESSIONS,
    SPAWN_TIMEOUT_S,
    TEST_TIMEOUT_S,
    _fit,
    _flat,
    _mlp,
    _regression,
    _run,
)

# ---- rank functions (one spawn each) ----


def _allreduce_variants(warmup_steps: int) -> Any:
    """((compression, overlap), options) for every compression, with and without overlap."""
    for compression in COMPRESSIONS:
        for overlap in (True, False):
            options = {"compression": compression, "overlap": overlap}
            if compression != "none":
                options["warmup_steps"] = warmup_steps
            yield (compression, overlap), options


def _equivalence(rank: int, world: int) -> dict:
    """Parameters after five steps on 2 x batch 4, for every compression and overlap mode."""
    x, y = _regression(0, 1, 8)[0]
    mine = slice(rank * 4, rank * 4 + 4)
    out = {}
    for key, options in _allreduce_variants(warmup_steps=1):
        module = _mlp()
        strategy = strategies.create("allreduce", options)
        _fit(strategy, module, [(x[mine], y[mine])] * 5, [0.1])
        out[key] = _flat(module)
        out[("shared memory",) + key] = strategy.host is not None
    for overlap in (True, False):  # the process group (gloo) instead of shared memory
        module = _mlp()
        _fit(strategies.create("allreduce", {"overlap": overlap, "shared_memory": False}),
             module, [(x[mine], y[mine])] * 5, [0.1])
        out[("gloo", overlap)] = _flat(module)
    for shared in (True, False):
        out[("sparse", shared)] = _sparse_embedding(rank, shared)
    return out


def _sparse_embedding(rank: int, shared: bool) -> torch.Tensor:
    """Five steps of an embedding with sparse gradients (its own bucket) and a dense layer."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.EmbeddingBag(20, 4, mode="sum", sparse=True), nn.Linear(4, 1))
    strategy = strategies.create("allreduce", {"shared_memory": shared})
    wrapped = strategy.wrap(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        ids = torch.randint(0, 20, (6, 3), generator=gen)
        optimizer.zero_grad()
        strategy.backward(wrapped(ids).square().mean())
        strategy.step(optimizer)
    return _flat(module)


def _compressed_training(rank: int, world: int) -> dict:
    return {key: _run("allreduce", options, rank, [0.05] * 4)
            for key, options in _allreduce_variants(warmup_steps=2)}


def _allreduce_family(rank: int, world: int) -> dict:
    return {"equivalence": _equivalence(rank, world),
            "training": _compressed_training(rank, world)}


def _bytes_per_epoch(rank: int, world: int) -> dict:
    """Two epochs of eight steps on a model of three 1024 x 1024 layers: comm per epoch."""
    configs = {"allreduce": ("allreduce", {"shared_memory": False}),  # DDP's own reduction
               "shared_memory": ("allreduce", {}),
               "no_overlap": ("allreduce", {"overlap": False}),
               "local_sgd": ("local_sgd", {"period": 8})}
    for compression in COMPRESSIONS[1:]:
        configs[compression] = ("allreduce", {"compression": compression, "warmup_steps": 4})
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(4, 1024, generator=gen), torch.randn(4, 1024, generator=gen))
               for _ in range(8)]
    out = {}
    for label, (name, options) in configs.items():
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                               nn.ReLU(), nn.Linear(1024, 1024))
        out[label] = _fit(strategies.create(name, options), module, batches, [0.01, 0.01])
    return out


# ---- fixtures: one spawn per family of checks ----


@pytest.fixture(scope="module")
def allreduce_runs():
    return run_ranks(_allreduce_family, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def equivalence(allreduce_runs):
    return [r["equivalence"] for r in allreduce_runs]


@pytest.fixture(scope="module")
def compressed(allreduce_runs):
    return [r["training"] for r in allreduce_runs]


@pytest.fixture(scope="module")
def comm_bytes():
    return run_ranks(_bytes_per_epoch, timeout_s=SPAWN_TIMEOUT_S)


# ---- synchronous allreduce ----

@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("overlap", [True, False])
def test_two_ranks_match_one_rank_with_the_whole_batch(equivalence, overlap):
    x, y = _regression(0, 1, 8)[0]
    module = _mlp()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        F.mse_loss(module(x), y).backward()
        optimizer.step()
    for rank_result in equivalence:
        torch.testing.assert_close(rank_result[("none", overlap)], _flat(module), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("overlap", [True, False])
def test_shared_memory_gives_the_bits_gloo_gives(equivalence, overlap):
    """Two ranks on one host average through shared memory (compression none), and train to
    exactly the weights the gloo allreduce gives; a compression keeps its collectives."""
    for rank_result in equivalence:
        assert rank_result[("shared memory", "none", overlap)]
        assert not rank_result[("shared memory", "fp16", overlap)]
        assert torch.equal(rank_result[("none", overlap)], rank_result[("gloo", overlap)])


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_sparse_gradients_go_through_the_process_group_beside_shared_memory(equivalence):
    for rank_result in equivalence:
        assert torch.equal(rank_result[("sparse", True)], rank_result[("sparse", False)])
    assert torch.equal(equivalence[0][("sparse", True)], equivalence[1][("sparse", True)])


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("compression", COMPRESSIONS[1:])
def test_compression_is_the_same_with_and_without_overlap(equivalence, compression):
    """The small model fits one bucket either way, so the DDP hook and the no-overlap path
    must hand the codec the same gradients, parameter keys and shapes."""
    for rank_result in equivalence:
        torch.testing.assert_close(rank_result[(compression, True)],
                                   rank_result[(compression, False)], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(equivalence[0][(compression, True)],
                              equivalence[0][("none", True)], rtol=0, atol=1e-6)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_compression_trains_and_keeps_replicas_identical(compressed, compression,
                                                                overlap):
    runs = [r[(compression, overlap)] for r in compressed]
    rows = runs[0]["rows"]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], rows
    torch.testing.assert_close(runs[0]["params"], runs[1]["params"], rtol=0, atol=0)
    assert all(r["roundtrip"] for r in runs)
    state = runs[0]["state"]
    assert state["steps"] == 64
    n_params = len(list(_mlp().parameters()))
    if compression in ("topk", "sign"):  # a residual for every parameter
        assert sorted(state["codec"]["residual"]) == list(range(n_params))
    if compression == "powersgd":  # residual and warm-start factor for the 32 x 8 weight only
        assert list(state["codec"]["residual"]) == list(state["codec"]["q"]) == [0]
        assert state["codec"]["q"][0].shape == (8, 2)


# ---- bytes per epoch ----

def _epoch_bytes(runs: list, label: str, epoch: int = 1) -> int:
    return runs[0][label][epoch]["comm_bytes"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_bytes_per_epoch_follow_the_strategy(comm_bytes):
    full = _epoch_bytes(comm_bytes, "allreduce")
    ratio = {label: _epoch_bytes(comm_bytes, label) / full for label in comm_bytes[0]}
    print("bytes per epoch relative to allreduce:",
          {k: round(v, 4) for k, v in ratio.items()})
    assert full >= 8 * 3 * 1024 * 1025 * 4  # eight steps of the whole model
    assert ratio["no_overlap"] == ratio["shared_memory"] == 1.0
    assert ratio["local_sgd"] <= 1 / 8 * 1.01
    assert 0.49 <= ratio["fp16"] <= 0.51 and 0.49 <= ratio["bf16"] <= 0.51
    assert ratio["topk"] < 0.05
    assert ratio["powersgd"] < 0.02
    assert ratio["sign"] < 1 / 30
    # the warm-up epoch sent whole buckets for half its steps
    warm = _epoch_bytes(comm_bytes, "topk", epoch=0) / full
    assert 0.5 < warm < 0.55


def _one_rank(rank: int, world: int) -> dict:
    """allreduce on a world of one: the module is not wrapped in DDP, the steps are those of
    a plain loop, and nothing is sent; a compression keeps its codec (and DDP)."""
    batches = _regression(0, 6, 8)
    plain = _mlp()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(plain(x), y).backward()
        opt.step()
    alone, module = strategies.create("allreduce"), _mlp()
    wrapped = alone.wrap(module)
    module = _mlp()
    rows = _fit(strategies.create("allreduce"), module, batches, [0.1])
    fp16 = strategies.create("allreduce", {"compression": "fp16"})
    return {"unwrapped": wrapped is not None and not isinstance(
                wrapped, torch.nn.parallel.DistributedDataParallel),
            "same": torch.equal(_flat(module), _flat(plain)), "rows": rows,
            "fp16_wrapped": isinstance(fp16.wrap(_mlp()),
                                       torch.nn.parallel.DistributedDataParallel)}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_one_rank_trains_as_a_plain_loop_without_ddp():
    [out] = run_ranks(_one_rank, world_size=1, timeout_s=SPAWN_TIMEOUT_S)
    assert out["unwrapped"] and out["same"] and out["fp16_wrapped"]
    assert out["rows"][0]["comm_bytes"] == 0
