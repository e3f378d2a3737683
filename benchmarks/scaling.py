"""Strong and weak scaling from 1 to 2 workers: TorchEstimator.fit on local[2] and on
local-cluster[2,1,1024], next to plain PyTorch DDP without Spark.

The model, data and optimizer are side_by_side.py's (MLP 64-256-256-10, digits tiled with
noise, Adam lr 1e-3), 5 epochs, every rank with 1 torch thread (spark.task.cpus = 1), so 1
or 2 workers never share a core:
  - strong scaling: the same data (201,264 rows) and global batch 512: 1 worker x 512,
    2 workers x 256;
  - weak scaling: the same per-worker batch (256) and rows per worker: 1 worker on half of
    the data (100,632 rows), 2 workers on all of it. (2 workers x 256 on all the data is the
    same run in both.)
Epoch time is the median of the epochs after the first; samples/s is the rows trained per
second in those epochs. Strong: speed-up = T(1)/T(2), efficiency = speed-up / 2. Weak:
speed-up = throughput(2)/throughput(1), efficiency = T(1)/T(2).
Spark allows one SparkContext per process, so every master runs in a subprocess of this
script (``--master``); ``--master none`` is the plain-PyTorch reference (torch
multiprocessing, gloo on 127.0.0.1, in-memory tensors: no Spark, no reader).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import digits_parquet, local_spark, mlp, spawn_ranks, write_results

MASTERS = ["local[2]", "local-cluster[2,1,1024]", "none"]
EPOCHS, LR, SEED = 5, 1e-3, 0
FULL_TILES = 112  # 201,264 rows; half: 56 tiles
# (workers, per-worker batch, data): the three runs both scalings are built from
RUNS = [(1, 512, "full"), (1, 256, "half"), (2, 256, "full")]


def fit_runs(master: str, data: Path) -> list[dict[str, Any]]:
    import torch

    from sparkddl import TorchEstimator

    spark = local_spark(master)
    out = []
    try:
        frames = {name: spark.read.parquet(f"file://{data}/{name}") for name in ("full", "half")}
        for workers, batch, name in RUNS:
            torch.manual_seed(SEED)
            est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=LR),
                                 loss=torch.nn.CrossEntropyLoss(), batchSize=batch,
                                 epochs=EPOCHS, numWorkers=workers, seed=SEED,
                                 store=f"file://{data}/store", progress=False)
            start = time.perf_counter()
            model = est.fit(frames[name])
            out.append(_summary(workers, batch, name, time.perf_counter() - start,
                                [r["epoch_time_s"] for r in model.history],
                                [r["samples_per_sec"] for r in model.history]))
    finally:
        spark.stop()
    return out


def _summary(workers: int, batch: int, data: str, fit_s: float, epoch_times: list[float],
             rates: list[float]) -> dict[str, Any]:
    return {"workers": workers, "batch_per_worker": batch, "data": data, "fit_s": fit_s,
            "epoch_s": statistics.median(epoch_times[1:]),
            "samples_per_s": statistics.median(rates[1:]),
            "epoch_times_s": [round(t, 3) for t in epoch_times]}


def plain_train(x: Any, y: Any, batch: int) -> dict[str, Any]:
    """One rank of plain DDP: rows rank::world, a new permutation per epoch."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    xs, ys = x[rank::world], y[rank::world]
    torch.manual_seed(SEED)
    model = DDP(mlp())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED * 1000 + rank)
    steps, times = len(ys) // batch, []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        order = torch.randperm(len(ys), generator=gen)
        for s in range(steps):
            idx = order[s * batch:(s + 1) * batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xs[idx]), ys[idx]).backward()
            opt.step()
        times.append(time.perf_counter() - start)
    return {"epoch_times": times, "samples": steps * batch * world}


def plain_runs(data: Path) -> list[dict[str, Any]]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    out = []
    for workers, batch, name in RUNS:
        table = pq.read_table(data / name)
        feats = table.column("features").combine_chunks()
        x = torch.from_numpy(np.array(feats.flatten().to_numpy().reshape(len(feats), -1)))
        y = torch.from_numpy(np.array(table.column("label").to_numpy()))
        start = time.perf_counter()
        r = spawn_ranks(plain_train, workers, x, y, batch)
        out.append(_summary(workers, batch, name, time.perf_counter() - start,
                            r["epoch_times"], [r["samples"] / t for t in r["epoch_times"]]))
    return out


