"""Executor side of a run: the barrier task's entry point.

Each task connects to the driver channel, forwards its output, joins the rendezvous, sets
the environment a torchrun script expects, runs the user's function and reports a failure
with its traceback before Spark hears of it, also when the function ends the process
(``sys.exit``, ``os._exit``, a fatal signal: :mod:`sparkddl.task.last_words`). Everything
it changes in the (reused) Python worker is restored when the task ends.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import traceback
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any, Iterable, Iterator

from sparkddl.channel.client import RankChannel, open_last_words
from sparkddl.channel.messages import Done, DumpStacks, Error, Rendezvous, Stacks, Stop, parse
from sparkddl.channel.offline import OfflineChannel
from sparkddl.errors import ClusterError
from sparkddl.task import context
from sparkddl.task.affinity import pinned
from sparkddl.task.archives import keep_spark_archives
from sparkddl.task.dist import note_visible_devices, task_device_index
from sparkddl.task.frameworks import GroupWatch, reset_library_state, restored_environ
from sparkddl.task.frozen import freeze_once
from sparkddl.task.gpu import map_gpu_addresses
from sparkddl.task.heartbeat import Heartbeat
from sparkddl.task.host_memory import close_all as close_host_groups
from sparkddl.task.last_words import exit_message, fatal_signals, reported_exits
from sparkddl.task.logs import forward_output
from sparkddl.task.network import executor_address, executor_id, interface_env, rank_label
from sparkddl.task.spec import TaskSpec
from sparkddl.task.stacks import python_stacks
from sparkddl.task.warm import warm_imports

log = logging.getLogger(__name__)

# characters of a failure's message and of its traceback sent to the driver (each)
MAX_REPORT_CHARS = 64_000


def barrier_entry(spec: TaskSpec, _rows: Iterable[Any]) -> Iterator[bytes]:
    """mapPartitions function of the barrier stage; yields rank 0's pickled result."""
    from pyspark import BarrierTaskContext, cloudpickle

    keep_spark_archives()  # this worker's next tasks (the next fit's ranks) start sooner

    spark_ctx = BarrierTaskContext.get()
    rank = spark_ctx.partitionId()
    # ranks are named by executor address and id: hostnames alone may all be "localhost"
    where = rank_label(executor_address(spark_ctx.getTaskInfos()[rank].address))
    # (OfflineChannel has RankChannel's interface, and its frames)
    channel: Any = OfflineChannel(rank) if spec.offline else _connect(spec, rank, where)
    # "starting" until the rendezvous completes: the watchdog gives startup more time
    status: dict[str, Any] = {"phase": "starting (importing torch)", "steps": 0,
                              "starting": True}
    reported: list[BaseException] = []

    def post_failure(message: str, stack: str, exc: BaseException | None = None) -> None:
        kind, location = described(exc) if exc is not None else ("", "")
        channel.post(Error(_clip(message), _clip(stack), where, dict(status), kind, location))
        channel.flush()

    def report(exc: BaseException) -> None:
        if exc not in reported:
            reported.append(exc)
            post_failure(exit_message(exc) or f"{type(exc).__name__}: {exc}",
                         traceback.format_exc(), exc)

    result: bytes | None = None
    watch = GroupWatch()  # the largest process group the function formed, for the driver
    try:
        with forward_output(channel, echo=spec.echo_output), \
                Heartbeat(channel, status, spec.heartbeat_s), _last_words(spec, rank, where):
            try:
                with rank_environment(spec, spark_ctx, channel, status):
                    fn, args, kwargs = cloudpickle.loads(spec.payload)
                    try:
                        with reported_exits(post_failure), watch.watching():
                            value = _call(fn, args, kwargs)
                    except BaseException as exc:
                        # report before the process group is torn down: tearing it down
                        # breaks the peers' collectives, and their reports must come second
                        report(exc)
                        first = _first_failure(rank, exc) if spec.offline else None
                        if first is not None:
                            raise first from exc
                        raise
                    if rank == 0:
                        result = _dump_result(value)
            except BaseException as exc:
                report(exc)
                raise
        channel.post(Done(group=watch.largest))
    finally:
        channel.close()
    if spec.offline:  # every rank's messages, and rank 0's result, in one row
        yield cloudpickle.dumps({"rank": rank, "result": result, "frames": channel.frames})
    elif result is not None:
        yield result


