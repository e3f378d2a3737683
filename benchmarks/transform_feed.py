"""How long the training loop waits for data when every batch is decoded by a transformFn.

scikit-learn's digits tiled with noise, written once with pyarrow as Parquet (the state users
start from): as PNG bytes (8x8 grayscale) and, for comparison, as the same pixels in a
``list<float>`` column. Each is read in place by ``TorchEstimator`` (``spark.read.parquet``),
2 ranks on local[2], batch 256, a small CNN, 3 epochs, default reader threads (2): the PNG
runs decode with ``sparkddl.transforms:decode_images`` on the reader's threads; the numeric
run has no transform. Reported per run (the mean of epochs 2-3, after warm-up): the share of
each epoch's time the loop waited for a batch (``data_wait_s / epoch_time_s``, rank 0), the
samples per second, and that throughput relative to the numeric run. A run with one reader
thread shows what the threads buy.
"""
from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

TILES = 20  # 1,797 digits x 20 = 35,940 rows
BATCH = 256
EPOCHS = 3
GOAL = 0.10  # the bar: the loop waits on the reader at most 10 % of the time


def write_tables(root: Path, tiles: int = TILES) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    x = np.tile((digits.data / 16.0).astype(np.float32), (tiles, 1))
    x = np.clip(x + rng.normal(0.0, 0.05, x.shape).astype(np.float32), 0, 1)
    y = np.tile(digits.target.astype(np.int64), tiles)
    pixels = (x * 255).round().astype(np.uint8)

    def png(row):
        buf = io.BytesIO()
        Image.fromarray(row.reshape(8, 8)).save(buf, "PNG")
        return buf.getvalue()

    started = time.perf_counter()
    images = [png(r) for r in pixels]
    print(f"encoded {len(images)} PNGs in {time.perf_counter() - started:.1f} s")
    for name, column in (("png", pa.array(images, pa.binary())),
                         ("numeric", pa.array((pixels / 255.0).astype(np.float32).tolist(),
                                              pa.list_(pa.float32())))):
        (root / name).mkdir(parents=True)
        for i, rows in enumerate(np.array_split(np.arange(len(y)), 4)):
            pq.write_table(pa.table({"x": column.take(pa.array(rows)),
                                     "label": pa.array(y[rows])}),
                           root / name / f"part-{i}.parquet", row_group_size=2048)
    return len(y)


def cnn():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))


def run(spark, root: Path, name: str, table: str, transform, reader_workers: int) -> dict:
    import torch

    from sparkddl import TorchEstimator
    df = spark.read.parquet(str(root / table))
    est = TorchEstimator(model=cnn(), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="x", labelCol="label",
                         batchSize=BATCH, epochs=EPOCHS, numWorkers=2, validation=None,
                         store=str(root / f"store-{name}"), progress=False,
                         transformFn=transform, readerWorkers=reader_workers,
                         featureShapes={} if transform else {"x": [1, 8, 8]})
    started = time.perf_counter()
    model = est.fit(df)
    wall = time.perf_counter() - started
    warm = model.history[1:]
    wait = sum(r["data_wait_s"] for r in warm) / sum(r["epoch_time_s"] for r in warm)
    rate = sum(r["samples_per_sec"] for r in warm) / len(warm)
    return {"run": name, "transform": "decode_images" if transform else "none",
            "reader_threads": reader_workers, "wait_share": round(wait, 4),
            "samples_per_s": round(rate), "fit_s": round(wall, 1),
            "train_accuracy": round(model.history[-1]["train_accuracy"], 3)}


def main() -> None:
    from sparkddl.transforms import decode_images
    spark = local_spark()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = write_tables(root)
        results = [run(spark, root, "numeric list<float>", "numeric", None, 2),
                   run(spark, root, "PNG + transformFn", "png", decode_images, 2),
                   run(spark, root, "PNG + transformFn, 1 thread", "png", decode_images, 1)]
    base = results[0]["samples_per_s"]
    for r in results:
        r["vs_numeric"] = round(r["samples_per_s"] / base, 2)
        r["wait_goal_met"] = r["wait_share"] <= GOAL

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        names = [r["run"] for r in results]
        a.bar(names, [100 * r["wait_share"] for r in results])
        a.axhline(100 * GOAL, color="red", linestyle="--", label="10 % of the epoch")
        a.set_ylabel("% of epoch time waiting for data (rank 0)")
        a.legend()
        b.bar(names, [r["samples_per_s"] for r in results])
        b.set_ylabel("samples / s (both ranks)")
        for ax in (a, b):
            ax.tick_params(axis="x", labelrotation=15, labelsize=8)
        fig.suptitle(f"transformFn feed: {rows} digits, 2 ranks, batch {BATCH}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)

    write_results("transform_feed", results,
                  ["run", "transform", "reader_threads", "wait_share", "samples_per_s",
                   "vs_numeric", "wait_goal_met", "fit_s", "train_accuracy"],
                  f"PNG decoded by a transformFn vs numeric arrays ({rows} rows, 2 ranks, "
                  f"batch {BATCH})", plot,
                  notes=f"Parquet on local disk read in place; mean of epochs 2-{EPOCHS}; "
                        "wait_share = data_wait_s / epoch_time_s on rank 0.")


if __name__ == "__main__":
    main()
