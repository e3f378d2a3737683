"""The fsdp strategy (FSDP2) on two local gloo ranks (no Spark).

One spawn runs every multi-process check; the references (the same model trained in one
process on the ranks' batches together) are computed here, in the test process. Every spawn
has a timeout in the harness and every test that uses it a pytest timeout.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sparkddl import strategies
from sparkddl.errors import ConfigError
from sparkddl.strategies import fsdp
from tests.unit.dist_harness import run_ranks

SPAWN_TIMEOUT_S = 90
TEST_TIMEOUT_S = 120
CPU_PROBLEM = fsdp.fsdp_problem("cpu")
needs_cpu_fsdp = pytest.mark.skipif(CPU_PROBLEM is not None,
                                    reason=f"strategy='fsdp' {CPU_PROBLEM}")
# units: both hidden Linear layers (297 and 544 parameters) shard alone, the root keeps the
# last one (17); dims 33 and 1 are not multiples of 2, so shards are padded
UNITS = {"min_params": 100}
VARIANTS = {"units": UNITS, "units_kept": {**UNITS, "reshard_after_forward": False},
            "root_only": {}}
# every name FSDP's gathers and reduce-scatters have had (newer torch: the *_single ones)
GATHERS = ("all_gather_single", "all_gather_into_tensor")
SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


# ---- helpers (ranks and references) ----

def _mlp() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights everywhere, as the training loop does
    return nn.Sequential(nn.Linear(8, 33), nn.Tanh(), nn.Linear(33, 16), nn.Tanh(),
                         nn.Linear(16, 1))


def _batches(steps: int, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches; rank r trains on rows [r * size/2, (r+1) * size/2)."""
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(size, 8, generator=gen), torch.randn(size, 1, generator=gen))
            for _ in range(steps)]


def _half(batch: tuple[torch.Tensor, torch.Tensor], rank: int) -> tuple[Any, Any]:
    x, y = batch
    n = len(x) // 2
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


class _Proxy:
    """What the loop hands to ``step``: an object whose step() clips or scales, then steps
    the torch optimizer it holds as ``optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer, self.steps = optimizer, 0

    def step(self) -> None:
        self.steps += 1
        self.optimizer.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _reference(steps: int, micro: int = 1, clip: float | None = None) -> dict:
    """One process, whole batches, ``micro`` micro-batches per step (mean loss)."""
    module = _mlp()
    optimizer = _sgd(module.parameters())
    for x, y in _batches(steps, 8):
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
            (F.mse_loss(module(xs), ys) / micro).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
    return module.state_dict()


# ---- what the ranks run ----

class _Spy:
    """Bytes handed to FSDP's all-gathers and reduce-scatters (the input tensors), and the
    full size they assemble (a gather's output, a reduce-scatter's input)."""

    def __init__(self) -> None:
        self.bytes = self.calls = self.depth = self.full = 0
        for name in GATHERS + SCATTERS:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._wrap(original, name in GATHERS))

    def _wrap(self, original: Any, gather: bool) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:  # one entry point may call another: count the outer one
                given = args[1] if len(args) > 1 else kwargs.get("input",
                                                                 kwargs.get("input_tensor"))
                self.bytes += given.numel() * given.element_size()
                self.calls += 1
                whole = (args[0] if args else kwargs.get("output",
                                                         kwargs.get("output_tensor"))) \
                    if gather else given
                self.full += whole.numel() * whole.element_size()
            self.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
        return spy

    def take(self) -> dict:
        out = {"comm_bytes": self.bytes, "comm_calls": self.calls}
        self.full_seen, self.bytes, self.calls, self.full = self.full, 0, 0, 0
        return out


def _train(rank: int, options: dict, spy: _Spy, steps: int, micro: int = 1) -> dict:
    """The loop's calls: ``micro`` micro-batches per step, all but the last in no_sync."""
    strategy = strategies.create("fsdp", options)
    module = _mlp()
    model = strategy.wrap(module)
    optimizer = _Proxy(_sgd(module.parameters()))
    spy.take()
    for batch in _batches(steps):
        optimizer.zero_grad(set_to_none=True)
        x, y = _half(batch, rank)
        parts = list(zip(x.chunk(micro), y.chunk(micro)))
        for i, (xs, ys) in enumerate(parts):
            with strategy.no_sync() if i < micro - 1 else contextlib.nullcontext():
                strategy.backward(F.mse_loss(model(xs), ys) / micro)
        strategy.step(optimizer)
    return {"state": strategy.full_state_dict(module), "counted": strategy.end_epoch(),
            "seen": spy.take(), "steps": optimizer.steps,
            "full": strategy.full_traffic_bytes(), "full_seen": spy.full_seen}


def _state_dicts(rank: int) -> dict:
    """A freshly wrapped model's full state: the unwrapped module's, as plain CPU tensors."""
    strategy = strategies.create("fsdp", UNITS)
    module = _mlp()
    strategy.wrap(module)
    state = strategy.full_state_dict(module)
    return {"state": state, "plain": all(type(v) is torch.Tensor and v.device.type == "cpu"
                                         for v in state.values()),
            "snapshot": strategy.snapshot_state(module)}


