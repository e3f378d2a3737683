"""Training strategies on two local gloo ranks (no Spark).

Each multi-process fixture spawns the two ranks once and runs a whole family of checks
there; the tests then assert on what the ranks reported. Every spawn has a timeout in the
harness, and every test that uses one a pytest timeout, so a hang fails instead of blocking.
"""
from __future__ import annotations

import io
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparkddl import strategies
from sparkddl.errors import ConfigError
from sparkddl.strategies.kernels import pack_bits, unpack_bits
from sparkddl.strategies.gossip import peer_offsets
from sparkddl.strategies.ssp import store_queue_problem
from tests.unit.dist_harness import run_ranks

SPAWN_TIMEOUT_S = 120
TEST_TIMEOUT_S = 150
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk", "sign")


# ---- helpers that run on the ranks ----

def _mlp(width: int = 32) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank, as the training loop does
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))


def _regression(rank: int, steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of this rank's own samples of one shared teacher function."""
    teacher = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(steps, batch, 8, generator=gen)
    y = torch.tanh(x @ teacher) * 2 + 0.05 * torch.randn(steps, batch, 1, generator=gen)
    return list(zip(x, y))


def _fit(strategy: Any, module: nn.Module, batches: list, lrs: list[float],
         momentum: float = 0.0, pause_s: Any = 0.0, trace: list | None = None,
         probe: dict | None = None) -> list[dict]:
    """The training loop's calls, one epoch per learning rate; one row per epoch.
    ``pause_s``: seconds of "compute" added to every step, or a function of the step's
    index (counted over all epochs) giving them."""
    model = strategy.wrap(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=lrs[0], momentum=momentum)
    rows = []
    for lr in lrs:
        optimizer.param_groups[0]["lr"] = lr
        losses = []
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            strategy.backward(loss)
            time.sleep(pause_s(len(losses) + len(rows) * len(batches))
                       if callable(pause_s) else pause_s)
            strategy.step(optimizer)
            losses.append(loss.item())
            if trace is not None:
                trace.append(list(strategy.clocks))
        rows.append({"loss": sum(losses) / len(losses), **strategy.end_epoch()})
    if probe is not None:  # a snapshot taken during training, as the loop takes it
        local = _flat(module).clone()
        snap = strategy.snapshot_state(module)
        probe.update(local=local, untouched=torch.equal(local, _flat(module)),
                     snapshot=torch.cat([snap[n].reshape(-1)
                                         for n, _ in module.named_parameters()]))
    strategy.finalize(module)
    return rows


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def _roundtrip(strategy: Any, name: str, options: dict) -> bool:
    """The state survives torch.save / torch.load(weights_only=True) and restores into a
    fresh strategy of the same kind (wrapped, as after a restart). Collective: wrap is."""
    original = strategy.state_dict()
    buf = io.BytesIO()
    torch.save(original, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    if not original:  # nothing to restore (ssp checkpoints nothing)
        return loaded == {}
    fresh = strategies.create(name, options)
    fresh.wrap(_mlp())
    if _same(fresh.state_dict(), original):
        return False  # a fresh state equal to the trained one would prove nothing
    fresh.load_state_dict(loaded)
    return _same(fresh.state_dict(), original)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


def _run(name: str, options: dict, rank: int, lrs: list[float], steps: int = 16,
         **fit: Any) -> dict:
    strategy = strategies.create(name, options)
    module = _mlp()
    probe: dict = {}
    rows = _fit(strategy, module, _regression(rank, steps, 8), lrs, probe=probe, **fit)
    return {"rows": rows, "params": _flat(module),
            "roundtrip": _roundtrip(strategy, name, options),
            "state": strategy.state_dict(), "probe": probe}


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
        _fit(strategies.create("allreduce", options), module, [(x[mine], y[mine])] * 5, [0.1])
        out[key] = _flat(module)
    return out


def _compressed_training(rank: int, world: int) -> dict:
    return {key: _run("allreduce", options, rank, [0.05] * 4)
            for key, options in _allreduce_variants(warmup_steps=2)}


def _allreduce_family(rank: int, world: int) -> dict:
    return {"equivalence": _equivalence(rank, world),
            "training": _compressed_training(rank, world)}


def _bytes_per_epoch(rank: int, world: int) -> dict:
    """Two epochs of eight steps on a model of three 1024 x 1024 layers: comm per epoch."""
    configs = {"allreduce": ("allreduce", {}),
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


def _stale_synchronous(rank: int, world: int) -> dict:
    """Rank 1 is slow; rank 0 may run ahead by ``staleness`` steps, never further."""
    out = {}
    for staleness in (0, 2):
        trace: list = []
        run = _run("ssp", {"staleness": staleness}, rank, [0.05] * 3, steps=12,
                   pause_s=0.04 if rank == 1 and staleness else 0.0, trace=trace)
        out[staleness] = {**run, "trace": trace}
    return out


SPIKE_S, STEP_S, SSP_STEPS = 0.1, 0.02, 24


def _steps(rank: int, spikes: bool, jitter_s: float):
    """Every step takes STEP_S +- ``jitter_s``; with ``spikes``, stragglers that come and go:
    each rank in turn is SPIKE_S late on two steps of every epoch (rank 1 at steps 3 and
    15, rank 2 at 6 and 18, rank 0 at 9 and 21)."""
    import random
    jitter = random.Random(rank)
    late = {1: (3, 15), 2: (6, 18), 0: (9, 21)}[rank] if spikes else ()
    return lambda i: STEP_S + jitter.uniform(-jitter_s, jitter_s) + (
        SPIKE_S if i % SSP_STEPS in late else 0.0)


def _dynamic_staleness(rank: int, world: int) -> dict:
    """Fixed staleness 0 and 4 and dynamic 0..4, under stragglers and under jitter alone."""
    configs = {"fixed_low": {"staleness": 0}, "fixed_high": {"staleness": 4},
               "dynamic": {"staleness": 4, "min_staleness": 0}}
    out = {}
    for pattern, spikes, jitter_s, epochs in (("spikes", True, 0.004, 2),
                                              ("jitter", False, 0.012, 3)):
        for label, options in configs.items():
            trace: list = []
            start = time.perf_counter()
            run = _run("ssp", options, rank, [0.05] * epochs, steps=SSP_STEPS,
                       pause_s=_steps(rank, spikes, jitter_s), trace=trace)
            out[pattern, label] = {**run, "trace": trace, "wall_s": time.perf_counter() - start}
    return out


def _dynamic_staleness_three(rank: int, world: int) -> dict:
    """Fixed staleness 0 and dynamic 0..4 on three ranks, each a straggler in turn: the
    slowest is now one of two others, and ties among the slowest come and go."""
    out = {}
    for label, options in (("fixed_low", {"staleness": 0}),
                           ("dynamic", {"staleness": 4, "min_staleness": 0})):
        trace: list = []
        run = _run("ssp", options, rank, [0.05] * 2, steps=SSP_STEPS,
                   pause_s=_steps(rank, True, 0.004), trace=trace)
        out[label] = {**run, "trace": trace}
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


@pytest.fixture(scope="module")
def averaging():
    return run_ranks(_model_averaging, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def ssp():
    return run_ranks(_stale_synchronous, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def dynamic_ssp():
    return run_ranks(_dynamic_staleness, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def dynamic_ssp_three():
    return run_ranks(_dynamic_staleness_three, world_size=3, timeout_s=SPAWN_TIMEOUT_S)


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


def test_powersgd_compresses_only_matrices_whose_factors_are_smaller():
    from sparkddl.strategies.powersgd import PowerSGD

    codec = PowerSGD(strategies.CommStats(), rank=2)
    assert codec.compressible(torch.Size([64, 32]))
    assert codec.compressible(torch.Size([16, 3, 3, 3]))  # conv kernels fold to 16 x 27
    assert not codec.compressible(torch.Size([64]))
    assert not codec.compressible(torch.Size([3, 2]))


def test_sign_bits_pack_eight_to_a_byte():
    mask = torch.rand(37) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == 5
    assert torch.equal(unpack_bits(packed, 37), mask)
    assert pack_bits(torch.tensor([True] + [False] * 7)).tolist() == [128]


def test_fast_top_k_finds_the_same_entries_as_topk():
    from sparkddl.strategies.kernels import SAMPLE, top_k_indices
    torch.manual_seed(0)
    for n, k in ((5 * SAMPLE, 1), (5 * SAMPLE, 3277), (1_000_000, 10_000), (100, 7)):
        for dtype in (torch.float32, torch.bfloat16):  # numpy's chunks, and torch's path
            x = torch.randn(n).to(dtype)
            got = top_k_indices(x, k)
            assert got.numel() == k and got.unique().numel() == k
            want = x.abs().topk(k).values
            assert torch.equal(x[got].abs().sort(descending=True).values, want)
    # a bucket where the sample misjudges (one huge spike among many equal values): still k
    skewed = -torch.ones(5 * SAMPLE)
    skewed[123] = -1e9
    got = top_k_indices(skewed, 5)
    assert got.numel() == 5 and 123 in got.tolist()
    # mostly zeros: the nonzero entries, then zeros to make up k (not the whole bucket's
    # topk: 80 ms for 2 M entries)
    for nonzero in (50, 5):
        sparse = torch.zeros(5 * SAMPLE)
        sparse[torch.arange(nonzero) * 1000 + 7] = torch.arange(1.0, nonzero + 1)
        got = top_k_indices(sparse, 20)
        assert got.numel() == 20 and got.unique().numel() == 20
        want = sparse.abs().topk(20).values
        assert torch.equal(sparse[got].abs().sort(descending=True).values, want)


def test_sign_encoding_in_chunks_and_whole_agree_with_the_definition():
    from sparkddl.strategies.kernels import (CHUNK, sign_and_mean_magnitude,
                                                 subtract_signed)
    x = torch.randn(3 * CHUNK + 5)  # chunks and a short tail
    x[7] = -0.0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):  # numpy's
        y = x.to(dtype, copy=True)  # chunks, and torch's path; subtract_signed is in place
        negative = torch.zeros(y.shape, dtype=torch.bool)
        scale = sign_and_mean_magnitude(y, negative)
        assert torch.equal(negative, y.signbit()) and negative[7]
        assert scale.dtype == torch.float32  # what is sent
        assert scale.item() == pytest.approx(y.double().abs().mean().item(), rel=1e-5)
        signed = scale.to(dtype)  # as the decode turns it into the bucket's type
        want = y - torch.where(y.signbit(), -signed, signed)
        subtract_signed(y, scale)
        torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_signed_mean_from_packed_bytes_matches_unpacking_every_bit():
    from sparkddl.strategies.kernels import PAIR_TABLE_BYTES, signed_mean
    for world in (1, 2, 3, 4):  # a pair's table, and a rank left over
        # the last byte padded or not; a table per rank, or per pair of ranks
        for n in (1001, 1000, 8 * PAIR_TABLE_BYTES + 5):
            negative = torch.rand(world, n) > 0.5
            packed = torch.stack([pack_bits(m) for m in negative])
            scales = torch.tensor([0.5, 0.25, 2.0, 1.5])[:world]
            want = torch.where(negative, -scales.unsqueeze(1), scales.unsqueeze(1)).mean(0)
            got = signed_mean(packed, scales, torch.full((n,), float("nan")))
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _codecs_step_by_step(rank: int, world: int) -> dict:
    """Top-k and sign, six steps, against their definitions: on every rank, each step's
    gradient plus the residual is sent as its top 1 % (or as ``±mean |x|``), the rest is
    kept, and the bucket becomes the mean of all ranks' messages (each rank recomputes every
    rank's, from the same seeds). Steps 2-3 use another bucket layout (as after DDP's
    rebuild), and steps 4-5 a fresh codec loaded from a checkpoint of the residual."""
    from sparkddl.strategies.compression import Sign, TopK
    from sparkddl.strategies.kernels import SAMPLE

    shapes = [torch.Size([5 * SAMPLE // 8, 8]), torch.Size([0]), torch.Size([1001])]
    sizes = [s.numel() for s in shapes]
    layouts = {0: [[0, 1, 2]], 2: [[2], [1, 0]], 4: [[0, 1, 2]]}
    out = {}
    for name, make in (("topk", lambda: TopK(strategies.CommStats(), 0.01)),
                       ("sign", lambda: Sign(strategies.CommStats()))):
        gens = [torch.Generator().manual_seed(3 + r) for r in range(world)]
        codec, steps = make(), []
        residuals = [torch.zeros(sum(sizes)) for _ in range(world)]
        buckets = layouts[0]
        for step in range(6):
            if step == 4:
                state = io.BytesIO()
                torch.save(codec.state_dict(), state)
                codec = make()
                codec.load_state_dict(torch.load(io.BytesIO(state.getvalue())))
            buckets = layouts.get(step, buckets)
            grads = [torch.randn(sum(sizes), generator=g) for g in gens]
            corrected = [g + r for g, r in zip(grads, residuals)]
            sent: list[dict] = [{} for _ in range(world)]
            for keys in buckets:
                messages = []
                for r in range(world):
                    parts = corrected[r].split(sizes)
                    x = torch.cat([parts[i] for i in keys])
                    if name == "topk":
                        message = torch.zeros_like(x)
                        top = x.abs().topk(int(x.numel() * 0.01)).indices
                        message[top] = x[top]
                    else:
                        message = torch.where(x.signbit(), -1.0, 1.0) * x.abs().mean()
                    messages.append(message)
                    sent[r].update(zip(keys, message.split([sizes[i] for i in keys])))
                in_place = codec._in_place(codec.buffer("residual", keys, x), keys,
                                           [sizes[i] for i in keys])
                got = codec.exchange(torch.cat([grads[rank].split(sizes)[i] for i in keys]),
                                     keys, [shapes[i] for i in keys]).wait()
                steps.append({"step": step, "in_place": in_place, "error":
                              (got - torch.stack(messages).mean(0)).abs().max().item()})
            residuals = [c - torch.cat([sent[r][i] for i in range(len(sizes))])
                         for r, c in enumerate(corrected)]
            kept = torch.cat([codec.residual[i].reshape(-1) for i in range(len(sizes))])
            steps[-1].update(residual_error=(kept - residuals[rank]).abs().max().item(),
                             buckets=sorted({key for _, key in codec.buffers}))
        out[name] = steps
    return out


@pytest.fixture(scope="module", params=[1, 2])
def codec_steps(request):
    """One rank (the gathered rows are contiguous slices: views may start at odd offsets)
    and two (the mean of several ranks' messages; three or more ranks' decode, a pair and
    one alone, is checked without processes in the signed_mean test). A 3-rank spawn of
    this hung once on torch 2.4.1 (rank 2 never returned), not reproduced in 8 runs."""
    return run_ranks(_codecs_step_by_step, world_size=request.param,
                     timeout_s=SPAWN_TIMEOUT_S)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("name", ["topk", "sign"])
def test_codecs_send_their_definition_and_keep_the_rest(codec_steps, name):
    for rank_result in codec_steps:
        steps = rank_result[name]
        assert all(s["error"] < 1e-5 for s in steps), steps
        assert all(s["residual_error"] < 1e-5 for s in steps if "residual_error" in s), steps
        # the residual is built in place from the second step of a layout on; a new layout
        # and a loaded checkpoint gather it once
        assert [s["in_place"] for s in steps] == [False, True, False, False, True, True,
                                                  False, True], steps
        # a layout's buffers are freed when the next replaces it
        assert [s["buckets"] for s in steps if "buckets" in s] == \
            [[(0, 1, 2)]] * 2 + [[(1, 0), (2,)]] * 2 + [[(0, 1, 2)]] * 2


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
    assert ratio["no_overlap"] == 1.0
    assert ratio["local_sgd"] <= 1 / 8 * 1.01
    assert 0.49 <= ratio["fp16"] <= 0.51 and 0.49 <= ratio["bf16"] <= 0.51
    assert ratio["topk"] < 0.05
    assert ratio["powersgd"] < 0.02
    assert ratio["sign"] < 1 / 30
    # the warm-up epoch sent whole buckets for half its steps
    warm = _epoch_bytes(comm_bytes, "topk", epoch=0) / full
    assert 0.5 < warm < 0.55


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


# ---- stale-synchronous parameter server ----

@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()} "
                    "(tests/integration/test_strategies_spark.py checks the refusal)")
@pytest.mark.parametrize("staleness", [0, 2])
def test_ssp_workers_stay_within_staleness(ssp, staleness):
    for rank, result in enumerate(ssp):
        run = result[staleness]
        leads = [step + 1 - min(clocks) for step, clocks in
                 enumerate(run["trace"])]
        assert max(leads) <= staleness
        assert all(row["max_lead"] <= staleness for row in run["rows"])
        rows = run["rows"]
        assert rows[-1]["loss"] < 0.7 * rows[0]["loss"], rows
    fast = ssp[0][staleness]
    assert max(row["max_lead"] for row in fast["rows"]) == staleness  # it did run ahead
    torch.testing.assert_close(ssp[0][staleness]["params"], ssp[1][staleness]["params"],
                               rtol=0, atol=0)


def _leads(run: dict) -> list[int]:
    """Each pull's lead over the slowest worker, from the clocks it returned."""
    return [step + 1 - min(clocks) for step, clocks in enumerate(run["trace"])]


def _mean_lead(result: list, key: tuple) -> float:
    leads = [lead for rank_result in result for lead in _leads(rank_result[key])]
    return sum(leads) / len(leads)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_rides_out_stragglers_within_the_upper_bound(dynamic_ssp):
    """Each rank in turn is 100 ms late on a 20 ms step. Fixed staleness 0 makes the other
    wait it out every time; the dynamic bound (0..4) lets it run ahead instead, never by
    more than 4 steps."""
    for rank, result in enumerate(dynamic_ssp):
        for label, bound in (("fixed_low", 0), ("fixed_high", 4), ("dynamic", 4)):
            run = result["spikes", label]
            assert max(_leads(run)) <= bound, (rank, label)
            assert all(row["max_lead"] <= bound for row in run["rows"]), (rank, label)
            assert run["rows"][-1]["loss"] < run["rows"][0]["loss"], (rank, label)
        waited = {label: sum(row["wait_s"] for row in result["spikes", label]["rows"])
                  for label in ("fixed_low", "dynamic")}
        # fixed 0 waits out the other rank's four 100 ms delays (~0.4 s); dynamic ~0.05 s
        assert waited["dynamic"] < 0.5 * waited["fixed_low"], (rank, waited)
        assert max(_leads(result["spikes", "dynamic"])) > 0  # it did run ahead
    for label in ("fixed_low", "fixed_high", "dynamic"):  # every rank ends on one model
        torch.testing.assert_close(dynamic_ssp[0]["spikes", label]["params"],
                                   dynamic_ssp[1]["spikes", label]["params"], rtol=0, atol=0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_on_three_ranks(dynamic_ssp_three):
    """As with two ranks: fixed 0 waits out both others' delays (about 0.8 s per rank);
    dynamic rides them out, never more than 4 steps ahead, and all end on one model."""
    for rank, result in enumerate(dynamic_ssp_three):
        for label, bound in (("fixed_low", 0), ("dynamic", 4)):
            assert max(_leads(result[label])) <= bound, (rank, label)
            assert all(row["max_lead"] <= bound for row in result[label]["rows"]), (rank, label)
        waited = {label: sum(row["wait_s"] for row in result[label]["rows"])
                  for label in ("fixed_low", "dynamic")}
        assert waited["dynamic"] < 0.5 * waited["fixed_low"], (rank, waited)
        assert max(_leads(result["dynamic"])) > 0, rank
    for label in ("fixed_low", "dynamic"):
        for other in dynamic_ssp_three[1:]:
            torch.testing.assert_close(dynamic_ssp_three[0][label]["params"],
                                       other[label]["params"], rtol=0, atol=0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_builds_no_lead_from_jitter(dynamic_ssp):
    """Steps of 20 +- 12 ms and no stragglers: a fixed bound of 4 lets whichever rank is
    ahead stay ahead (mean lead about 1.3 here); dynamic holds it for the cheap waits, so
    its mean lead stays well below (about 0.5)."""
    dynamic = _mean_lead(dynamic_ssp, ("jitter", "dynamic"))
    fixed = _mean_lead(dynamic_ssp, ("jitter", "fixed_high"))
    assert dynamic < fixed, (dynamic, fixed)
    assert max(max(_leads(r["jitter", "dynamic"])) for r in dynamic_ssp) <= 4


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


def test_gossip_topologies():
    assert peer_offsets("ring", 2) == [1]
    assert peer_offsets("ring", 8) == [1, 7]
    assert peer_offsets("exponential", 8) == [1, 2, 4]
    assert peer_offsets("exponential", 6) == [1, 2, 4]
    assert peer_offsets("ring", 1) == peer_offsets("exponential", 1) == []


def test_ssp_messages_are_raw_bytes_and_carry_server_errors():
    from datetime import timedelta

    from torch.distributed import TCPStore

    from sparkddl.errors import SparkDDLError
    from sparkddl.strategies.ssp import (CHUNK_BYTES, answer_key, decode_pull, encode_pull,
                                         pack, put_chunks, unpack)

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=10))
    # larger than the TCPStore's 8 MiB message limit: it travels in chunks
    tensors = [torch.randn(3, 2), torch.randn(5).to(torch.bfloat16), torch.tensor(2.5),
               torch.randn(3 * CHUNK_BYTES // 4 + 7)]
    chunks = put_chunks(store, answer_key(1), pack(tensors))
    assert chunks == 4
    clocks, payload = decode_pull(encode_pull([4, 2], chunks), 2, store, 1)
    assert clocks == [4, 2]
    for got, want in zip(unpack(payload, tensors), tensors):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert not store.check([f"{answer_key(1)}/0"])  # read once, then gone
    with pytest.raises(SparkDDLError, match="SSP parameter server on rank 0 failed: boom"):
        decode_pull(encode_pull([], 0, b"boom"), 2, store, 1)
