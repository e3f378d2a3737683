"""Validate the performance model (`sparkddl plan`) against measured epochs.

For two models of different compute/communication ratios, on local[2]: calibrate once
(2 workers), predict the epoch time of allreduce for 1 and 2 workers, then fit for real with
1 and 2 workers and compare (median epoch time after the first epoch). Goal: within 25 %.
Data: scikit-learn's digits tiled 24x with noise (~43k rows), per-worker batch 64.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results  # noqa: E402

MODELS = {"mlp 64-256-256-10 (85 k params)": (64, [256, 256], 10),
          "wide mlp 64-2048-2048-10 (4.3 M params)": (64, [2048, 2048], 10)}
BATCH, EPOCHS = 64, 4


def tiled_digits(spark, copies: int = 24):
    import numpy as np
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    xs = np.concatenate([x / 16.0 + rng.normal(0, 0.05, x.shape) for _ in range(copies)])
    ys = np.tile(y, copies)
    rows = [(r.astype(np.float32).tolist(), int(label)) for r, label in zip(xs, ys)]
    return spark.createDataFrame(rows, "features array<float>, label int")


def measured(df, arch, workers: int, store: str) -> float:
    import torch

    from sparkddl import TorchEstimator
    from sparkddl.models import MLP
    model = TorchEstimator(model=MLP(*arch), optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                           loss=torch.nn.CrossEntropyLoss(), batchSize=BATCH, epochs=EPOCHS,
                           numWorkers=workers, validation=None, store=store,
                           progress=False).fit(df)
    return statistics.median(r["epoch_time_s"] for r in model.history[1:])


def main() -> None:
    import torch

    from sparkddl import perfmodel
    from sparkddl.config import TrainConfig
    from sparkddl.models import MLP
    spark = local_spark()
    df = tiled_digits(spark).cache()
    df.count()
    rows, calibrations = [], {}
    with tempfile.TemporaryDirectory() as store:
        config = TrainConfig(batch_size=BATCH, num_workers=2, validation=None, store=store)
        for name, arch in MODELS.items():
            cal, n_rows = perfmodel.run_calibration(
                spark, df, MLP(*arch), lambda p: torch.optim.SGD(p, lr=0.05), "cross_entropy",
                config, candidates=tuple(c for c in perfmodel.CANDIDATES
                                         if c.label == "allreduce"))
            calibrations[name] = cal
            for workers in (1, 2):
                pred = perfmodel.predictions(cal, n_rows, (workers,))[0]
                meas = measured(df, arch, workers, store)
                rows.append({"model": name, "workers": workers, "predicted_s": pred.epoch_s,
                             "measured_s": meas, "error": pred.epoch_s / meas - 1,
                             "bottleneck": pred.bottleneck,
                             "compute_ms": pred.compute_s * 1e3, "comm_ms": pred.comm_s * 1e3,
                             "input_ms": pred.input_s * 1e3})
                print(rows[-1], flush=True)
    spark.stop()

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3.5))
        labels = [f"{r['model'].split(' (')[0]}\n{r['workers']} worker(s)" for r in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["predicted_s"] for r in rows], 0.4, label="predicted")
        ax.bar([x + 0.2 for x in xs], [r["measured_s"] for r in rows], 0.4, label="measured")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("time per epoch (s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)

    write_results("perf_model", rows, ["model", "workers", "predicted_s", "measured_s", "error",
                                       "bottleneck", "compute_ms", "comm_ms", "input_ms"],
                  "Performance model vs measured epoch time (allreduce, local[2])", plot,
                  notes=f"~43k rows, batch {BATCH}/worker, SGD; calibrated once per model "
                        "with 2 workers; measured = median epoch after the first.")


if __name__ == "__main__":
    main()
