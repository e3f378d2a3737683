"""Rows/s delivered as torch tensors by one rank's reader vs a plain pyarrow read.

Materializes N rows of 64 float features + an int label through sparkddl (Spark writes the
Parquet), then, on the same files, in one process:
  - plain pyarrow: each row group read with pyarrow.parquet and turned into tensors
    zero-copy, in one thread (what any Parquet reader has to pay; no shuffling, no fixed
    batch size);
  - sparkddl: ``epoch_batches`` for a 1-rank plan with each reader (Petastorm where it loads
    on this stack, and the Arrow reader (pyarrow.parquet)): decoding, shuffle buffer, fixed-size
    batches of 256, with 2 reader threads, with the shuffle buffer off, and read inline.
Each is run REPEATS times; the best rate counts (the files are in the page cache after the
first pass for all of them).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

D, BATCH, REPEATS = 64, 256, 3
SETTINGS = {"shuffle buffer 10k, 2 threads": {"reader_workers": 2},
            "no shuffle, 2 threads": {"reader_workers": 2, "shuffle_buffer": 0},
            "shuffle buffer 10k, inline": {"reader_pool": "dummy"}}


def materialize(rows: int, store: str):
    from pyspark.sql import functions as F

    from sparkddl.data import DataSpec, prepare
    spark = local_spark()
    df = spark.range(rows).select(
        F.array(*[F.rand(i).cast("float") for i in range(D)]).alias("features"),
        (F.col("id") % 10).cast("int").alias("label"))
    start = time.perf_counter()
    prepared = prepare(df, DataSpec.of("features", "label"), num_workers=2, batch_size=BATCH,
                       store=store)
    elapsed = time.perf_counter() - start
    spark.stop()
    return prepared.train, elapsed


def plain_pyarrow(dataset) -> int:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from sparkddl.store import Store
    from sparkddl.tables.parquet import list_row_groups
    store = Store.from_uri(dataset.url)
    fs = store.filesystem()
    n = 0
    for group in list_row_groups(fs, store.fs_path(dataset.url)):
        with fs.open_input_file(group.path) as f:
            table = pq.ParquetFile(f).read_row_group(group.index)
        feats = table.column("features").combine_chunks()
        raw = np.frombuffer(feats.buffers()[2], dtype="<f4")
        start = feats.offset * D
        with warnings.catch_warnings():  # read-only Arrow memory, never written here
            warnings.simplefilter("ignore", UserWarning)
            x = torch.from_numpy(raw[start:start + len(feats) * D].reshape(-1, D))
            y = torch.from_numpy(table.column("label").to_numpy())
        assert len(x) == len(y)
        n += len(x)
    return n


def sparkddl_reader(dataset, **reader) -> int:
    from sparkddl.data import epoch_batches
    plan = dataset.plan(1, BATCH, **reader)
    return sum(len(b["features"]) for b in epoch_batches(plan, 0, 0))


def readers() -> tuple[list[str], str]:
    """The readers this stack can run, and a note on any left out."""
    from sparkddl.data.petastorm_source import unavailable_reason
    problem = unavailable_reason()
    if problem:
        return ["arrow"], f" The Petastorm reader cannot run on this stack ({problem})."
    return ["petastorm", "arrow"], ""


def best_rate(fn) -> float:
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        rows = fn()
        rates.append(rows / (time.perf_counter() - start))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    names, missing = readers()
    with tempfile.TemporaryDirectory() as tmp:
        dataset, prep_s = materialize(args.rows, tmp)
        runs = {"plain pyarrow (row groups -> tensors)": lambda: plain_pyarrow(dataset)}
        for name in names:
            for setting, options in SETTINGS.items():
                runs[f"sparkddl {name} reader, {setting}"] = \
                    lambda o=options, n=name: sparkddl_reader(dataset, reader=n, **o)
        rows = [{"reader": name, "rows_per_s": best_rate(fn)} for name, fn in runs.items()]
    base = rows[0]["rows_per_s"]
    for row in rows:
        row["ratio_vs_plain"] = row["rows_per_s"] / base

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 1 + 0.4 * len(rows)))
        ax.barh([r["reader"] for r in rows][::-1], [r["rows_per_s"] / 1e6 for r in rows][::-1])
        ax.set_xlabel("million rows/s into torch tensors (64 float32 features + label)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    write_results("reader_throughput", rows, ["reader", "rows_per_s", "ratio_vs_plain"],
                  f"Reader throughput, {args.rows:,} rows x {D} floats, one rank", plot,
                  notes=f"Materializing them through Spark (local[2]) took {prep_s:.1f}s."
                        f"{missing}")


if __name__ == "__main__":
    main()
