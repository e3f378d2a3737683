"""How fast sparkddl feeds one rank's device, side by side with a plain loop, in one run.

The GPU issue's measurement, reproducible anywhere: the same Parquet table on disk, the same
MLP and batch, three ways, each for 2 epochs with the second (steady) epoch reported:

- **on device**: the whole table already on the device as one tensor, sliced per batch (the
  ceiling: no feed at all);
- **plain loop**: one process, ``pyarrow.parquet`` batches -> ``torch.from_numpy`` ->
  ``.to(device)`` -> step, serially (what a user would write by hand);
- **sparkddl**: ``TorchEstimator(numWorkers=1)`` reading the table in place (the reader's
  threads, then ``train/feed.py``: on CUDA the next batches are copied through a ring of
  pinned buffers on a side stream while a step computes; on the CPU they pass through).

On CUDA (a GPU executor on ``local-cluster`` through a discovery script) the shapes are the
issue's (400k x 256 and 100k x 3072 floats, an MLP with a 2048-wide hidden layer, 4.7 M
parameters at 256 features); on the CPU they are scaled down (100k x 256, 25k x 3072, a
256-wide hidden layer), so the run stays short and the feed, not the matrix multiplies,
dominates. Goals (GPU): sparkddl >= 1.0x the plain loop, >= 0.9x on-device where a step
outlasts a batch's copy. On the CPU the ratio shows that the feed costs nothing there.

    .venv/bin/python benchmarks/gpu_feed.py       # writes results/gpu_feed.{json,md,png}
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

BATCH = 1024
EPOCHS = 2


def shapes(cuda: bool) -> list[tuple[int, int]]:
    return [(400_000, 256), (100_000, 3072)] if cuda else [(100_000, 256), (25_000, 3072)]


def model(width: int, cuda: bool):
    import torch.nn as nn
    hidden = 2048 if cuda else 256
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 10))


def write_table(path: Path, rows: int, width: int, files: int = 4) -> None:
    """``features`` (list of ``width`` float32) and ``label`` (int64), ``files`` files of
    16k-row row groups, written with pyarrow as a data team's table would be."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        x = rng.standard_normal((len(part), width), dtype=np.float32)
        y = (x[:, :10].argmax(axis=1)).astype(np.int64)  # learnable, so training is real
        offsets = pa.array(np.arange(0, (len(part) + 1) * width, width, dtype=np.int32))
        table = pa.table({"features": pa.ListArray.from_arrays(offsets, pa.array(x.ravel())),
                          "label": pa.array(y)})
        pq.write_table(table, path / f"part-{i:03d}.parquet", row_group_size=16_384)


def _trainer(width: int, device):
    """A fresh model on ``device`` and its training step ``step(x, y)`` (SGD)."""
    import torch
    net = model(width, device.type == "cuda").to(device)
    opt, loss_fn = torch.optim.SGD(net.parameters(), lr=0.01), torch.nn.CrossEntropyLoss()

    def step(x, y) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()
    return step


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def on_device(path: Path, width: int, device) -> float:
    """Steady-epoch samples/s with the whole table on the device."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    table = pq.read_table(path)
    x = torch.from_numpy(table.column("features").combine_chunks().values.to_numpy()
                         .reshape(-1, width)).to(device)
    y = torch.from_numpy(np.asarray(table.column("label"))).to(device)
    step = _trainer(width, device)
    rate = 0.0
    for _ in range(EPOCHS):
        _sync(device)
        start, seen = time.perf_counter(), 0
        for i in range(0, len(y) - BATCH + 1, BATCH):
            step(x[i:i + BATCH], y[i:i + BATCH])
            seen += BATCH
        _sync(device)
        rate = seen / (time.perf_counter() - start)
    return rate


def plain_loop(path: Path, width: int, device) -> float:
    """Steady-epoch samples/s of a serial pyarrow -> torch -> device loop in one process."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    step = _trainer(width, device)
    rate = 0.0
    for _ in range(EPOCHS):
        _sync(device)
        start, seen = time.perf_counter(), 0
        for file in sorted(path.glob("*.parquet")):
            for batch in pq.ParquetFile(file).iter_batches(BATCH, columns=["features", "label"]):
                if batch.num_rows < BATCH:
                    continue  # as sparkddl: whole batches only
                x = torch.from_numpy(batch.column(0).values.to_numpy().reshape(-1, width))
                y = torch.from_numpy(np.asarray(batch.column(1)))
                step(x.to(device), y.to(device))
                seen += BATCH
        _sync(device)
        rate = seen / (time.perf_counter() - start)
    return rate


