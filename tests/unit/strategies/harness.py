"""What the strategy tests run on their ranks: small models, data, a training loop under a
strategy, and the checks of snapshot round trips. Rank functions live in the test modules;
each spawn has a timeout in tests.unit.dist_harness."""
from __future__ import annotations

import io
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sparkddl import strategies

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
