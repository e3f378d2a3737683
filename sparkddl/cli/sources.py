"""Data sources named in presets, and the held-out split used by ``evaluate``."""
from __future__ import annotations

from typing import Any

from sparkddl.errors import DataError

SKLEARN_SCALE = {"digits": 1 / 16.0}  # pixel intensities 0..16 -> 0..1


def load_source(spark: Any, source: str) -> Any:
    """``sklearn:<name>`` (features array<float> + label), ``table:<name>``,
    ``parquet:<path>`` or a plain path to Parquet data."""
    kind, sep, rest = source.partition(":")
    if sep and kind == "sklearn":
        return sklearn_dataset(spark, rest)
    if sep and kind == "table":
        return _read(lambda: spark.table(rest), f"table {rest!r}")
    path = rest if sep and kind == "parquet" else source
    return _read(lambda: spark.read.parquet(path), f"data path {path!r}")


def _read(reader: Any, what: str) -> Any:
    from pyspark.errors import AnalysisException
    try:
        return reader()
    except AnalysisException as exc:
        first = str(exc).strip().splitlines()[0]
        raise DataError(f"{what} cannot be read: {first}") from None


def sklearn_dataset(spark: Any, name: str) -> Any:
    import numpy as np
    import sklearn.datasets

    loader = getattr(sklearn.datasets, f"load_{name}", None)
    if loader is None:
        raise DataError(f"scikit-learn has no bundled dataset {name!r}; try digits, iris, wine "
                        "or breast_cancer")
    x, y = loader(return_X_y=True)
    x = (np.asarray(x, dtype=np.float64) * SKLEARN_SCALE.get(name, 1.0)).astype(np.float32)
    rows = [(row.tolist(), int(label)) for row, label in zip(x, y)]
    return spark.createDataFrame(rows, "features array<float>, label int")


def holdout_split(df: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """(rest, held-out): a row is held out by a hash of its values and the seed, so the split
    is the same on every run and independent of partitioning."""
    from pyspark.sql import functions as F

    if not 0 <= fraction < 1:
        raise DataError(f"data.test_fraction must be in [0, 1), got {fraction}")
    bucket = F.pmod(F.xxhash64(*[F.col(f"`{c}`") for c in df.columns], F.lit(seed)),
                    F.lit(10_000))
    cut = int(round(fraction * 10_000))
    return df.filter(bucket >= cut), df.filter(bucket < cut)
