"""Each rank's CPUs: the cores of its host shared out between the ranks on it.

Ranks on one host are ordinary processes that the OS schedules anywhere; under load it moves
them between cores and their caches go cold. Where every rank on a host can have cores of
its own (local ranks × torch threads <= the cores this process may use), each rank keeps to
a contiguous block of them, as ``torchrun --cpu-affinity`` or numactl would set it. The
Python worker is reused by later tasks, so its CPUs are given back when the rank ends.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def rank_cpus(available: list[int], local_rank: int, local_world: int,
              threads: int) -> list[int] | None:
    """The block of ``available`` CPUs of ``local_rank`` of ``local_world`` ranks, or None
    when the ranks cannot have cores of their own (one rank: it has them all already)."""
    if local_world < 2 or local_world * threads > len(available):
        return None
    per = len(available) // local_world
    return available[local_rank * per:(local_rank + 1) * per]


@contextmanager
def pinned(local_rank: int, local_world: int, threads: int) -> Iterator[list[int] | None]:
    """Keep every thread of this process on the rank's CPUs while the block runs."""
    if not hasattr(os, "sched_setaffinity"):  # not Linux
        yield None
        return
    before = os.sched_getaffinity(0)
    cpus = rank_cpus(sorted(before), local_rank, local_world, threads)
    if cpus is None:
        yield None
        return
    _set_all(cpus)
    try:
        yield cpus
    finally:
        _set_all(before)


def _set_all(cpus: "list[int] | set[int]") -> None:
    """Every thread of the process (threads started later inherit the caller's CPUs)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass
