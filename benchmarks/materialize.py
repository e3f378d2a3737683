"""Materialization cost: sparkddl's prepare of a DataFrame next to a plain Parquet write.

One local[2] session, one run, the same DataFrame for every row: scikit-learn's digits tiled
to 201,264 rows (``common.digits_parquet``), read from Parquet on disk and turned into what
makes a rewrite necessary:
  - ``vector``: features assembled into a pyspark.ml Vector (VectorAssembler over 64 double
    columns), the usual shape of a DataFrame out of a pyspark.ml pipeline;
  - ``expression``: the array column scaled by an expression (``transform(features, ...)``).
For each, in alternation, ``repeats`` times:
  - plain write: ``df.select(features, label).write.parquet(path)`` (what a user would run
    to export the data: Spark's own encoding, no checks);
  - ``prepare`` cold: sparkddl's validation (nulls, array lengths, labels, split) and write
    into a fresh store, ready for the ranks (vectors stored as raw float32 tensors);
  - ``prepare`` with validation=0.2: the same with the split written as two folders;
  - for reference, ``prepare`` of the table itself (no rewrite: read in place).
Reported: the median seconds of each and the ratio prepare / plain write (the goal: <= 1.5).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import digits_parquet, local_spark, median, write_results

WORKERS = 2
BATCH = 256


def inputs(spark: Any, url: str) -> dict[str, Any]:
    from pyspark.ml.feature import VectorAssembler
    table = spark.read.parquet(url)
    wide = table.selectExpr("label", *[f"cast(features[{i}] as double) as p{i}"
                                       for i in range(64)])
    vector = VectorAssembler(inputCols=[f"p{i}" for i in range(64)],
                             outputCol="features").transform(wide).select("features", "label")
    expression = table.selectExpr("transform(features, v -> v * 2.0f) as features", "label")
    return {"vector": vector, "expression": expression, "table (in place)": table}


def plain_write(df: Any, path: str) -> None:
    df.select("features", "label").write.mode("overwrite").parquet(path)


def prepare_into(df: Any, store: str, validation: float | None) -> Any:
    from sparkddl.data import DataSpec, prepare
    return prepare(df, DataSpec.of("features", "label"), num_workers=WORKERS, batch_size=BATCH,
                   store=store, validation=validation, seed=0)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(df: Any, work: Path, name: str, repeats: int, rewrite: bool) -> dict[str, Any]:
    times: dict[str, list[float]] = {"plain": [], "prepare": [], "prepare_val": []}
    for i in range(repeats):
        key = f"{name.split()[0]}-{i}"
        if rewrite:
            times["plain"].append(  # each lambda runs before the loop moves on
                timed(lambda: plain_write(df, f"file://{work}/plain-{key}")))  # noqa: B023
        times["prepare"].append(
            timed(lambda: prepare_into(df, f"file://{work}/s-{key}", None)))  # noqa: B023
        times["prepare_val"].append(
            timed(lambda: prepare_into(df, f"file://{work}/v-{key}", 0.2)))  # noqa: B023
    row: dict[str, Any] = {"input": name}
    for k, v in times.items():
        row[f"{k}_s"] = median(v) if v else None
    if rewrite:
        row["prepare_vs_plain"] = row["prepare_s"] / row["plain_s"]
        row["prepare_val_vs_plain"] = row["prepare_val_s"] / row["plain_s"]
    return row


def plot(rows: list[dict[str, Any]]) -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = np.arange(len(rows))
        for k, (key, label) in enumerate([("plain_s", "plain df.write.parquet"),
                                          ("prepare_s", "sparkddl prepare"),
                                          ("prepare_val_s", "prepare, validation=0.2")]):
            ax.bar(x + (k - 1) * 0.27, [r[key] or 0 for r in rows], 0.27, label=label)
        ax.set_xticks(x, [r["input"] for r in rows])
        ax.set_ylabel("seconds (median)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    return draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkddl-mat-"))
    try:
        rows_written = digits_parquet(work / "digits", tiles=args.tiles)
        spark = local_spark()
        try:
            frames = inputs(spark, f"file://{work}/digits")
            for df in frames.values():
                df.count()
            rows = [measure(df, work, name, args.repeats, rewrite=name != "table (in place)")
                    for name, df in frames.items()]
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results("materialize", rows, ["input", "plain_s", "prepare_s", "prepare_vs_plain",
                                        "prepare_val_s", "prepare_val_vs_plain"],
                  f"prepare vs a plain Parquet write ({rows_written:,} rows x 64 floats, "
                  f"local[2], median of {args.repeats})", plot=plot(rows),
                  notes="Each prepare writes into a fresh store (cold). Goal: prepare / plain "
                        "<= 1.5.")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
