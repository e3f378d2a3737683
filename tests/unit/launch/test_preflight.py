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
