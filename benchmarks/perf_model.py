"""Validate the performance model (`sparkddl plan`) against measured epochs and memory.

For two models of different compute/communication ratios, on local[2]: calibrate once
(2 workers), predict the epoch time of allreduce for 1 and 2 workers (and fsdp's for 2 on
the wide model, where its run for memory gives its time too) and each rank's peak
memory for several strategies, then fit for real and compare: the median epoch time after
the first epoch, and the largest ``peak_rss_MB`` in the history (rank 0's peak resident
memory). Goal: within 25 % for both. Data: scikit-learn's digits tiled 24x with noise (~43k
rows), per-worker batch 64. Python workers are not reused, so each fit's ranks are fresh
processes, as on a cluster's first job.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, md_table, write_results

MODELS = {"mlp 64-256-256-10 (85 k params)": (64, [256, 256], 10),
          "wide mlp 64-2048-2048-10 (4.3 M params)": (64, [2048, 2048], 10)}
BATCH, EPOCHS = 64, 4
# memory: (strategy, options, workers) fitted per model, beside allreduce's 1 and 2 workers
MEMORY_RUNS = {"mlp 64-256-256-10 (85 k params)": [("ssp", {"staleness": 3}, 2),
                                                  ("gossip", {}, 2)],
               "wide mlp 64-2048-2048-10 (4.3 M params)": [("fsdp", {}, 2),
                                                          ("dynamic_averaging", {}, 2)]}


def tiled_digits(spark, copies: int = 24):
    import numpy as np
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    xs = np.concatenate([x / 16.0 + rng.normal(0, 0.05, x.shape) for _ in range(copies)])
    ys = np.tile(y, copies)
    rows = [(r.astype(np.float32).tolist(), int(label)) for r, label in zip(xs, ys)]
    return spark.createDataFrame(rows, "features array<float>, label int")


def measured(df, arch, workers: int, store: str, strategy: str = "allreduce",
             options: dict | None = None, epochs: int = EPOCHS) -> tuple[float, float]:
    """(median epoch time after the first, the largest peak_rss_MB) of a real fit."""
    import torch

    from sparkddl import TorchEstimator
    from sparkddl.models import MLP
    model = TorchEstimator(model=MLP(*arch), optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                           loss=torch.nn.CrossEntropyLoss(), batchSize=BATCH, epochs=epochs,
                           numWorkers=workers, validation=None, store=store, strategy=strategy,
                           strategyOptions=options or {}, progress=False).fit(df)
    return (statistics.median(r["epoch_time_s"] for r in model.history[1:]),
            max(r["peak_rss_MB"] for r in model.history))


def main() -> None:
    import torch

    from sparkddl import perfmodel
    from sparkddl.config import TrainConfig
    from sparkddl.models import MLP
    from sparkddl.perfmodel.calibrate import Candidate
    from sparkddl.perfmodel.memory import predict as predict_memory
    spark = local_spark(**{"spark.python.worker.reuse": "false"})
    df = tiled_digits(spark).cache()
    df.count()
    rows, mem_rows, calibrations = [], [], {}

    def time_row(name, strategy, workers, cal, n_rows, meas):
        pred = perfmodel.Model(cal).predict(strategy, workers, n_rows)
        rows.append({"model": name, "strategy": strategy, "workers": workers,
                     "predicted_s": pred.epoch_s, "measured_s": meas,
                     "error": pred.epoch_s / meas - 1, "bottleneck": pred.bottleneck,
                     "compute_ms": pred.compute_s * 1e3, "comm_ms": pred.comm_s * 1e3,
                     "input_ms": pred.input_s * 1e3})
        print(rows[-1], flush=True)

    def memory_row(name, strategy, options, workers, cal, peak):
        pred = predict_memory(cal["memory"], strategy, strategy, options, workers)
        mem_rows.append({"model": name, "strategy": strategy, "workers": workers,
                         "predicted_MB": pred.peak_MB, "measured_MB": peak,
                         "error": pred.peak_MB / peak - 1, "runtime_MB": pred.runtime_MB,
                         "model_MB": pred.model_MB, "activations_MB": pred.activations_MB,
                         "temporaries_MB": pred.temporaries_MB,
                         "strategy_MB": pred.strategy_MB, "reader_MB": pred.reader_MB,
                         "checkpoint_MB": pred.checkpoint_MB})
        print(mem_rows[-1], flush=True)

    with tempfile.TemporaryDirectory() as store:
        config = TrainConfig(batch_size=BATCH, num_workers=2, validation=None, store=store)
        for name, arch in MODELS.items():
            cal, n_rows = perfmodel.run_calibration(
                spark, df, MLP(*arch), lambda p: torch.optim.SGD(p, lr=0.05), "cross_entropy",
                config, candidates=(Candidate("allreduce", "allreduce", {}),
                                    Candidate("fsdp", "fsdp", {})))
            calibrations[name] = cal
            for workers in (1, 2):
                meas, peak = measured(df, arch, workers, store)
                time_row(name, "allreduce", workers, cal, n_rows, meas)
                memory_row(name, "allreduce", {}, workers, cal, peak)
            for strategy, options, workers in MEMORY_RUNS[name]:
                meas, peak = measured(df, arch, workers, store, strategy, options, epochs=3)
                if strategy in cal["strategies"]:  # timed in the calibration: fsdp
                    time_row(name, strategy, workers, cal, n_rows, meas)
                memory_row(name, strategy, options, workers, cal, peak)
    spark.stop()

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, (ax, mx) = plt.subplots(2, 1, figsize=(10, 7.5))
        labels = [f"{r['model'].split(' (')[0]}\n{r['strategy']} x{r['workers']}" for r in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["predicted_s"] for r in rows], 0.4, label="predicted")
        ax.bar([x + 0.2 for x in xs], [r["measured_s"] for r in rows], 0.4, label="measured")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("time per epoch (s)")
        ax.legend()
        labels = [f"{r['model'].split(' (')[0]}\n{r['strategy']} x{r['workers']}"
                  for r in mem_rows]
        xs = range(len(mem_rows))
        mx.bar([x - 0.2 for x in xs], [r["predicted_MB"] for r in mem_rows], 0.4,
               label="predicted")
        mx.bar([x + 0.2 for x in xs], [r["measured_MB"] for r in mem_rows], 0.4,
               label="measured (rank 0's peak RSS)")
        mx.set_xticks(list(xs), labels, fontsize=6)
        mx.set_ylabel("peak memory per rank (MB)")
        mx.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)

    mem_md = "\n".join(["#### Peak memory per rank: predicted vs measured (rank 0's peak RSS)",
                        "", *md_table(mem_rows, ["model", "strategy", "workers", "predicted_MB",
                                                 "measured_MB", "error", "runtime_MB",
                                                 "model_MB", "activations_MB",
                                                 "temporaries_MB", "strategy_MB",
                                                 "reader_MB", "checkpoint_MB"])])
    write_results("perf_model", rows, ["model", "strategy", "workers", "predicted_s",
                                       "measured_s", "error", "bottleneck", "compute_ms",
                                       "comm_ms", "input_ms"],
                  "Performance model vs measured epoch time (local[2])", plot,
                  notes=f"~43k rows, batch {BATCH}/worker, SGD; calibrated once per model "
                        "with 2 workers; measured = median epoch after the first.",
                  extra={"memory": mem_rows}, more_md=mem_md)


if __name__ == "__main__":
    main()
