"""Batch inference: ``TorchModel.transform`` against pyspark's ``predict_batch_udf`` and a
hand-written pandas UDF, on the same table and model, in one run.

The setting of issue 57: a Parquet table written by Spark (1,000,000 rows, ``features``
``array<float>`` of 64, 8 files), an MLP 64 -> 256 -> 256 -> 4 from ``TorchEstimator.fit``,
``local[2]``. Each path scores the table and writes to Spark's ``noop`` sink; one warm-up
pass, then the median of ``--passes``. The paths:

  - ``transform(df).select("prediction")`` and ``transform(df)`` whole (every column): the
    table's features are columns of its Parquet files, so the scoring workers read them
    there (``sparkddl.ml.inplace``);
  - ``transform`` of the same rows with the features computed (a slice of all 64), which
    Spark hands over to the UDFs (as for any DataFrame that is not a scan of Parquet);
  - ``pyspark.ml.functions.predict_batch_udf`` (batch 1,024; its ``make_predict_fn`` builds
    the module from the fitted weights once per Python worker, as pyspark caches it);
  - a hand-written scalar-iterator ``pandas_udf`` with the module cached per worker.

Every path's predictions agree on a sample of ``--check`` rows (by id). Each pass's CPU
seconds (Spark's JVM, its Python workers and this process) are reported beside its wall
time: other work on the machine inflates wall time, not a path's CPU. Also reported: the
bytes of the model each path ships, and the peak resident memory of Spark's Python workers
(VmHWM of the ``pyspark.daemon``/``pyspark.worker`` processes when the run ends).
"""
from __future__ import annotations

import argparse
import atexit
import io
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pandas as pd  # module level: pandas_udf reads the hand-written UDF's type hints

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, timed, write_results

D, HIDDEN, CLASSES = 64, 256, 4


def mlp():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(D, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def write_table(spark, rows: int, path: str, files: int = 8) -> None:
    from pyspark.sql import functions as F
    (spark.range(rows, numPartitions=files)
     .select("id", F.array(*[F.rand(i).cast("float") for i in range(D)]).alias("features"),
             (F.col("id") % CLASSES).cast("int").alias("label"))
     .write.parquet(path))


def fitted(spark, path: str, store: str):
    """A TorchModel of the MLP, trained one epoch on 20,000 rows of the table."""
    import torch

    from sparkddl import TorchEstimator
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=256, epochs=1, numWorkers=1,
                         store=store, progress=False)
    return est.fit(spark.read.parquet(path).limit(20_000))


def state_bytes(model) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


_cached: dict = {}  # the hand-written UDF's module, per Python worker


def hand_udf(weights: bytes):
    import numpy as np
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("double")  # type: ignore[call-overload]
    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        import torch
        if "m" not in _cached:
            m = mlp()
            m.load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
            _cached["m"] = m.eval()
        m = _cached["m"]
        for s in batches:
            x = torch.from_numpy(np.stack(s.to_numpy()).astype(np.float32, copy=False))
            with torch.inference_mode():
                yield pd.Series(m(x).argmax(-1).double().numpy())
    return predict


