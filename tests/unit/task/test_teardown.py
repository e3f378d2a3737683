"""A rank's process groups end with its function but are never freed in the reused Python
worker: freeing a gloo group while a gloo thread waits for the GIL deadlocks the worker
(seen in Spark's gc.collect() between tasks), and the next task sent to it never runs."""
from __future__ import annotations

import os

import pytest

from tests.unit.dist_harness import run_ranks


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))  # gloo's threads are unnamed on old torch


def _train_release_and_collect(rank, world):
    import gc

    import torch
    import torch.distributed as dist

    from sparkddl.task import context
    from sparkddl.task.bootstrap import release_process_groups

    start = _threads()  # the default group is up
    sub = dist.new_group(list(range(world)))
    steps = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([float(rank)]), group=sub)
    dist.all_gather(steps, torch.tensor([float(rank)]))
    running = _threads()
    del sub
    release_process_groups()
    gc.collect()  # what Spark's worker does before its next task
    kept = _threads()
    # the worker's next task starts a group of its own
    dist.init_process_group("gloo", store=dist.PrefixStore("again", context.current().store),
                            rank=rank, world_size=world)
    again = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(again, torch.tensor([float(rank + 10)]))
    return {"start": start, "running": running, "kept": kept,
            "again": [t.item() for t in again]}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.timeout(120)
def test_ended_groups_are_kept_out_of_the_garbage_collector_and_a_new_one_starts():
    for got in run_ranks(_train_release_and_collect, timeout_s=90):
        assert got["running"] > got["start"]  # the subgroup's gloo threads
        assert got["kept"] == got["running"]  # ended, not freed: nothing for gc to destroy
        assert got["again"] == [10.0, 11.0]


def _destroy_it_yourself(rank, world):
    import gc

    import torch
    import torch.distributed as dist

    from sparkddl.task.bootstrap import kept_groups

    with kept_groups():  # as while a rank's function runs
        sub = dist.new_group(list(range(world)))
        steps = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(steps, torch.tensor([float(rank)]), group=sub)
        running = _threads()
        dist.destroy_process_group(sub)  # torchrun-style code ends its groups itself
        del sub
        dist.destroy_process_group()
        gc.collect()
        kept = _threads()
    patched_back = dist.destroy_process_group.__module__ == "torch.distributed.distributed_c10d"
    return {"running": running, "kept": kept, "restored": patched_back,
            "initialized": dist.is_initialized()}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.timeout(120)
def test_groups_a_function_destroys_itself_are_kept_too():
    for got in run_ranks(_destroy_it_yourself, timeout_s=90):
        assert got["kept"] == got["running"] and not got["initialized"]
        assert got["restored"]  # torch's own function again once the rank's function ends
