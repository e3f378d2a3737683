"""Strategies side by side: time per epoch, bytes per epoch and final validation accuracy.

Two tasks, 2 workers on local[2], every strategy in one run:
  - digits: scikit-learn's digits, MLP 64-128-10, 15 epochs;
  - wide: 20,000 synthetic rows of 256 features in 10 classes (a random linear teacher),
    MLP 256-2048-2048-10 (4.7 M parameters, 18.9 MB of float32 gradients per step),
    3 epochs — where communication matters.
Time per epoch is the median over epochs after the first; bytes are per rank per epoch.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import digits, local_spark, write_results

STRATEGIES = {
    "allreduce": ("allreduce", {}),
    "allreduce, no overlap": ("allreduce", {"overlap": False}),
    "fp16": ("allreduce", {"compression": "fp16"}),
    "bf16": ("allreduce", {"compression": "bf16"}),
    "powersgd r=4": ("allreduce", {"compression": "powersgd", "rank": 4}),
    "topk 1%": ("allreduce", {"compression": "topk", "ratio": 0.01}),
    "sign": ("allreduce", {"compression": "sign"}),
    "local_sgd p=8": ("local_sgd", {"period": 8}),
    "dynamic_averaging": ("dynamic_averaging", {"threshold": 0.01, "check_every": 4}),
    "gossip ring": ("gossip", {"topology": "ring"}),
    "ssp s=2": ("ssp", {"staleness": 2}),
}


def wide(spark, rows: int = 20_000, dim: int = 256):
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    y = (x @ rng.standard_normal((dim, 10))).argmax(1)
    return spark.createDataFrame([(r.tolist(), int(label)) for r, label in zip(x, y)],
                                 "features array<float>, label int")


def mlp(*arch):
    from sparkddl.models import MLP
    return lambda: MLP(*arch)


TASKS = {"digits": (digits, mlp(64, [128], 10), 15, 32),
         "wide": (wide, mlp(256, [2048, 2048], 10), 3, 64)}


def run_task(spark, task: str, store: str) -> list[dict]:
    import torch

    from sparkddl import TorchEstimator
    make_df, make_model, epochs, batch = TASKS[task]
    df = make_df(spark).cache()
    df.count()
    rows = []
    for label, (name, options) in STRATEGIES.items():
        model = TorchEstimator(
            model=make_model(), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
            loss=torch.nn.CrossEntropyLoss(), batchSize=batch, epochs=epochs, numWorkers=2,
            validation=0.2, store=store, strategy=name, strategyOptions=options,
            finalWeights="last", progress=False, checkpointEvery=0).fit(df)
        later = model.history[1:] or model.history
        last = model.history[-1]
        rows.append({"task": task, "strategy": label,
                     "epoch_s": statistics.median(r["epoch_time_s"] for r in later),
                     "comm_MB_per_epoch": statistics.median(r["comm_bytes"] for r in later) / 1e6,
                     "comm_calls": int(statistics.median(r["comm_calls"] for r in later)),
                     "val_accuracy": last["val_accuracy"], "val_loss": last["val_loss"]})
        print(rows[-1], flush=True)
    df.unpersist()
    return rows


def main() -> None:
    spark = local_spark()
    with tempfile.TemporaryDirectory() as store:
        rows = [r for task in TASKS for r in run_task(spark, task, store)]
    spark.stop()
    for task in TASKS:
        mine = [r for r in rows if r["task"] == task]
        base = next(r for r in mine if r["strategy"] == "allreduce")
        for r in mine:
            r["bytes_vs_allreduce"] = r["comm_MB_per_epoch"] / base["comm_MB_per_epoch"]
            r["time_vs_allreduce"] = r["epoch_s"] / base["epoch_s"]

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(len(TASKS), 3, figsize=(14, 3.2 * len(TASKS)), squeeze=False)
        for row_axes, task in zip(axes, TASKS):
            mine = [r for r in rows if r["task"] == task]
            names = [r["strategy"] for r in mine]
            for ax, key, title in zip(row_axes, ("epoch_s", "comm_MB_per_epoch", "val_accuracy"),
                                      ("time per epoch (s)", "MB sent per rank per epoch",
                                       "final validation accuracy")):
                ax.barh(names[::-1], [r[key] for r in mine][::-1])
                ax.set_title(f"{task}: {title}", fontsize=9)
                ax.tick_params(labelsize=7)
                if key == "comm_MB_per_epoch":
                    ax.set_xscale("log")
        fig.tight_layout()
        fig.savefig(path, dpi=110)

    write_results("strategies", rows, ["task", "strategy", "epoch_s", "time_vs_allreduce",
                                       "comm_MB_per_epoch", "bytes_vs_allreduce", "comm_calls",
                                       "val_accuracy"],
                  "Strategies, 2 workers on local[2]", plot,
                  notes="digits: MLP 64-128-10, 15 epochs, batch 32/worker; wide: MLP "
                        "256-2048-2048-10 (4.7 M parameters) on 20k synthetic rows, 3 epochs, "
                        "batch 64/worker; Adam 1e-3; epoch time = median after the first.")


if __name__ == "__main__":
    main()
