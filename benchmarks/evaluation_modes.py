"""Snapshot evaluation on the driver vs on the ranks vs in a Spark job beside the fit, at a
size where it matters.

One ``local[3]`` session (2 ranks and one slot they leave free, which evaluation="cluster"
runs its job on; 2 cores); N rows x 64 float32 features + an int label (10 Gaussian classes)
written once by Spark (``spark.range`` + SQL, no Python per row) and read in place; half of
them held out (``validation=0.5``: a per-row split inside the row groups). The same fit
(MLP 64-128-10, Adam, batch 1024 per rank, 2 ranks, ``--epochs``, a snapshot every epoch)
with ``evaluation="driver"``, ``"ranks"`` and ``"cluster"``, side by side. Per mode: the fit's
wall time, evaluation seconds per snapshot (``val_time_s``: the driver's, rank 0's, or the
driver's wait for the job),
the driver Python process's CPU seconds during the fit (``getrusage``) and its peak RSS
above where it started (VmRSS sampled every 0.1 s), and the metrics (the same either way).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

D = 64


def write_table(spark, rows: int, path: str) -> float:
    from pyspark.sql import functions as F
    start = time.perf_counter()
    label = F.pmod(F.xxhash64("id"), F.lit(10))
    centre = [F.sin(label * (i + 1)) for i in range(D)]  # a fixed centre per class
    (spark.range(rows, numPartitions=8)
     .select(F.array(*[(c + F.randn(i)).cast("float") for i, c in enumerate(centre)])
             .alias("features"), label.cast("int").alias("label"))
     .write.parquet(path))
    return time.perf_counter() - start


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Peak:
    def __init__(self) -> None:
        self.base, self.peak, self._stop = rss_bytes(), 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.1)

    def __enter__(self) -> "Peak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def fit(spark, path: str, store: str, mode: str, epochs: int) -> dict:
    import torch

    from sparkddl import TorchEstimator
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    est = TorchEstimator(model=model, optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                         loss=torch.nn.CrossEntropyLoss(), batchSize=1024, epochs=epochs,
                         numWorkers=2, validation=0.5, store=store, evaluation=mode,
                         checkpointEvery=0, progress=False, metrics=["accuracy", "f1"])
    df = spark.read.parquet(path)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    with Peak() as peak:
        start = time.perf_counter()
        history = est.fit(df).history
        wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"evaluation": mode, "fit_s": wall,
            "val_s_per_snapshot": statistics.median(r["val_time_s"] for r in history),
            "driver_cpu_s": cpu, "driver_rss_above_start_MB": (peak.peak - peak.base) / 1e6,
            "val_loss": history[-1]["val_loss"], "val_accuracy": history[-1]["val_accuracy"],
            "val_f1": history[-1]["val_f1"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spark = local_spark("local[3]")
        path = f"{tmp}/table"
        write_s = write_table(spark, args.rows, path)
        rows = []
        for mode in ("driver", "ranks", "cluster"):
            rows.append(fit(spark, path, f"file://{tmp}/store-{mode}", mode, args.epochs))
            print(rows[-1], flush=True)
        spark.stop()
    base = rows[0]
    for r in rows:
        for k in ("val_s_per_snapshot", "driver_cpu_s"):
            r[f"{k}_vs_driver"] = r[k] / base[k] if base[k] else float("nan")

    def plot(out: Path) -> None:
        import matplotlib.pyplot as plt
        keys = ["fit_s", "val_s_per_snapshot", "driver_cpu_s", "driver_rss_above_start_MB"]
        fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3))
        for ax, k in zip(axes, keys):
            ax.bar([r["evaluation"] for r in rows], [r[k] for r in rows])
            ax.set_title(k, fontsize=9)
        fig.tight_layout()
        fig.savefig(out, dpi=120)

    name = "evaluation_modes" if args.rows == 4_000_000 else \
        f"evaluation_modes_{args.rows // 1_000_000}m"
    write_results(name, rows,
                  ["evaluation", "fit_s", "val_s_per_snapshot", "driver_cpu_s",
                   "driver_rss_above_start_MB", "val_loss", "val_accuracy", "val_f1",
                   "val_s_per_snapshot_vs_driver", "driver_cpu_s_vs_driver"],
                  f"Snapshot evaluation, driver vs ranks vs cluster: {args.rows:,} rows x {D} "
                  f"floats, half held out, {args.epochs} epochs, 2 ranks, local[3]", plot,
                  notes=f"Spark wrote the table in {write_s:.1f}s; read in place.")


if __name__ == "__main__":
    main()