class PeerFailedError(RuntimeError):
    """An offline rank failed because a peer failed first; carries the peer's error."""


OFFLINE_FAILURE_KEY = "sparkddl/first_failure"
SECONDARY_DELAY_S = 2.0


def _first_failure(rank: int, exc: BaseException) -> BaseException | None:
    """Offline, Spark's own job error is the only report, and it quotes whichever task it
    saw fail first, often a peer whose collective broke. So the first rank to fail records
    its error in the run's store (before its process group goes); a later one raises an
    error carrying it instead of its own. None: this rank's error stands as it is."""
    import time as _time

    text = _clip(f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        store = context.current().store
        got = store.compare_set(OFFLINE_FAILURE_KEY, "", text)
        got = got.decode() if isinstance(got, bytes) else str(got)
    except Exception:  # noqa: BLE001 - the store went with rank 0, which failed first
        _time.sleep(SECONDARY_DELAY_S)  # let that failure reach Spark before this one
        return None
    if got == text:
        return None  # the first
    return PeerFailedError(f"rank {rank} stopped because a peer failed first: {got}")


def described(exc: BaseException) -> tuple[str, str]:
    """(the exception's class, module-qualified; where it was raised: file and function),
    for the driver's restart policy, which compares failures by these rather than by text."""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    frames = traceback.extract_tb(exc.__traceback__)
    location = f"{os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else ""
    return kind, location


def _clip(text: str) -> str:
    """Keep a failure report well under the channel's header limit, whatever its size: the
    start says what failed, the end where."""
    if len(text) <= MAX_REPORT_CHARS:
        return text
    half = MAX_REPORT_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def _call(fn: Any, args: tuple, kwargs: dict) -> Any:
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:  # torchrun-style scripts may sys.exit(0) on success
        if exc.code in (0, None):
            return None
        raise


def _dump_result(value: Any) -> bytes:
    from pyspark import cloudpickle
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise TypeError(f"rank 0 returned a {type(value).__name__} that cannot be pickled "
                        f"({exc}); return plain data (numbers, dicts, tensors, bytes)") from exc


def _last_words(spec: TaskSpec, rank: int, where: str) -> AbstractContextManager[None]:
    """While the task runs, a fatal signal's report reaches the driver (offline, none can)."""
    return fatal_signals(None if spec.offline else functools.partial(
        open_last_words, spec.channel_host, spec.channel_port, spec.secret, rank, where))


def _connect(spec: TaskSpec, rank: int, where: str) -> RankChannel:
    opened: list[RankChannel] = []

    def on_control(header: dict[str, Any]) -> None:
        body = parse(header)
        if isinstance(body, Stop) and context.is_active():
            ctx = context.current()
            (ctx.regrow_requested if body.regrow else ctx.stop_requested).set()
        elif isinstance(body, DumpStacks) and opened:  # the watchdog fired
            opened[0].post(Stacks(), python_stacks().encode("utf-8", "replace"))

    try:
        opened.append(RankChannel(spec.channel_host, spec.channel_port, spec.secret, rank,
                                  on_control=on_control, label=where,
                                  executor=executor_id()))
        return opened[0]
    except OSError as exc:
        raise ClusterError(
            f"rank {rank} at {where} cannot reach the driver channel at "
            f"{spec.channel_host}:{spec.channel_port} ({exc}); make spark.driver.host an address "
            "executors can reach and allow connections to the driver") from exc


@contextmanager
def rank_environment(spec: TaskSpec, spark_ctx: Any, channel: RankChannel,
                     status: dict[str, Any]) -> Iterator[context.RankContext]:
    import torch
    import torch.distributed as dist

    freeze_once()  # torch's objects, before the user's code is unpickled (task.frozen)
    status["phase"] = "joining the rendezvous"
    rank, world = spark_ctx.partitionId(), spec.num_workers
    hosts = [executor_address(info.address) for info in spark_ctx.getTaskInfos()]
    network = interface_env(hosts[rank])  # before any process group: gloo reads it then
    warm_imports(spec.warm_imports)  # while this thread waits for its peers
    store, master_port = _rendezvous(spec, rank, hosts[0], channel, status)
    gpus = _task_gpus(spark_ctx) if spec.use_gpu else []
    threads = spec.torch_threads or max(1, int(spark_ctx.cpus()))
    ctx = context.RankContext(
        rank=rank, world_size=world, local_rank=hosts[:rank].count(hosts[rank]),
        local_world_size=hosts.count(hosts[rank]),
        node_rank=list(dict.fromkeys(hosts)).index(hosts[rank]), master_addr=hosts[0],
        master_port=master_port, run_id=spec.run_id, attempt=spec.attempt, use_gpu=spec.use_gpu,
        gpus=gpus, collective_timeout_s=spec.collective_timeout_s, channel=channel, store=store,
        status=status)
    status["phase"] = "running"  # still starting: the function's own setup follows
    saved = (torch.get_num_threads(), torch.get_rng_state())
    ok = False
    if network:
        log.info("rank %d: collectives on interface %s, which carries its executor's address "
                 "%s (set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to choose another)", rank,
                 network["GLOO_SOCKET_IFNAME"], hosts[rank])
    with restored_environ(), pinned(ctx.local_rank, ctx.local_world_size, threads) as cpus, \
            kept_groups():
        os.environ.update({**_torchrun_env(ctx, threads, spec.node_per_rank), **network})
        if gpus:
            note_visible_devices()
        torch.set_num_threads(threads)
        context.set_current(ctx)
        try:
            log.info("rank %d/%d joined %s:%d (local rank %d, %d torch threads%s%s)", rank,
                     world, ctx.master_addr, master_port, ctx.local_rank, threads,
                     f", CPUs {cpus}" if cpus else "", f", GPUs {gpus}" if gpus else "")
            yield ctx
            ok = True
        finally:
            # the Python worker is reused by later tasks: everything below must run
            context.set_current(None)
            try:
                close_host_groups()  # their peers' waits end at once
                if dist.is_available():
                    release_process_groups()
                reset_library_state()
                if ok:  # rank 0's store must outlive every rank's last use of it
                    status["phase"] = "finished"
                    with context.collective("the closing barrier (waiting for every rank "
                                            "to finish)", status):
                        _finish_barrier(store, rank, world, spec.collective_timeout_s)
            finally:
                torch.set_num_threads(saved[0])
                torch.set_rng_state(saved[1])
                del store


# Process groups this Python worker has used, kept alive on purpose. ~ProcessGroupGloo takes
# its work lock while the destroying thread holds the GIL, and a gloo worker thread that is
# releasing a finished collective's tensors holds that lock while it waits for the GIL: a
# deadlock. Spark reuses Python workers and runs gc.collect() between tasks, and a DDP model
# keeps its group alive through references the gc frees at a moment nobody chooses: on
# torch 2.13 a reused worker hung in that gc (pinned CI; 1 run in 2 of test_distributor +
# test_estimator here), so the next task sent to it never ran; with torch 2.4/2.6
# destroy_process_group itself hung 1 run in 3. A group that is never freed cannot
# deadlock there. What it keeps: gloo's idle threads and sockets (NCCL communicators are
# shut down by destroy_process_group), until Spark ends the worker (idle for a minute).
_RETIRED: set[Any] = set()


def release_process_groups() -> None:
    """End this process's process groups without freeing them (see _RETIRED)."""
    import torch.distributed as dist
    if dist.is_initialized():
        _retire()
        dist.destroy_process_group()


def _retire(group: Any = None) -> None:
    """Keep what ``destroy_process_group(group)`` is about to end: ``group``, or (None)
    the default group and every subgroup."""
    import torch.distributed as dist
    if group is not None:
        _RETIRED.add(group)
    elif dist.is_initialized():
        try:
            from torch.distributed.distributed_c10d import _world
            _RETIRED.update(_world.pg_map)
        except (ImportError, AttributeError):  # a torch without the registry
            _RETIRED.add(dist.group.WORLD)


@contextmanager
def kept_groups() -> Iterator[None]:
    """While a rank's function runs, ``destroy_process_group`` (which torchrun-style code
    calls at its end, as pyspark's TorchDistributor examples do) keeps the groups it ends,
    like release_process_groups."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    saved = (dist.destroy_process_group, c10d.destroy_process_group)
    original = saved[1]

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        _retire(group)
        original(group)

    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
    try:
        yield
    finally:
        dist.destroy_process_group, c10d.destroy_process_group = saved


def _rendezvous(spec: TaskSpec, rank: int, master_host: str, channel: RankChannel,
                status: dict[str, Any]) -> tuple[Any, int]:
    """Rank 0 opens the TCPStore on port 0 and reports the port it really got through the
    driver channel, which relays it to every rank: no port race, and none of the one-second
    polling of Spark's allGather. Every rank returns a store handle (server or client)."""
    from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage]

    timeout = timedelta(seconds=spec.collective_timeout_s)
    if spec.offline:  # no driver to relay the port: Spark's own allGather does
        from pyspark import BarrierTaskContext
        store = TCPStore(master_host, 0, spec.num_workers, is_master=True,
                         wait_for_workers=False, timeout=timeout) if rank == 0 else None
        with context.collective("the rendezvous (Spark's allGather)", status):
            ports = BarrierTaskContext.get().allGather(str(store.port) if store else "")
        port = int(ports[0])
        if store is not None:
            return store, port
        return TCPStore(master_host, port, spec.num_workers, is_master=False,
                        timeout=timeout), port
    if rank == 0:
        store = TCPStore(master_host, 0, spec.num_workers, is_master=True,
                         wait_for_workers=False, timeout=timeout)
        channel.post(Rendezvous(store.port))
        return store, store.port
    with context.collective("the rendezvous (waiting for rank 0's store)", status):
        port = int(channel.wait_for(Rendezvous.KIND, spec.collective_timeout_s)["port"])
    return TCPStore(master_host, port, spec.num_workers, is_master=False, timeout=timeout), port