def rows_for(master: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strong and weak scaling rows of one master from its three runs."""
    def run(workers: int, batch: int, data: str) -> dict[str, Any]:
        return next(r for r in runs if (r["workers"], r["batch_per_worker"], r["data"]) ==
                    (workers, batch, data))
    where = "plain PyTorch, no Spark" if master == "none" else master
    rows = []
    for scaling, one in (("strong", run(1, 512, "full")), ("weak", run(1, 256, "half"))):
        two = run(2, 256, "full")
        speedup = two["samples_per_s"] / one["samples_per_s"]
        efficiency = one["epoch_s"] / two["epoch_s"] if scaling == "weak" else \
            (one["epoch_s"] / two["epoch_s"]) / 2
        for r, workers in ((one, 1), (two, 2)):
            rows.append({"master": where, "scaling": scaling, "workers": workers,
                         "global_batch": r["batch_per_worker"] * workers,
                         "batch_per_worker": r["batch_per_worker"],
                         "rows": "201,264" if r["data"] == "full" else "100,632",
                         "epoch_s": r["epoch_s"], "samples_per_s": r["samples_per_s"],
                         "speedup": speedup if workers == 2 else 1.0,
                         "efficiency": efficiency if workers == 2 else 1.0,
                         "fit_s": r["fit_s"], "epoch_times_s": r["epoch_times_s"]})
    return rows


def child(master: str, data: Path, out: Path) -> None:
    logging.getLogger("sparkddl.progress").setLevel(logging.WARNING)
    runs = plain_runs(data) if master == "none" else fit_runs(master, data)
    out.write_text(json.dumps(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", help="run one master in this process (internal)")
    parser.add_argument("--data", type=Path, help="(internal) the generated data")
    parser.add_argument("--out", type=Path, help="(internal) where the child writes")
    args = parser.parse_args()
    if args.master:
        child(args.master, args.data, args.out)
        return
    work = Path(tempfile.mkdtemp(prefix="sparkddl-scaling-"))
    rows, wall = [], {}
    try:
        digits_parquet(work / "full", tiles=FULL_TILES)
        digits_parquet(work / "half", tiles=FULL_TILES // 2)
        for master in MASTERS:
            start = time.perf_counter()
            out = work / f"{len(wall)}.json"
            subprocess.run([sys.executable, __file__, "--master", master, "--data", str(work),
                            "--out", str(out)], check=True)
            wall[master] = time.perf_counter() - start
            rows += rows_for(master, json.loads(out.read_text()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, wall)


COLUMNS = ["master", "scaling", "workers", "global_batch", "batch_per_worker", "rows",
           "epoch_s", "samples_per_s", "speedup", "efficiency"]


def report(rows: list[dict[str, Any]], wall: dict[str, float]) -> None:
    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        masters = list(dict.fromkeys(r["master"] for r in rows))
        for ax, scaling in zip(axes, ("strong", "weak")):
            for k, master in enumerate(masters):
                two = next(r for r in rows if (r["master"], r["scaling"], r["workers"]) ==
                           (master, scaling, 2))
                ax.bar(k, two["efficiency"], color=f"C{k}")
                ax.text(k, two["efficiency"] + 0.02, f"{two['efficiency']:.2f}\n"
                        f"({two['speedup']:.2f}x)", ha="center", fontsize=8)
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks(range(len(masters)), [m.replace(", ", ",\n") for m in masters],
                          fontsize=8)
            ax.set_title(f"{scaling} scaling, 1 -> 2 workers")
            ax.set_ylim(0, 1.2)
        axes[0].set_ylabel("parallel efficiency (speed-up in brackets)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    write_results("scaling", rows, COLUMNS,
                  "Strong and weak scaling 1 -> 2 workers, MLP 64-256-256-10, 1 torch thread "
                  "per rank", plot,
                  notes=f"TorchEstimator.fit, {EPOCHS} epochs, Adam lr {LR:g}; epoch time = "
                        "median after the first. Wall time per master: " +
                        ", ".join(f"{m} {s:.0f}s" for m, s in wall.items()) + ".",
                  extra={"wall_s": wall})


if __name__ == "__main__":
    main()
