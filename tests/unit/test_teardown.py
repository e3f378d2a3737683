"""A rank's process groups end with its function but are never freed in the reused Python
worker: freeing a gloo group while a gloo thread waits for the GIL deadlocks the worker
(seen in Spark's gc.collect() between tasks), and the next task sent to it never runs."""
from __future__ import annotations

import os

import pytest

from tests.unit.dist_harness import run_ranks


def _gloo_threads() -> int:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sum(n.startswith("pt_gloo") for n in names)


def _train_release_and_collect(rank, world):
    import gc

    import torch
    import torch.distributed as dist

    from sparkddl.task import context
    from sparkddl.task.bootstrap import release_process_groups

    sub = dist.new_group(list(range(world)))
    steps = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([float(rank)]), group=sub)
    dist.all_gather(steps, torch.tensor([float(rank)]))
    running = _gloo_threads()
    del sub
    release_process_groups()
    gc.collect()  # what Spark's worker does before its next task
    kept = _gloo_threads()
    # the worker's next task starts a group of its own
    dist.init_process_group("gloo", store=dist.PrefixStore("again", context.current().store),
                            rank=rank, world_size=world)
    again = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(again, torch.tensor([float(rank + 10)]))
    return {"running": running, "kept": kept, "again": [t.item() for t in again]}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names in /proc")
@pytest.mark.timeout(120)
def test_ended_groups_are_kept_out_of_the_garbage_collector_and_a_new_one_starts():
    for got in run_ranks(_train_release_and_collect, timeout_s=90):
        assert got["running"] >= 4  # two groups, two gloo worker threads each
        assert got["kept"] == got["running"]  # ended, not freed: nothing for gc to destroy
        assert got["again"] == [10.0, 11.0]
