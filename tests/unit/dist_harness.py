"""Run a function on N local processes joined by a gloo process group (no Spark).

The parent hosts the TCPStore on port 0 (no port race) and collects each rank's result
through a queue, as torch.save bytes (torch would otherwise pass tensors as file descriptors
that close when the rank exits). A rank that fails, dies or outlives the timeout fails the
call, and every process is killed before it returns: a hang fails a test, never blocks.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import queue
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

HOST = "127.0.0.1"


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2,
              timeout_s: float = 60.0) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every rank; the results, by rank."""
    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    spawn = mp.get_context("spawn")
    results: Any = spawn.Queue()
    procs = [spawn.Process(target=_rank_main, daemon=True,
                           args=(fn, rank, world_size, store.port, timeout_s, results, args))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    try:
        return _collect(results, procs, time.monotonic() + timeout_s)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


def _collect(results: Any, procs: list[Any], deadline: float) -> list[Any]:
    import torch

    done: dict[int, Any] = {}
    while len(done) < len(procs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks {sorted(set(range(len(procs))) - set(done))} did not "
                               "finish in time")
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"rank(s) {dead} died (exit codes "
                                   f"{[procs[i].exitcode for i in dead]})") from None
            continue
        if not ok:
            raise AssertionError(f"rank {rank} failed:\n{value}")
        done[rank] = torch.load(io.BytesIO(value), weights_only=True)
    return [done[r] for r in range(len(procs))]


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int,
               timeout_s: float, results: Any, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    from sparkddl.task import context

    torch.set_num_threads(1)  # two ranks share two cores with whatever else runs
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(HOST, port, world_size + 1, is_master=False, timeout=timeout)
    try:
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world_size, timeout=timeout)
        context.set_current(context.RankContext(
            rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
            node_rank=0, master_addr=HOST, master_port=port, run_id="unit", attempt=0,
            use_gpu=False, gpus=[], collective_timeout_s=timeout_s, store=store))
        buf = io.BytesIO()
        torch.save(fn(rank, world_size, *args), buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, False, traceback.format_exc()))
    finally:
        # the outcome reaches the parent before the group is torn down: the queue's feeder
        # thread writes it to the pipe, and a destroy_process_group that blocks holding the
        # GIL (seen once in about 50 runs on torch 2.6: the parent waited for rank 0's result
        # until its timeout) would keep it from ever running
        results.close()
        results.join_thread()
        if dist.is_initialized():
            dist.destroy_process_group()
