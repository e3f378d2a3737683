"""Data plane: DataFrames or Parquet -> per-rank fixed-size tensor batches, read through
Petastorm or pyarrow alone (:func:`sparkddl.data.plan.resolve_reader` picks)."""
from __future__ import annotations

import os
from typing import Any

from sparkddl.data.dataset import Dataset, PreparedData
from sparkddl.data.plan import ShardPlan
from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import ColumnSpec, DataSpec
from sparkddl.errors import DataError
from sparkddl.store import Store

__all__ = ["ColumnSpec", "DataSpec", "Dataset", "PreparedData", "ShardPlan", "epoch_batches",
           "prepare"]


def prepare(data: Any, spec: DataSpec, *, num_workers: int, batch_size: int,
            store: "Store | str | None" = None, validation: float | str | None = None,
            seed: int = 0) -> PreparedData:
    """Validate ``data`` and make it readable by every rank.

    ``data`` is a Spark DataFrame (materialized to Parquet in ``store``, reused while the data
    is unchanged) or the URL of an existing Parquet dataset (read in place). ``validation``
    is a fraction (with ``seed``) or a boolean/0-1 column for DataFrames, and a Parquet URL
    for URL inputs.
    """
    if isinstance(data, (str, os.PathLike)):
        from sparkddl.data.source import prepare_parquet
        if validation is not None and not isinstance(validation, (str, os.PathLike)):
            raise DataError("with a Parquet URL as data, validation must be another Parquet URL "
                            f"(got {validation!r}); or pass a DataFrame to split it")
        return prepare_parquet(os.fspath(data), spec, num_workers=num_workers,
                               batch_size=batch_size,
                               validation_url=os.fspath(validation) if validation else None)
    if not hasattr(data, "sparkSession") or not hasattr(data, "schema"):
        raise DataError(f"data must be a Spark DataFrame or a Parquet URL, got "
                        f"{type(data).__name__}")
    if store is None:
        raise DataError("a DataFrame is materialized to Parquet first: give a store "
                        "(a path or URI such as file:///tmp/sparkddl)")
    from sparkddl.data.materialize import materialize
    return materialize(data.sparkSession, data, spec, Store.from_uri(store),
                       num_workers=num_workers, batch_size=batch_size, validation=validation,
                       seed=seed)
