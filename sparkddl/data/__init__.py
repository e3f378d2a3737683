"""Data plane: DataFrames or Parquet -> per-rank fixed-size tensor batches, read through
Petastorm or pyarrow alone (:func:`sparkddl.data.choice.resolve_reader` picks)."""
from __future__ import annotations

import logging
import os
from typing import Any

from sparkddl.data.dataset import Dataset, PreparedData
from sparkddl.data.plan import ShardPlan
from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import ColumnSpec, DataSpec
from sparkddl.errors import DataError
from sparkddl.store import Store

log = logging.getLogger(__name__)

__all__ = ["ColumnSpec", "DataSpec", "Dataset", "PreparedData", "ShardPlan", "epoch_batches",
           "look", "prepare"]


def prepare(data: Any, spec: DataSpec, *, num_workers: int, batch_size: int,
            store: "Store | str | None" = None, validation: float | str | None = None,
            seed: int = 0, reader: str = "auto",
            looked: PreparedData | str | None = None) -> PreparedData:
    """Validate ``data`` and make it readable by every rank.

    ``data`` is a Spark DataFrame or the URL of an existing Parquet dataset (read in place).
    A DataFrame that is a plain scan of a Parquet table is read in place too
    (``sparkddl.data.inplace`` says when); any other is materialized to Parquet in
    ``store`` (needed then only), and reused while the data is unchanged. ``validation``
    is a fraction (with ``seed``) or a boolean/0-1 column for DataFrames, and a Parquet URL
    for URL inputs.
    ``looked``: what :func:`look` found for these arguments already.
    """
    found = looked if looked is not None else look(
        data, spec, num_workers=num_workers, batch_size=batch_size, validation=validation,
        seed=seed, reader=reader)
    if isinstance(found, PreparedData):
        return found
    if store is None:
        raise DataError(f"this DataFrame is materialized to Parquet first ({found}): give a "
                        "store (a path or URI such as file:///tmp/sparkddl)")
    from sparkddl.data.materialize import materialize
    log.info("data: materializing the DataFrame into the store because %s", found)
    return materialize(data.sparkSession, data, spec, Store.from_uri(store),
                       num_workers=num_workers, batch_size=batch_size, validation=validation,
                       seed=seed)


def look(data: Any, spec: DataSpec, *, num_workers: int, batch_size: int,
         validation: float | str | None = None, seed: int = 0,
         reader: str = "auto") -> PreparedData | str:
    """:func:`prepare`'s half that writes nothing and runs no Python on the executors: the
    data validated and, where it is read in place, listed and planned (a
    :class:`PreparedData`); otherwise why the DataFrame has to be materialized (a str).
    A fit runs it beside the check of the executors' Python."""
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
    from sparkddl.data.inplace import decide
    from sparkddl.data.materialize import validation_setting
    from sparkddl.data.schema import check_columns, spark_kind
    from sparkddl.data.source import prepare_table

    _check_frame(data, spec)
    fields = {f.name: (spark_kind(f.dataType), f.dataType.simpleString())
              for f in data.schema.fields}
    check_columns(spec, fields)
    split_col, fraction = validation_setting(validation, {n: k for n, (k, _) in fields.items()})
    used = list(spec.columns) + ([split_col] if split_col and split_col not in spec.columns
                                 else [])
    decision = decide(data, used, {n: k for n, (k, _) in fields.items()},
                      {n: t for n, (_, t) in fields.items()}, reader,
                      rows_selected=bool(split_col or fraction), split_column=split_col)
    if decision.url is None:
        return decision.why
    prepared = prepare_table(decision.url, spec, num_workers=num_workers,
                             batch_size=batch_size, validation=split_col or fraction or None,
                             seed=seed, table=decision.table)
    log.info("data: reading %s in place (%s); nothing is written to the store",
             decision.url, decision.why)
    return prepared


def _check_frame(df: Any, spec: Any) -> None:
    """What Spark would only say in an error of its own, later: a stream, and columns the
    fit reads whose names the DataFrame holds twice."""
    if df.isStreaming:
        raise DataError("the DataFrame is a stream (spark.readStream), which has no fixed set "
                        "of rows to train epochs on; write it to a table first (e.g. "
                        "writeStream.trigger(availableNow=True).toTable(name)) and fit on "
                        "spark.read.table(name)")
    fold = str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")).lower() != "true"
    names = [f.name.lower() if fold else f.name for f in df.schema.fields]
    twice = [c for c in spec.columns if names.count(c.lower() if fold else c) > 1]
    if twice:
        raise DataError(f"the DataFrame has {len(df.schema.fields)} columns, more than one of "
                        f"them named {', '.join(map(repr, twice))}, so which to train on is "
                        "ambiguous (a join keeps both sides' columns); rename or drop one "
                        "first, e.g. with .alias() on each side of the join or .toDF(...)")
