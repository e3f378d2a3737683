"""Allreduce bandwidth inside a sparkddl barrier stage vs plain torch.distributed.

2 ranks, gloo, float32 tensors of 1, 4, 16 and 64 MiB, every rank with 1 torch thread:
  - sparkddl: the measuring function runs on the ranks of ``sparkddl.run`` (local[2]);
  - plain: the same function in 2 processes started by torch.multiprocessing (spawn),
    gloo on 127.0.0.1, no Spark.
The same measurement in both: per size, WARMUP allreduces, then REPS timed ones, each after
a barrier; a repetition's time is the slowest rank's. Both are measured ROUNDS times,
alternating (plain, sparkddl, plain, ...), in one process with the Spark session up, and the
median of all repetitions counts. Algorithm bandwidth = bytes / time; bus bandwidth =
2 (N-1)/N x bytes / time (N = 2 ranks: the same).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, spawn_ranks, write_results

SIZES_MB = [1, 4, 16, 64]
WARMUP = 10
REPS = {1: 200, 4: 100, 16: 40, 64: 15}
ROUNDS = 2


def measure(sizes_mb: list[int], warmup: int, reps: dict[int, int]
            ) -> dict[int, list[float]]:
    """On every rank: the slowest rank's time (s) of each timed allreduce, per size."""
    import torch
    import torch.distributed as dist

    out = {}
    for mb in sizes_mb:
        t = torch.ones(mb * (1 << 20) // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t)
        times = torch.zeros(reps[mb], dtype=torch.float64)
        for i in range(reps[mb]):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times[i] = time.perf_counter() - start
        # a repetition lasts as long as its slowest rank
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        out[mb] = times.tolist()
    return out


def in_sparkddl(sizes_mb: list[int], warmup: int, reps: dict[int, int]
                ) -> dict[int, list[float]]:
    import sparkddl
    sparkddl.init_process_group("gloo")
    return measure(sizes_mb, warmup, reps)


def main() -> None:
    import sparkddl

    world = 2
    times: dict[str, dict[int, list[float]]] = {"sparkddl": {}, "plain": {}}
    wall = {"sparkddl": 0.0, "plain": 0.0}
    spark = local_spark()
    try:
        for _ in range(ROUNDS):
            for name in ("plain", "sparkddl"):
                start = time.perf_counter()
                got = spawn_ranks(measure, world, SIZES_MB, WARMUP, REPS) if name == "plain" \
                    else sparkddl.run(in_sparkddl, SIZES_MB, WARMUP, REPS, num_workers=world,
                                      spark=spark)
                wall[name] += time.perf_counter() - start
                for mb, ts in got.items():
                    times[name].setdefault(mb, []).extend(ts)
    finally:
        spark.stop()
    rows = []
    for mb in SIZES_MB:
        nbytes = mb * (1 << 20)
        row: dict[str, Any] = {"size_MiB": mb, "reps": REPS[mb] * ROUNDS}
        for name in ("sparkddl", "plain"):
            t = statistics.median(times[name][mb])
            row[f"{name}_ms"] = t * 1e3
            row[f"{name}_algbw_GBps"] = nbytes / t / 1e9
            row[f"{name}_busbw_GBps"] = 2 * (world - 1) / world * nbytes / t / 1e9
        row["sparkddl_vs_plain"] = row["sparkddl_algbw_GBps"] / row["plain_algbw_GBps"]
        rows.append(row)

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["sparkddl_busbw_GBps"] for r in rows], 0.4,
               label="inside a sparkddl barrier stage")
        ax.bar([x + 0.2 for x in xs], [r["plain_busbw_GBps"] for r in rows], 0.4,
               label="plain torch.distributed (spawn)")
        ax.set_xticks(list(xs), [f"{r['size_MiB']} MiB" for r in rows])
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title("gloo allreduce, 2 ranks on one host (median)")
        top = max(max(r["sparkddl_busbw_GBps"], r["plain_busbw_GBps"]) for r in rows)
        ax.set_ylim(0, top * 1.35)
        ax.legend(fontsize=8, loc="upper center", ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    write_results("allreduce_bandwidth", rows,
                  ["size_MiB", "reps", "sparkddl_ms", "plain_ms", "sparkddl_busbw_GBps",
                   "plain_busbw_GBps", "sparkddl_vs_plain"],
                  "gloo allreduce, 2 ranks, float32: sparkddl barrier stage vs plain "
                  "torch.distributed", plot,
                  notes=f"{WARMUP} warm-up calls, then the median of the reps (slowest rank "
                        f"per rep, {ROUNDS} alternating rounds); bus bandwidth = 2(N-1)/N x "
                        f"bytes/time, N=2. Time in the calls: sparkddl.run "
                        f"{wall['sparkddl']:.1f}s, spawn {wall['plain']:.1f}s.",
                  extra={"times_s": times})


if __name__ == "__main__":
    main()