def _share(obj: Any, rank: int) -> Any:
    """Rank 0's ``obj`` on every rank, as a checkpoint travels: torch.save bytes read back
    with weights_only=True."""
    buf = io.BytesIO()
    if rank == 0:
        torch.save(obj, buf)
    size = torch.tensor([buf.getbuffer().nbytes])
    dist.broadcast(size, 0)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8) if rank == 0 \
        else torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(data, 0)
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def _adam_step(strategy: Any, model: Any, optimizer: Any, batch: Any, rank: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    x, y = _half(batch, rank)
    strategy.backward(F.mse_loss(model(x), y))
    strategy.step(optimizer)


def _wrapped_adam(state: dict | None) -> tuple[Any, Any, Any]:
    strategy = strategies.create("fsdp", UNITS)
    module = _mlp()
    if state is not None:
        module.load_state_dict(state)
    model = strategy.wrap(module)
    return strategy, model, _Proxy(torch.optim.Adam(module.parameters(), lr=0.01))


def _optimizer_roundtrip(rank: int) -> dict:
    """Adam: two steps, save model and optimizer, restore both into a fresh wrapped model;
    the third step must match the uninterrupted run's (and not a fresh Adam's)."""
    batches = _batches(3)
    strategy, model, optimizer = _wrapped_adam(None)
    for batch in batches[:2]:
        _adam_step(strategy, model, optimizer, batch, rank)
    saved = strategy.optimizer_state_dict(model, optimizer)
    checkpoint = _share({"model": strategy.full_state_dict(model), "optimizer": saved}, rank)
    _adam_step(strategy, model, optimizer, batches[2], rank)
    out = {"saved": saved, "proxy_steps": optimizer.steps,
           "uninterrupted": strategy.full_state_dict(model)}
    for label, restore in (("restored", True), ("fresh_adam", False)):
        strategy, model, optimizer = _wrapped_adam(checkpoint["model"])
        if restore:
            strategy.load_optimizer_state_dict(model, optimizer, checkpoint["optimizer"])
        _adam_step(strategy, model, optimizer, batches[2], rank)
        out[label] = strategy.full_state_dict(model)
    return out


def _clipping(rank: int) -> dict:
    strategy = strategies.create("fsdp", UNITS)
    module = _mlp()
    model = strategy.wrap(module)
    x, y = _half(_batches(1)[0], rank)
    strategy.backward(F.mse_loss(model(x), y))
    params = list(module.parameters())
    kept = strategy.clip_grad_norm_(params, 1e9)  # far above: nothing changes
    norm = strategy.clip_grad_norm_(params, 0.01)
    after = strategy.clip_grad_norm_(params, math.inf)
    grads = {n: p.grad.full_tensor() for n, p in module.named_parameters()}
    return {"kept": kept, "norm": norm, "after": after, "grads": grads}


def _family(rank: int, world: int) -> dict:
    spy = _Spy()
    return {"train": {label: _train(rank, options, spy, steps=4)
                      for label, options in VARIANTS.items()},
            "accumulate": _train(rank, UNITS, spy, steps=3, micro=2),
            "state_dicts": _state_dicts(rank),
            "optimizer": _optimizer_roundtrip(rank),
            "clip": _clipping(rank)}


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_family, timeout_s=SPAWN_TIMEOUT_S)


def _assert_same_state(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=atol, msg=key)


# ---- the tests ----

@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_matches_one_process_on_the_whole_batch(ranks, variant):
    rank0, rank1 = (r["train"][variant] for r in ranks)
    _assert_same_state(rank0["state"], _reference(steps=4))
    assert rank1["state"] == {}  # the full model is gathered to rank 0 only
    assert rank0["steps"] == 4  # the optimizer (proxy) stepped once per step


@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("variant", [*VARIANTS, "accumulate"])
def test_counted_traffic_is_what_fsdp_hands_its_collectives(ranks, variant):
    for r in ranks:
        run = r["accumulate"] if variant == "accumulate" else r["train"][variant]
        assert run["counted"] == run["seen"]
        assert run["counted"]["comm_bytes"] > 0
        if variant != "accumulate":  # what the plan prices: the full size, per step
            assert run["full"] * run["steps"] == run["full_seen"] > run["counted"]["comm_bytes"]


@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_full_state_dict_is_the_plain_modules_on_rank_0(ranks):
    rank0, rank1 = (r["state_dicts"] for r in ranks)
    plain = _mlp().state_dict()
    assert list(rank0["state"]) == list(plain)
    assert rank0["plain"]
    _assert_same_state(rank0["state"], plain, atol=0)  # untrained: rank 0's initial weights
    fresh = nn.Sequential(nn.Linear(8, 33), nn.Tanh(), nn.Linear(33, 16), nn.Tanh(),
                          nn.Linear(16, 1))
    fresh.load_state_dict(rank0["state"])  # strict: same keys and shapes
    _assert_same_state(fresh.state_dict(), plain, atol=0)
    _assert_same_state(rank0["snapshot"], plain, atol=0)
    assert rank1["state"] == {} and rank1["snapshot"] == {}


@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_optimizer_state_round_trip_continues_identically(ranks):
    rank0, rank1 = (r["optimizer"] for r in ranks)
    saved = rank0["saved"]
    names = [n for n, _ in _mlp().named_parameters()]
    assert sorted(saved["state"]) == sorted(names)
    assert saved["param_groups"][0]["params"] == names
    assert int(saved["state"]["0.weight"]["step"]) == 2
    assert saved["state"]["0.weight"]["exp_avg"].shape == (33, 8)  # unsharded
    assert rank1["saved"] == {}
    assert rank0["proxy_steps"] == 3  # the state helpers never stepped the proxy
    _assert_same_state(rank0["restored"], rank0["uninterrupted"], atol=1e-6)
    moved = max((rank0["fresh_adam"][k] - rank0["uninterrupted"][k]).abs().max().item()
                for k in names)
    assert moved > 1e-4  # a fresh Adam's step differs: the restored state did matter


@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_clip_grad_norm_uses_the_whole_models_norm(ranks):
    module = _mlp()
    x, y = _batches(1)[0]
    F.mse_loss(module(x), y).backward()
    want = float(torch.nn.utils.clip_grad_norm_(module.parameters(), 0.01))
    for r in ranks:
        clip = r["clip"]
        assert clip["kept"] == pytest.approx(want, rel=1e-5)
        assert clip["norm"] == pytest.approx(want, rel=1e-5)
        assert clip["after"] == pytest.approx(0.01, rel=1e-4)
        for name, p in module.named_parameters():
            torch.testing.assert_close(clip["grads"][name], p.grad, rtol=1e-4, atol=1e-7)


@needs_cpu_fsdp
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_no_sync_accumulation_equals_the_whole_batch(ranks):
    rank0 = ranks[0]["accumulate"]
    _assert_same_state(rank0["state"], _reference(steps=3, micro=2))
    assert rank0["steps"] == 3
    # per micro-batch 5 all-gathers (two resharded units twice, the root once); per step 3
    # reduce-scatters, none inside no_sync (counted == seen is checked above)
    assert rank0["counted"]["comm_calls"] == 3 * (2 * 5 + 3)


# ---- configuration (no processes) ----

@pytest.mark.parametrize("options,message", [
    ({"min_param": 5}, r"unknown option\(s\) 'min_param' for strategy 'fsdp'; valid options: "
                       r"reshard_after_forward, min_params"),
    ({"min_params": 0}, r"option min_params=0 is invalid; expected an integer >= 1"),
    ({"min_params": 1.5}, r"option min_params=1.5 is invalid"),
    ({"min_params": True}, r"option min_params=True is invalid"),
    ({"reshard_after_forward": "yes"}, r"reshard_after_forward='yes' is invalid; expected "
                                       r"true or false"),
])
def test_bad_options_name_the_option(options, message):
    with pytest.raises(ConfigError, match=message):
        strategies.create("fsdp", options)


def test_a_torch_without_fsdp2_is_refused_at_construction(monkeypatch):
    monkeypatch.setattr(fsdp, "_fully_shard_api", lambda: (None, False))
    expected = f"strategy='fsdp' needs FSDP2 (fully_shard), which torch {torch.__version__} "
    with pytest.raises(ConfigError, match=re.escape(expected + "does not have")):
        strategies.create("fsdp")


def test_cuda_only_fsdp2_refuses_a_cpu_model_before_any_collective(monkeypatch):
    monkeypatch.setattr(fsdp, "_fully_shard_api", lambda: (object(), False))
    strategy = strategies.create("fsdp")  # the driver cannot know the device: accepted
    with pytest.raises(ConfigError, match=r"runs on CUDA only .* the model is on cpu"):
        strategy.wrap(_mlp())  # no process group here: it must fail before needing one


@pytest.mark.skipif(CPU_PROBLEM is None, reason="this torch's FSDP2 runs on CPU")
def test_this_torch_refuses_a_cpu_model():
    with pytest.raises(ConfigError, match=r"runs on CUDA only"):
        strategies.create("fsdp").wrap(_mlp())


def test_units_go_deepest_first_and_keep_tied_weights_together():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 2))  # 110 + 22 parameters
    tied_in, tied_out = nn.Linear(4, 4), nn.Linear(4, 4)  # 20 each
    tied_out.weight = tied_in.weight
    root = nn.Sequential(nn.Sequential(inner, nn.Linear(2, 2)), tied_in, tied_out)
    units = fsdp.shard_units(root, min_params=20)
    by_module = {id(m): {id(p) for p in params} for m, params in units}
    assert [m for m, _ in units][:2] == [inner[0], inner[1]]  # deepest first
    assert id(root[0]) not in by_module  # 6 parameters left there: below min_params
    assert id(tied_in) not in by_module and id(tied_out) not in by_module
    assert units[-1][0] is root
    assert id(tied_in.weight) in by_module[id(root)]
    everything = [id(p) for _, params in units for p in params]
    assert sorted(everything) == sorted(id(p) for p in root.parameters())  # each once
