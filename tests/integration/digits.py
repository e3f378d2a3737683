"""scikit-learn's digits as Spark DataFrames, shared by the estimator tests."""
from __future__ import annotations

import functools

import numpy as np
import torch

N_PIXELS = 64


@functools.lru_cache(maxsize=1)
def _arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def digits_df(spark, kind: str = "array"):
    """``array``: features array<float> + label; ``pixels``: p0..p63 doubles + label (for
    VectorAssembler). A fixed ``split`` column (0..4) allows reproducible held-out sets."""
    x, y = _arrays()
    split = np.arange(len(y)) % 5
    if kind == "array":
        rows = [(r.tolist(), int(label), int(s)) for r, label, s in zip(x, y, split)]
        return spark.createDataFrame(rows, "features array<float>, label int, split int")
    cols = ", ".join(f"p{i} double" for i in range(N_PIXELS))
    rows = [tuple(float(v) for v in r) + (int(label), int(s)) for r, label, s in zip(x, y, split)]
    return spark.createDataFrame(rows, f"{cols}, label int, split int")


def mlp(seed: int = 0) -> torch.nn.Module:
    """The same initial weights on every call, so that test outcomes are reproducible."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(N_PIXELS, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))


def accuracy(pred_df) -> float:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(pred_df)
