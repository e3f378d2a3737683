"""Spark's reading of a table's files named one by one (a Delta version, an Iceberg
snapshot) for the DataFrames ``read_delta`` and ``read_iceberg`` return: right in Spark too,
so that a DataFrame transformed and materialized holds the rows a fit in place reads."""
from __future__ import annotations

from typing import Any, Callable

from sparkddl.tables.parquet import parquet_file
from sparkddl.tables.table import Table


def union(frames: list[Any]) -> Any:
    """One DataFrame of ``frames``; files written before a column was added lack it."""
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out


def file_rows(filesystem: Any, path: str) -> int:
    with parquet_file(filesystem, path) as f:
        return int(f.metadata.num_rows)


def without_deleted(spark: Any, filesystem: Any, version: Table,
                    read: Callable[[str, list[Any]], Any]) -> Any:
    """The files of ``version`` that have deletes, less the rows they delete: ``read(path,
    extra)`` is Spark's reading of one file with the ``extra`` columns selected (the file's
    number and each row's index in it, ``_metadata.row_index``), anti-joined with the
    deleted (number, index) pairs, which go to Spark as arrays, not a tuple a row."""
    import numpy as np
    import pandas as pd
    from pyspark.sql import functions as F

    masks = version.masks
    assert masks is not None, "called for a table with row masks only"
    tagged, numbers, indexes = [], [], []
    for n, path in enumerate(p for p in version.paths if p in masks.by_file):
        gone = masks.deleted(filesystem, path, file_rows(filesystem, path))
        assert gone is not None  # a file of by_file has a mask
        numbers.append(np.full(len(gone), n, np.int32))
        indexes.append(gone.astype(np.int64))
        tagged.append(read(path, [F.lit(n).alias("__sparkddl_file"),
                                  F.col("_metadata.row_index").alias("__sparkddl_row")]))
    gone = spark.createDataFrame(pd.DataFrame({"__sparkddl_file": np.concatenate(numbers),
                                               "__sparkddl_row": np.concatenate(indexes)}),
                                 "__sparkddl_file int, __sparkddl_row long")
    return union(tagged).join(gone, ["__sparkddl_file", "__sparkddl_row"], "left_anti") \
        .drop("__sparkddl_file", "__sparkddl_row")
