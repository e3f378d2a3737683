"""sparkddl.task.frameworks without Spark: the driver's unsynchronized-training rule, the
environment restored after a rank's function, the watch on init_process_group."""
from __future__ import annotations

import os
import warnings

import pytest

from sparkddl.task.frameworks import (
    GroupWatch,
    UnsyncedTrainingWarning,
    restored_environ,
    warn_unsynced,
)


@pytest.mark.parametrize("world, groups, warns", [
    (2, [2, 2], False), (2, [0, 0], True), (3, [1, 1, 1], True), (2, [2, 1], False),
    (1, [0], False), (2, [-1, -1], False), (2, [], False), (4, [-1, 2], True)])
def test_warns_only_when_no_rank_formed_a_group_of_all(world, groups, warns):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn_unsynced(world, groups, "sparkddl.run")
    got = [w for w in seen if issubclass(w.category, UnsyncedTrainingWarning)]
    assert bool(got) == warns
    if warns:
        assert f"num_nodes={world}" in str(got[0].message)
        assert "Accelerator(cpu=True)" in str(got[0].message)


def test_the_environment_is_restored_whatever_the_function_did(monkeypatch):
    monkeypatch.setenv("SPARKDDL_TEST_KEPT", "1")
    monkeypatch.setenv("SPARKDDL_TEST_CHANGED", "before")
    monkeypatch.setenv("SPARKDDL_TEST_REMOVED", "here")
    with restored_environ():
        os.environ["SPARKDDL_TEST_ADDED"] = "x"  # as Lightning's seed_everything does
        os.environ["SPARKDDL_TEST_CHANGED"] = "after"
        del os.environ["SPARKDDL_TEST_REMOVED"]
    assert "SPARKDDL_TEST_ADDED" not in os.environ
    assert os.environ["SPARKDDL_TEST_CHANGED"] == "before"
    assert os.environ["SPARKDDL_TEST_REMOVED"] == "here"
    assert os.environ["SPARKDDL_TEST_KEPT"] == "1"


def test_a_group_formed_and_destroyed_is_still_counted(tmp_path):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    original = c10d._update_default_pg
    with GroupWatch().watching() as watch:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1)
        dist.destroy_process_group()
    assert watch.largest == 1
    assert c10d._update_default_pg is original  # the original is back


def _gpu_rank(rank: int, local_rank: int, gpu: str):
    from sparkddl.task import context
    return context.RankContext(rank=rank, world_size=4, local_rank=local_rank,
                               local_world_size=2, node_rank=rank // 2, master_addr="h",
                               master_port=1, run_id="r", attempt=0, use_gpu=True, gpus=[gpu],
                               collective_timeout_s=10.0)


def test_a_task_with_its_own_gpu_is_told_device_0_by_both_contracts(monkeypatch):
    """Each GPU task sees only its GPU: TorchDistributor's LOCAL_RANK and hvd.local_rank()
    must index it (0), not the rank's place on its host (1), or set_device fails."""
    import sparkddl.horovod.torch as hvd
    from sparkddl.task import context
    from sparkddl.task.bootstrap import _torchrun_env
    ctx = _gpu_rank(rank=3, local_rank=1, gpu="5")
    env = _torchrun_env(ctx, 1, node_per_rank=True)
    assert (env["LOCAL_RANK"], env["NODE_RANK"], env["SPARKDDL_LOCAL_RANK"]) == ("0", "3", "1")
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("SPARKDDL_LOCAL_RANK", "1")
    context.set_current(ctx)
    try:
        assert hvd.local_rank() == 0
    finally:
        context.set_current(None)
    assert hvd.local_rank() == 1  # without an assigned GPU: the place on the host


def test_a_group_formed_through_a_name_imported_before_the_watch(tmp_path):
    """The DDP tutorial imports init_process_group by name; the group is still seen."""
    from torch.distributed import destroy_process_group, init_process_group
    with GroupWatch().watching() as watch:
        init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                           world_size=1)
        destroy_process_group()
    assert watch.largest == 1
