"""Reader-bound training: sparkddl's data plane against a serial loop over the same files.

The setting of issue 35: a ``Linear(64, 10)`` (the step costs little, so the data plane is
what is measured), batch 1024, one worker, 1 M rows x 64 float32 features + an int label,
written by Spark (``df.write.parquet``) and read where they are. Side by side, in one
process with one torch thread:
  - serial loop: each row group read with pyarrow, features viewed as numpy, sliced into
    batches as torch tensors and trained on, all in one thread (plain; and with every row
    group permuted first, as a shuffling loop would);
  - sparkddl: ``epoch_batches`` of a 1-rank plan of the same files, trained on by the same
    step, for each reader on this stack, with reader threads and inline (readerPool=dummy);
  - the step alone on one batch held in memory: the ceiling.
Then the same through ``TorchEstimator.fit`` (numWorkers=1, local[2]): steady samples/s and
data_wait_s from the history (epochs after the first). Every loop runs REPEATS epochs; the
median counts.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

D, BATCH, REPEATS, FIT_EPOCHS = 64, 1024, 5, 4


def write_table(spark, rows: int, path: str) -> float:
    from pyspark.sql import functions as F
    start = time.perf_counter()
    (spark.range(rows, numPartitions=4)
     .select(F.array(*[F.rand(i).cast("float") for i in range(D)]).alias("features"),
             (F.col("id") % 10).cast("int").alias("label"))
     .write.parquet(path))
    return time.perf_counter() - start


class Step:
    """The same model and SGD step for every loop."""

    def __init__(self) -> None:
        import torch
        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Linear(D, 10)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def __call__(self, x, y) -> None:
        self.opt.zero_grad()
        self.torch.nn.functional.cross_entropy(self.model(x), y.long()).backward()
        self.opt.step()


def serial(path: str, step: Step, shuffle: bool) -> int:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    rng = np.random.default_rng(0)
    n = 0
    for file in sorted(Path(path).glob("*.parquet")):
        pf = pq.ParquetFile(file)
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g, columns=["features", "label"])
            x = table.column("features").combine_chunks().flatten().to_numpy().reshape(-1, D)
            y = table.column("label").to_numpy()
            if shuffle:
                order = rng.permutation(len(x))
                x, y = x[order], y[order]
            with warnings.catch_warnings():  # read-only Arrow memory, never written
                warnings.simplefilter("ignore", UserWarning)
                xt, yt = torch.from_numpy(x), torch.from_numpy(y)
            for i in range(0, len(x) - BATCH + 1, BATCH):
                step(xt[i:i + BATCH], yt[i:i + BATCH])
                n += BATCH
    return n


def sparkddl_loop(prepared, step: Step, epoch: int, **reader) -> int:
    from sparkddl.data import epoch_batches
    plan = prepared.train.plan(1, BATCH, **reader)
    n = 0
    for batch in epoch_batches(plan, 0, epoch):
        step(batch["features"], batch["label"])
        n += len(batch["label"])
    return n


def ceiling(rows: int, step: Step) -> int:
    import torch
    x, y = torch.rand(BATCH, D), torch.randint(0, 10, (BATCH,))
    for _ in range(rows // BATCH):
        step(x, y)
    return rows // BATCH * BATCH


def rate(fn) -> tuple[float, float]:
    """(median, best) samples/s over REPEATS epochs."""
    rates = []
    for epoch in range(REPEATS):
        start = time.perf_counter()
        n = fn(epoch)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), max(rates)


def fit(spark, path: str, reader: str, store: str) -> dict:
    import torch

    from sparkddl import TorchEstimator
    est = TorchEstimator(model=torch.nn.Linear(D, 10),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                         loss=torch.nn.CrossEntropyLoss(), batchSize=BATCH, epochs=FIT_EPOCHS,
                         numWorkers=1, store=store, reader=reader, progress=False,
                         checkpointEvery=0)
    start = time.perf_counter()
    history = est.fit(spark.read.parquet(path)).history
    wall = time.perf_counter() - start
    steady = history[1:]
    return {"samples_per_s": statistics.median(r["samples_per_sec"] for r in steady),
            "data_wait_s": statistics.median(r.get("data_wait_s", float("nan"))
                                             for r in steady),
            "epoch_s": statistics.median(r["epoch_time_s"] for r in steady), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-fit", action="store_true")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    from reader_throughput import readers

    from sparkddl.data import DataSpec, prepare
    names, missing = readers()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/table"
        spark = local_spark()
        write_s = write_table(spark, args.rows, path)
        prepared = prepare(f"file://{path}", DataSpec.of("features", "label"), num_workers=1,
                           batch_size=BATCH)
        runs = {"serial loop": lambda e: serial(path, Step(), False),
                "serial loop, rows permuted": lambda e: serial(path, Step(), True)}
        for name in names:
            runs[f"sparkddl {name}, reader threads"] = \
                lambda e, n=name: sparkddl_loop(prepared, Step(), e, reader=n)
            runs[f"sparkddl {name}, inline"] = \
                lambda e, n=name: sparkddl_loop(prepared, Step(), e, reader=n,
                                                reader_pool="dummy")
        runs["step alone (ceiling)"] = lambda e: ceiling(args.rows, Step())
        rows = []
        for label, fn in runs.items():
            median, best = rate(fn)
            rows.append({"loop": label, "samples_per_s": median, "best_samples_per_s": best})
            print(f"{label}: {median / 1e6:.3f} M/s", flush=True)
        fits = []
        if not args.no_fit:
            for name in names:
                f = fit(spark, path, name, f"file://{tmp}/store")
                fits.append({"reader": name, **f})
                print(f"fit {name}: {f}", flush=True)
        spark.stop()
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["ratio_vs_serial"] = row["samples_per_s"] / base
    for f in fits:
        f["ratio_vs_serial"] = f["samples_per_s"] / base

    def plot(out: Path) -> None:
        import matplotlib.pyplot as plt
        labels = [r["loop"] for r in rows] + [f"fit, {f['reader']}" for f in fits]
        values = [r["samples_per_s"] / 1e6 for r in rows] + [f["samples_per_s"] / 1e6
                                                             for f in fits]
        fig, ax = plt.subplots(figsize=(8, 1 + 0.4 * len(labels)))
        ax.barh(labels[::-1], values[::-1])
        ax.axvline(base / 1e6, color="k", lw=0.8, ls="--")
        ax.set_xlabel("million samples/s trained (Linear(64, 10), batch 1024, 1 torch thread)")
        fig.tight_layout()
        fig.savefig(out, dpi=120)

    fit_md = ""
    if fits:
        fit_md = ("\n\nThrough `TorchEstimator.fit` (numWorkers=1, local[2], epochs after the "
                  "first, median):\n\n| reader | samples/s | x serial | data_wait_s | epoch s |"
                  "\n|---|---|---|---|---|\n" + "\n".join(
                      f"| {f['reader']} | {f['samples_per_s']:,.0f} | "
                      f"{f['ratio_vs_serial']:.2f} | {f['data_wait_s']:.3f} | "
                      f"{f['epoch_s']:.3f} |" for f in fits))
    write_results("reader_bound", rows,
                  ["loop", "samples_per_s", "best_samples_per_s", "ratio_vs_serial"],
                  f"Reader-bound training, {args.rows:,} rows x {D} floats written by Spark, "
                  f"read in place, batch {BATCH}", plot,
                  notes=f"Spark wrote the table in {write_s:.1f}s. Median of "
                        f"{REPEATS} epochs per loop.{missing}",
                  extra={"fits": fits}, more_md=fit_md)


if __name__ == "__main__":
    main()
