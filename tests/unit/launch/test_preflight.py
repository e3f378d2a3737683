"""Driver-side checks that need no Spark: configuration logic and pickling diagnostics."""
from __future__ import annotations

import threading

import pytest

from sparkddl.errors import ClusterError, ConfigError
from sparkddl.launch import preflight
from sparkddl.launch.pickling import find_unpicklable, serialize_call
from sparkddl.task.gpu import map_gpu_addresses


@pytest.mark.parametrize("master", ["yarn", "spark://h:7077", "local-cluster[2,1,1024]", "k8s://x"])
def test_dynamic_allocation_refused_on_cluster_masters(master):
    with pytest.raises(ClusterError, match="spark.dynamicAllocation.enabled=false"):
        preflight.check_dynamic_allocation({"spark.dynamicAllocation.enabled": "true"}, master)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]"])
def test_dynamic_allocation_ignored_in_local_mode_as_spark_does(master):
    preflight.check_dynamic_allocation({"spark.dynamicAllocation.enabled": "true"}, master)


def test_dynamic_allocation_off_is_fine():
    preflight.check_dynamic_allocation({"spark.dynamicAllocation.enabled": "false"}, "yarn")
    preflight.check_dynamic_allocation({}, "yarn")


@pytest.mark.parametrize("amount", [None, "0", "abc"])
def test_gpu_requires_task_resources(amount):
    conf = {} if amount is None else {"spark.task.resource.gpu.amount": amount}
    with pytest.raises(ClusterError, match="spark.task.resource.gpu.amount"):
        preflight.check_gpu_conf(conf, use_gpu=True)
    preflight.check_gpu_conf(conf, use_gpu=False)


def test_gpu_with_resources_passes():
    preflight.check_gpu_conf({"spark.task.resource.gpu.amount": "0.5"}, use_gpu=True)


CLUSTER = "spark://h:7077"
GPU_EXECUTORS = {"spark.executor.resource.gpu.amount": "2"}


@pytest.mark.parametrize("master", [CLUSTER, "yarn", "k8s://x", "local-cluster[2,4,1024]"])
def test_gpu_ranks_ask_for_a_whole_gpu_through_a_stage_profile(master):
    """The usual GPU cluster: executors have GPUs, tasks in general do not (or a fraction),
    so only the training stage asks for one, with the executor's cores shared out."""
    for task_amount in (None, "0.25"):
        conf = dict(GPU_EXECUTORS)
        if task_amount:
            conf["spark.task.resource.gpu.amount"] = task_amount
        stage = preflight.gpu_stage(conf, master, use_gpu=True, executor_cores=16)
        assert stage.cpus == 8  # 16 cores / 2 GPUs
        assert "stage-level resource profile" in stage.line and "CPU tasks" in stage.line
        assert f"spark.task.resource.gpu.amount={task_amount or 'unset'}" in stage.line


def test_explicit_task_cpus_are_kept_for_the_gpu_ranks():
    conf = {**GPU_EXECUTORS, "spark.task.cpus": "3"}
    assert preflight.gpu_stage(conf, CLUSTER, True, executor_cores=16).cpus == 3
    assert preflight.gpu_stage(GPU_EXECUTORS, CLUSTER, True, executor_cores=None).cpus == 1


def test_a_cluster_that_gives_every_task_a_gpu_keeps_the_default_profile():
    conf = {**GPU_EXECUTORS, "spark.task.resource.gpu.amount": "1"}
    stage = preflight.gpu_stage(conf, CLUSTER, True, executor_cores=16)
    assert stage.cpus is None and "below 1" in stage.line


def test_gpu_ranks_on_executors_without_gpus_are_refused_naming_the_settings():
    with pytest.raises(ClusterError, match=r"executors of spark://h:7077 have no GPUs.*"
                       r"spark.executor.resource.gpu.amount.*discoveryScript"):
        preflight.gpu_stage({"spark.task.resource.gpu.amount": "1"}, CLUSTER, True, 16)


def test_no_gpu_stage_without_use_gpu():
    assert preflight.gpu_stage({}, CLUSTER, False, 16) is None


def test_local_masters_still_need_task_gpu_resources():
    with pytest.raises(ClusterError, match="spark.task.resource.gpu.amount"):
        preflight.gpu_stage({}, "local[2]", True, None)
    stage = preflight.gpu_stage({"spark.task.resource.gpu.amount": "1"}, "local[2]", True, None)
    assert stage.cpus is None


@pytest.mark.parametrize("conf, master, expected", [
    ({}, "local-cluster[3, 1, 1024]", 3), ({"spark.executor.instances": "4"}, CLUSTER, 4),
    ({}, CLUSTER, None), ({"spark.executor.instances": "x"}, "yarn", None)])