def with_sparkddl(spark, path: Path, width: int, cuda: bool, store: Path) -> tuple[float, float]:
    """(steady-epoch samples/s, cold wall of the fit in s) of TorchEstimator on 1 rank."""
    import torch

    from sparkddl import TorchEstimator

    est = TorchEstimator(model=model(width, cuda),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=BATCH, epochs=EPOCHS, numWorkers=1,
                         store=str(store), progress=False, useGpu=cuda)
    start = time.perf_counter()
    fitted = est.fit(spark.read.parquet(str(path)))
    return fitted.history[-1]["samples_per_sec"], time.perf_counter() - start


def gpu_spark(tmp: Path):
    """local-cluster with this machine's GPUs given to its executor by a discovery script."""
    import torch

    from sparkddl.task.gpu import write_discovery_script
    script = write_discovery_script(tmp / "discover.sh")
    gpus, cores = torch.cuda.device_count(), os.cpu_count() or 2
    return local_spark(f"local-cluster[1,{cores},16384]",
                       **{"spark.worker.resource.gpu.amount": str(gpus),
                          "spark.worker.resource.gpu.discoveryScript": str(script),
                          "spark.executor.resource.gpu.amount": str(gpus),
                          "spark.executor.resource.gpu.discoveryScript": str(script)})


def main() -> None:
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    # the same torch threads as the rank (its task's CPUs: 1 on local[2]), so that on the CPU
    # the loops differ in how they are fed, not in how many cores multiply
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="sparkddl-gpu-feed-"))
    rows_out = []
    try:
        spark = gpu_spark(tmp) if cuda else local_spark("local[2]")
        for rows, width in shapes(cuda):
            path = tmp / f"t{rows}x{width}"
            write_table(path, rows, width)
            ceiling = on_device(path, width, device)
            plain = plain_loop(path, width, device)
            ours, cold = with_sparkddl(spark, path, width, cuda, tmp / f"store{width}")
            rows_out.append({
                "shape": f"{rows:,} x {width}", "device": str(device),
                "on_device_per_s": ceiling, "plain_loop_per_s": plain, "sparkddl_per_s": ours,
                "sparkddl_vs_plain": ours / plain, "sparkddl_vs_on_device": ours / ceiling,
                "sparkddl_cold_fit_s": cold,
                "torch_threads": torch.get_num_threads()})
        spark.stop()
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)

    def plot(png: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [r["shape"] for r in rows_out]
        kinds = [("on_device_per_s", "data on device"), ("plain_loop_per_s", "plain pyarrow loop"),
                 ("sparkddl_per_s", "sparkddl (steady epoch)")]
        for k, (key, name) in enumerate(kinds):
            ax.bar([i + 0.27 * (k - 1) for i in range(len(labels))],
                   [r[key] / 1000 for r in rows_out], 0.27, label=name)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel("thousand samples/s")
        ax.set_title(f"feeding one rank on {device.type}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=110)

    write_results("gpu_feed", rows_out,
                  ["shape", "device", "on_device_per_s", "plain_loop_per_s", "sparkddl_per_s",
                   "sparkddl_vs_plain", "sparkddl_vs_on_device", "sparkddl_cold_fit_s",
                   "torch_threads"],
                  "Feeding one rank: data on device vs a plain pyarrow loop vs sparkddl",
                  plot=plot, notes=f"Batch {BATCH}, {EPOCHS} epochs, steady (second) epoch; "
                  "one rank; the table read in place from Parquet on disk.")


if __name__ == "__main__":
    main()