def batch_udf(weights: bytes):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import DoubleType

    def make_predict_fn():
        import torch
        m = mlp()
        m.load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
        m.eval()

        def predict(inputs):
            with torch.inference_mode():
                return m(torch.from_numpy(inputs)).argmax(-1).double().numpy()
        return predict
    return predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=1024,
                             input_tensor_shapes=[[D]])


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and everything under it (Spark's JVM, its
    Python workers): a pass's CPU cost, which other work on the machine does not inflate as
    it inflates wall time."""
    import psutil
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += times.user + times.system
    return total


def worker_peak_mb() -> float:
    """The largest VmHWM of Spark's Python workers now alive (MB)."""
    peak = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            cmd = (status.parent / "cmdline").read_bytes()
            if b"pyspark.daemon" not in cmd and b"pyspark.worker" not in cmd:
                continue
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return peak / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--check", type=int, default=20_000)
    ap.add_argument("--name", default="inference")
    args = ap.parse_args()

    import pyspark
    import torch
    from pyspark.sql import functions as F
    spark = local_spark("local[2]")
    tmp = Path(tempfile.mkdtemp(prefix="sparkddl-inference-"))
    atexit.register(shutil.rmtree, tmp, True)  # 250 MB of table a run, on any exit
    path = str(tmp / "table")
    write_table(spark, args.rows, path)
    model = fitted(spark, path, f"file://{tmp / 'store'}")
    weights = state_bytes(model.module())
    spark.stop()

    # Each path scores a DataFrame into one with a prediction column; a pass writes its
    # prediction alone (or, for "every column", all of transform's columns) to noop. The
    # paths run on two sessions, pyspark's then sparkddl's: a session's Python workers are
    # its own, and sparkddl's code leaves the workers it ran in quicker to start a task
    # (sparkddl.task.archives), which pyspark's paths on their own would not get.
    sessions = [
        {"predict_batch_udf (batch 1,024)": lambda df: df.withColumn(
            "prediction", batch_udf(weights)("features")),
         "hand-written pandas_udf": lambda df: df.withColumn(
            "prediction", hand_udf(weights)("features"))},
        {'transform(df).select("prediction")': model.transform,
         "transform(df), every column": model.transform,
         # the same rows with the features computed (a slice of all 64): not columns of the
         # files, so transform scores them from the columns Spark hands over
         "transform, features computed (handed over by Spark)": lambda df: model.transform(
             df.withColumn("features", F.slice("features", 1, D)))},
    ]
    rows, got, peaks = [], {}, []
    for paths in sessions:
        spark = local_spark("local[2]")
        df = spark.read.parquet(path)
        sample = df.where(f"id < {args.check}")  # the same predictions on it, by id
        for name, score in paths.items():
            got[name] = {r.id: r.prediction
                         for r in score(sample).select("id", "prediction").collect()}
        for name, score in paths.items():
            cpu: list[float] = []
            whole = name.endswith("every column")

            def one(score=score, cpu=cpu, whole=whole, df=df) -> None:
                start = cpu_seconds()
                scored = score(df)
                (scored if whole else scored.select("prediction")).write.format(
                    "noop").mode("overwrite").save()
                cpu.append(cpu_seconds() - start)
            times = timed(one, args.passes + 1)[1:]
            med = statistics.median(times)
            rows.append({"path": name, "s_per_pass": round(med, 2),
                         "rows_per_s": round(args.rows / med),
                         "cpu_s_per_pass": round(statistics.median(cpu[1:]), 2),
                         "passes_s": ", ".join(f"{t:.2f}" for t in times)})
        peaks.append(worker_peak_mb())
        spark.stop()
    ref = got["predict_batch_udf (batch 1,024)"]
    agree = {k: sum(v[i] == ref[i] for i in ref) / len(ref) for k, v in got.items()}
    order = ['transform(df).select("prediction")', "transform(df), every column",
             "transform, features computed (handed over by Spark)",
             "predict_batch_udf (batch 1,024)", "hand-written pandas_udf"]
    rows.sort(key=lambda r: order.index(r["path"]))
    base = next(r for r in rows if r["path"].startswith("predict_batch_udf"))
    for r in rows:
        r["vs_predict_batch_udf"] = round(base["s_per_pass"] / r["s_per_pass"], 2)
    shipped = {"transform (weights + architecture)": len(weights),
               "predict_batch_udf / pandas_udf (weights in the closure)": len(weights)}
    peak = max(peaks)

    def plot(out: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.barh([r["path"] for r in rows], [r["rows_per_s"] / 1e3 for r in rows])
        ax.set_xlabel("thousand rows/s (higher is better)")
        ax.set_title(f"Scoring {args.rows:,} rows x {D} on local[2]")
        fig.tight_layout()
        fig.savefig(out, dpi=120)

    notes = (f"pyspark {pyspark.__version__}, torch {torch.__version__}; {args.rows:,} rows x "
             f"{D} float32 in 8 Parquet files, MLP {D}-{HIDDEN}-{HIDDEN}-{CLASSES}; median of "
             f"{args.passes} passes after a warm-up, each written to the noop sink; pyspark's "
             "paths and sparkddl's on sessions of their own (fresh Python workers). "
             f"Predictions agree with predict_batch_udf's on {args.check:,} rows: "
             + ", ".join(f"{k} {v:.4f}" for k, v in agree.items())
             + f". Python workers' peak RSS: {peak:.0f} MB.")
    write_results(args.name, rows, ["path", "s_per_pass", "rows_per_s", "vs_predict_batch_udf",
                                    "cpu_s_per_pass", "passes_s"],
                  "Batch inference: TorchModel.transform vs predict_batch_udf", plot, notes,
                  extra={"agreement": agree, "shipped_bytes": shipped,
                         "worker_peak_mb": peak, "pyspark": pyspark.__version__})
    spark.stop()


if __name__ == "__main__":
    main()