def _finish_barrier(store: Any, rank: int, world: int, timeout_s: float) -> None:
    """Every rank checks in; rank 0 (which hosts the store) waits for all of them."""
    store.add("sparkddl/finished", 1)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    while store.add("sparkddl/finished", 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks did not all finish within {timeout_s:g}s of rank 0")
        time.sleep(0.005)


def _task_gpus(spark_ctx: Any) -> list[str]:
    resources = spark_ctx.resources()
    if "gpu" not in resources:
        return []  # local mode assigns none: devices are chosen by local rank instead
    return map_gpu_addresses(list(resources["gpu"].addresses),
                             os.environ.get("CUDA_VISIBLE_DEVICES"))


def _torchrun_env(ctx: context.RankContext, threads: int, node_per_rank: bool = False
                  ) -> dict[str, str]:
    """torchrun's environment for the rank: host-local ranks, or (``node_per_rank``, pyspark
    TorchDistributor's contract) each task a node of one process, whose only GPU is device 0;
    the host-local values always under SPARKDDL_* names. With GPUs, that node's LOCAL_RANK is
    its GPU's index in this process (0 unless an earlier task of this reused worker
    initialized CUDA seeing other devices), so that ``set_device(LOCAL_RANK)`` is its GPU."""
    local = ((task_device_index(ctx.gpus[0]) if ctx.gpus else 0), 1, ctx.rank) \
        if node_per_rank else (ctx.local_rank, ctx.local_world_size, ctx.node_rank)
    env = {
        "RANK": ctx.rank, "WORLD_SIZE": ctx.world_size, "LOCAL_RANK": local[0],
        "LOCAL_WORLD_SIZE": local[1], "GROUP_RANK": local[2],
        "NODE_RANK": local[2], "ROLE_RANK": ctx.rank, "ROLE_WORLD_SIZE": ctx.world_size,
        "SPARKDDL_LOCAL_RANK": ctx.local_rank, "SPARKDDL_LOCAL_WORLD_SIZE": ctx.local_world_size,
        "SPARKDDL_NODE_RANK": ctx.node_rank,
        "MASTER_ADDR": ctx.master_addr, "MASTER_PORT": ctx.master_port,
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": ctx.attempt,
        "TORCHELASTIC_RUN_ID": ctx.run_id, "OMP_NUM_THREADS": threads,
        "SPARKDDL_USE_GPU": int(ctx.use_gpu),
    }
    if ctx.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ctx.gpus)
    return {k: str(v) for k, v in env.items()}
