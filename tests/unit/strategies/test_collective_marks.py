"""Every collective a strategy makes is marked in the rank's status (two gloo ranks, no
Spark): the driver's watchdog tells a rank that waits for its peers from the rank they wait
for by that mark alone."""
from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from sparkddl import strategies
from sparkddl.task import context
from tests.unit.dist_harness import run_ranks
from tests.unit.strategies.harness import COMPRESSIONS, _fit, _mlp, _regression

# every blocking torch.distributed call the strategies and the training loop use
CALLS = ("all_reduce", "broadcast", "all_gather", "gather", "batch_isend_irecv",
         "all_gather_into_tensor")
CONFIGS = [("allreduce", {"compression": c, "overlap": o, **({"warmup_steps": 1} if c != "none"
                                                              else {})})
           for c in COMPRESSIONS for o in (True, False)] + [
    ("local_sgd", {"period": 2, "average_optimizer_state": True}),
    ("dynamic_averaging", {"threshold": 0.0, "check_every": 2}),
    ("gossip", {}), ("gossip", {"topology": "exponential"})]


def _spy(status: dict, calls: list) -> None:
    """Record each call's name and the collective the rank's status named at that moment."""
    for name in CALLS:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def spy(*args: Any, _original=original, _name=name, **kwargs: Any) -> Any:
            calls.append((_name, status.get("collective", "")))
            return _original(*args, **kwargs)

        setattr(dist, name, spy)


def _marks(rank: int, world: int) -> dict:
    status = context.current().status
    calls: list = []
    _spy(status, calls)
    out = {}
    for i, (name, options) in enumerate(CONFIGS):
        calls.clear()
        module = _mlp()
        # DDP's C++ reducer bypasses Python: a gradient hook sees the status during backward
        in_backward: set = set()
        for p in module.parameters():
            # the hook fires in this pass's fit, before in_backward is replaced
            p.register_hook(
                lambda g: in_backward.add(status.get("collective", "")) or g)  # noqa: B023
        _fit(strategies.create(name, options), module, _regression(rank, 4, 8), [0.05, 0.05],
             probe={})
        out[i] = {"calls": list(calls), "in_backward": sorted(in_backward),
                  "after": status.get("collective", "")}
    return out


@pytest.fixture(scope="module")
def marks():
    return run_ranks(_marks, timeout_s=120)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=[f"{n}-{o}" for n, o in CONFIGS])
def test_every_collective_is_marked_and_the_mark_is_cleared(marks, index):
    name, options = CONFIGS[index]
    for rank in marks:
        seen = rank[index]
        ddp = name == "allreduce" and options["overlap"]
        # plain DDP sends everything from C++; every other configuration calls from Python
        cpp_only = ddp and options["compression"] == "none"
        assert bool(seen["calls"]) != cpp_only, f"{name} {options}: calls {seen['calls']}"
        unmarked = [call for call, mark in seen["calls"] if not mark]
        assert unmarked == [], f"{name} {options}: unmarked collective calls {unmarked}"
        assert seen["after"] == "", "the mark outlived the collective"
        # DDP exchanges buckets inside backward: the whole pass is marked; otherwise the
        # backward pass is the rank's own computation and must not be
        assert seen["in_backward"] == (["DDP's gradient allreduce (inside backward)"] if ddp
                                       else [""])


def test_marks_nest_and_do_nothing_outside_a_task():
    status: dict = {}
    with context.collective("outer", status):
        with context.collective("inner", status):
            assert status["collective"] == "outer"
        assert status["collective"] == "outer"
    assert status["collective"] == ""
    assert not context.is_active()
    with context.collective("no task"):  # no status to mark: a no-op, not an error
        pass