def test_expected_executors(conf, master, expected):
    """Known up front, the wait for executors ends when they are all there."""
    assert preflight.expected_executors(conf, master) == expected


def test_gpu_addresses_map_through_visible_devices():
    assert map_gpu_addresses(["1"], None) == ["1"]
    assert map_gpu_addresses(["0", "1"], "") == ["0", "1"]
    assert map_gpu_addresses(["1"], "4,6") == ["6"]
    assert map_gpu_addresses(["0", "1"], " 4, 6 ") == ["4", "6"]
    with pytest.raises(ClusterError, match=r"address '2'.*exposes 2 device"):
        map_gpu_addresses(["2"], "4,6")


def test_unpicklable_global_is_named():
    def uses_global():
        return _GLOBAL_LOCK.locked()

    culprit = find_unpicklable(uses_global, (), {})
    assert culprit == ("global '_GLOBAL_LOCK' used by "
                       "test_unpicklable_global_is_named.<locals>.uses_global", "lock")


def test_unpicklable_argument_is_named():
    with pytest.raises(ConfigError, match=r"keyword argument 'guard' \(lock\) cannot be pickled"):
        serialize_call(print, (1,), {"guard": threading.Lock()})


def test_unpicklable_in_nested_helper_is_named():
    lock = threading.RLock()

    def helper():
        return lock

    def outer():
        return helper()

    label, kind = find_unpicklable(outer, (), {})
    assert "'lock'" in label and "helper" in label and kind == "RLock"


def test_not_callable():
    with pytest.raises(ConfigError, match="fn must be callable"):
        serialize_call(42, (), {})


_GLOBAL_LOCK = threading.Lock()


def test_gpu_index_in_a_reused_worker_follows_what_cuda_saw_first():
    from sparkddl.task.dist import device_index
    assert device_index("3", cuda_initialized=False, visible_at_init="1") == 0
    assert device_index("3", cuda_initialized=True, visible_at_init=None) == 0
    assert device_index("3", cuda_initialized=True, visible_at_init="1,3") == 1
    with pytest.raises(ClusterError, match=r"assigned GPU 3 .* saw only GPUs 0,1; set "
                                           r"spark.python.worker.reuse=false"):
        device_index("3", cuda_initialized=True, visible_at_init="0,1")


def test_gpu_process_group_also_carries_cpu_tensors():
    """Checkpoint state and step counts are CPU tensors: a plain "nccl" group refuses them."""
    from sparkddl.task.dist import BACKENDS, default_backend
    assert default_backend(False) == "gloo"
    assert default_backend(True) == "cpu:gloo,cuda:nccl" and default_backend(True) in BACKENDS


def test_discovery_script_reports_the_gpus_torch_sees(tmp_path):
    """What Spark runs on each worker/executor: JSON naming the resource and its addresses."""
    import json
    import subprocess

    import torch

    from sparkddl.task.gpu import write_discovery_script
    script = write_discovery_script(tmp_path / "gpus.sh")
    out = json.loads(subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    assert out == {"name": "gpu",
                   "addresses": [str(i) for i in range(torch.cuda.device_count())]}


def test_more_ranks_on_a_host_than_its_gpus_is_refused_before_nccl(monkeypatch):
    """Without Spark-assigned GPUs (local masters) ranks take devices by local rank; two on
    one GPU would fail late in NCCL ("Duplicate GPU detected")."""
    import torch

    from sparkddl.task.dist import local_device_index
    gpus = max(torch.cuda.device_count(), 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(gpus + 1))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ClusterError, match=rf"{gpus + 1} ranks run on .* {gpus} visible GPU"):
        local_device_index()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(gpus))
    monkeypatch.setenv("LOCAL_RANK", str(gpus - 1))
    assert local_device_index() == gpus - 1


def test_under_torchdistributors_contract_devices_go_by_the_hosts_ranks(monkeypatch):
    """TorchDistributor sets LOCAL_RANK=0 and LOCAL_WORLD_SIZE=1 on every rank (each task a
    torchrun node); without Spark-assigned GPUs the device still goes by the host's ranks."""
    import torch

    from sparkddl.task.dist import local_device_index
    gpus = max(torch.cuda.device_count(), 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("SPARKDDL_LOCAL_WORLD_SIZE", str(gpus + 1))
    monkeypatch.setenv("SPARKDDL_LOCAL_RANK", "1")
    with pytest.raises(ClusterError, match=rf"{gpus + 1} ranks run on"):
        local_device_index()
    monkeypatch.setenv("SPARKDDL_LOCAL_WORLD_SIZE", str(gpus))
    monkeypatch.setenv("SPARKDDL_LOCAL_RANK", str(gpus - 1))
    assert local_device_index() == gpus - 1
