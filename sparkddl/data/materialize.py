"""Driver side: a DataFrame -> validated, fingerprinted Parquet shards in the Store.

One Spark job profiles the selected columns (row count, nulls, array lengths, the
validation split, and a content hash when the plan alone cannot identify the data); a
second writes them, re-partitioned so that every rank gets several row groups. A later call
with unchanged data finds ``meta.json`` under the same fingerprint and writes nothing.
"""
from __future__ import annotations

import functools
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from sparkddl.data import fingerprint as fp
from sparkddl.data.dataset import Dataset, PreparedData, read_meta, write_meta
from sparkddl.data.memory import heap_errors, row_group_bytes
from sparkddl.data.plan import check_enough_rows, list_row_groups
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec, spark_kind
from sparkddl.errors import DataError
from sparkddl.store import Store

log = logging.getLogger(__name__)

SPLIT_COL = "__split"
ROW_GROUP_BYTES = 16 << 20  # smaller groups shuffle better; 16 MiB keeps reads efficient
FILE_BYTES = 128 << 20
MIN_GROUPS_PER_RANK = 4


@dataclass(frozen=True)
class Profile:
    rows: int
    val_rows: int
    nulls: dict[str, int]
    lengths: dict[str, tuple[int, int]]  # array column -> (min, max) length
    null_elements: dict[str, int]
    bad_split_values: int
    content_hash: str | None
    label_ranges: tuple[tuple[str, int, int], ...] = ()


def min_row_groups(num_workers: int) -> int:
    """Row groups every materialization gets at least: 4 per rank for up to the next power
    of two of ``num_workers`` ranks, so data prepared for 2 workers serves 1-4 evenly."""
    return MIN_GROUPS_PER_RANK * max(4, 1 << (max(num_workers, 1) - 1).bit_length())


def materialize(spark: Any, df: Any, spec: DataSpec, store: Store, *, num_workers: int,
                batch_size: int, validation: float | str | None = None,
                seed: int = 0) -> PreparedData:
    fields = {f.name: (spark_kind(f.dataType), f.dataType.simpleString()) for f in df.schema.fields}
    check_columns(spec, fields)
    kinds = {name: kind for name, (kind, _) in fields.items()}
    split_col, fraction = validation_setting(validation, kinds)
    selected = _select(df, spec, kinds, split_col, fraction, seed)
    groups = min_row_groups(num_workers)
    identity: dict[str, Any] = {"columns": [(c, spec.role(c), kinds[c]) for c in spec.columns],
                                "shapes": spec.feature_shapes, "validation": validation,
                                "seed": seed, "min_row_groups": groups}
    by_files = fp.identified_by_files(df)
    if by_files:
        identity.update(plan=fp.plan_text(df), files=fp.input_file_identity(spark, df))
        cached = _cached(store, fp.fingerprint(identity))
        if cached:
            return cached
    with heap_errors(spark.sparkContext, "profiling the training data"):
        profile = _profile(selected, spec, kinds, split_col, content_hash=not by_files)
    _check(profile, spec, split_col, fraction, num_workers, batch_size)
    if not by_files:
        identity.update(content=profile.content_hash, rows=profile.rows)
        cached = _cached(store, fp.fingerprint(identity))
        if cached:
            return cached
    key = fp.fingerprint(identity)
    columns = tuple(column_spec(c, spec.role(c), kinds[c], profile.lengths.get(c, (None,))[0],
                                spec.declared_shape(c)) for c in spec.columns)
    with heap_errors(spark.sparkContext, "writing the training data"):
        prepared = _write(selected, columns, store, key, profile, groups,
                          row_group_bytes(spark.sparkContext, ROW_GROUP_BYTES))
    write_meta(store, key, prepared)
    log.info("materialized %d rows (%d train, %d validation) to %s", profile.rows,
             prepared.train.rows, prepared.val.rows if prepared.val else 0,
             store.data_url(key))
    return prepared


def _cached(store: Store, key: str) -> PreparedData | None:
    hit = read_meta(store, key)
    if hit is not None:
        log.info("data cache hit: reusing %s (fingerprint %s, %d train rows)",
                 store.data_url(key), key, hit.train.rows)
    return hit


def validation_setting(validation: float | str | None, kinds: dict[str, str]
                        ) -> tuple[str | None, float]:
    if validation is None or validation == 0:
        return None, 0.0
    if isinstance(validation, str):
        if validation not in kinds:
            raise DataError(f"validation column {validation!r} not found; the data has "
                            f"{', '.join(kinds)}")
        if kinds[validation] not in ("boolean", "integral"):
            raise DataError(f"validation column {validation!r} must be boolean or 0/1, "
                            f"not {kinds[validation]}")
        return validation, 0.0
    if isinstance(validation, bool) or not isinstance(validation, (int, float)) or \
            not 0 < validation < 1:
        raise DataError(f"validation must be a fraction in (0, 1), a boolean/0-1 column name, "
                        f"or None; got {validation!r}")
    return None, float(validation)


def _q(name: str) -> Any:
    from pyspark.sql import functions as F
    return F.col("`" + name.replace("`", "``") + "`")


def _select(df: Any, spec: DataSpec, kinds: dict[str, str], split_col: str | None,
            fraction: float, seed: int) -> Any:
    """Only the columns training needs, vectors turned into arrays by Spark itself."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    cols = []
    for name in spec.columns:
        col = _q(name)
        if kinds[name] == "vector":
            col = vector_to_array(col, "float32")
        cols.append(col.alias(name))
    if split_col is not None:
        cols.append(_q(split_col).cast("int").alias(SPLIT_COL))
    elif fraction:
        cols.append((F.rand(seed) < fraction).cast("int").alias(SPLIT_COL))
    else:
        cols.append(F.lit(0).alias(SPLIT_COL))
    return df.select(*cols)


def _profile(selected: Any, spec: DataSpec, kinds: dict[str, str], split_col: str | None,
             content_hash: bool) -> Profile:
    from pyspark.sql import functions as F

    def count_if(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    aggs = [F.count(F.lit(1)).alias("rows"), count_if(_q(SPLIT_COL) == 1).alias("val_rows"),
            count_if(~_q(SPLIT_COL).isin(0, 1) | _q(SPLIT_COL).isNull()).alias("bad_split")]
    arrays = [c for c in spec.columns if kinds[c] == "vector" or kinds[c].startswith("array")]
    for i, name in enumerate(spec.columns):
        aggs.append(count_if(_q(name).isNull()).alias(f"n{i}"))
    for i, name in enumerate(arrays):
        aggs += [F.min(F.size(_q(name))).alias(f"lo{i}"), F.max(F.size(_q(name))).alias(f"hi{i}"),
                 count_if(F.exists(_q(name), lambda x: x.isNull())).alias(f"e{i}")]
    integral_labels = [c for c in spec.label_cols if kinds[c] == "integral"]
    for i, name in enumerate(integral_labels):
        aggs += [F.min(_q(name)).alias(f"lmin{i}"), F.max(_q(name)).alias(f"lmax{i}")]
    if content_hash:
        row_hash = F.xxhash64(*[_q(c) for c in spec.columns], _q(SPLIT_COL))
        aggs.append(F.sum(row_hash.cast("decimal(38,0)")).alias("hash"))
    row = selected.agg(*aggs).collect()[0]
    return Profile(
        rows=int(row["rows"]), val_rows=int(row["val_rows"] or 0),
        nulls={c: int(row[f"n{i}"] or 0) for i, c in enumerate(spec.columns)},
        lengths={c: (row[f"lo{i}"], row[f"hi{i}"]) for i, c in enumerate(arrays)},
        null_elements={c: int(row[f"e{i}"] or 0) for i, c in enumerate(arrays)},
        bad_split_values=int(row["bad_split"] or 0) if split_col else 0,
        content_hash=str(row["hash"]) if content_hash else None,
        label_ranges=tuple((c, int(row[f"lmin{i}"]), int(row[f"lmax{i}"]))
                           for i, c in enumerate(integral_labels)
                           if row[f"lmin{i}"] is not None))


def _check(p: Profile, spec: DataSpec, split_col: str | None, fraction: float,
           num_workers: int, batch_size: int) -> None:
    if p.rows == 0:
        raise DataError("the DataFrame is empty: there is nothing to train on")
    nulls = {c: n for c, n in p.nulls.items() if n}
    if nulls:
        what = ", ".join(f"{c!r} ({n} rows)" for c, n in nulls.items())
        raise DataError(f"null values in {what}; drop or fill them first "
                        "(df.dropna(subset=[...]) or df.fillna(...))")
    elements = {c: n for c, n in p.null_elements.items() if n}
    if elements:
        what = ", ".join(f"{c!r} ({n} rows)" for c, n in elements.items())
        raise DataError(f"arrays with null elements in {what}; fill or drop them first")
    for name, (lo, hi) in p.lengths.items():
        if lo != hi:
            raise DataError(f"column {name!r} holds arrays of unequal length (from {lo} to {hi} "
                            "values); every row needs the same length (pad or truncate first)")
        if not lo:
            raise DataError(f"column {name!r} holds empty arrays")
    if p.bad_split_values:
        raise DataError(f"validation column {split_col!r} has {p.bad_split_values} values that "
                        "are neither 0/1 nor true/false")
    if (split_col or fraction) and p.val_rows == 0:
        raise DataError(f"the validation split selected no rows out of {p.rows}; raise "
                        "validation or mark some rows in the validation column")
    check_enough_rows(p.rows - p.val_rows, num_workers, batch_size)


def _write(selected: Any, columns: tuple[ColumnSpec, ...], store: Store, key: str,
           profile: Profile, min_groups: int, group_bytes: int) -> PreparedData:
    row_bytes = sum(c.nbytes for c in columns) + 8
    total_bytes = profile.rows * row_bytes
    files = max(min_groups, math.ceil(total_bytes / FILE_BYTES))
    parts = f"parts-{uuid.uuid4().hex[:8]}"  # a concurrent writer of the same data gets its own
    encoded = selected.mapInArrow(functools.partial(encode_batches, columns),
                                  _output_schema(columns))
    (encoded.repartition(files).write.partitionBy(SPLIT_COL)
     .option("parquet.block.size", str(group_bytes))
     .parquet(store.spark_url("data", key, parts)))

    def split(value: str) -> Dataset | None:
        url = store.data_url(key, parts, f"{SPLIT_COL}={value}")
        if not store.exists(url):
            return None
        groups = list_row_groups(store.filesystem(), store.fs_path(url))
        return Dataset(url, columns, tuple(g.rows for g in groups))

    train = split("train")
    if train is None:
        raise DataError("no training rows were written; check the validation setting")
    return PreparedData(train, split("val"), key, cache_hit=False,
                        label_ranges=profile.label_ranges)


_DDL = {"float32": "float", "float64": "double", "int64": "bigint"}


def _output_schema(columns: tuple[ColumnSpec, ...]) -> str:
    fields = [f"`{c.name}` {'binary' if c.encoding == 'tensor' else _DDL[c.dtype]}"
              for c in columns]
    return ", ".join(fields + [f"{SPLIT_COL} string"])


def encode_batches(columns: tuple[ColumnSpec, ...], batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow: arrays -> fixed-width little-endian binary, scalars cast, split named.

    Runs on executors, one Arrow batch at a time; output batches stay under 2 GiB of binary
    per column (Arrow's 32-bit offsets)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    widest = max([c.nbytes for c in columns if c.encoding == "tensor"] or [1])
    step = max(1, ((1 << 31) - 1) // widest)
    for whole in batches:
        for start in range(0, whole.num_rows, step):
            batch = whole.slice(start, step)
            arrays = []
            for c in columns:
                col = batch.column(c.name)
                if c.encoding == "tensor":
                    values = col.flatten().to_numpy(zero_copy_only=False)
                    raw = np.ascontiguousarray(values, dtype=np.dtype(c.dtype).newbyteorder("<"))
                    if raw.size != len(col) * c.width:
                        raise ValueError(f"column {c.name!r}: arrays of unequal length")
                    offsets = np.arange(0, (len(col) + 1) * c.nbytes, c.nbytes, dtype=np.int32)
                    col = pa.Array.from_buffers(pa.binary(), len(col),
                                                [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
                else:
                    col = col.cast(pa.from_numpy_dtype(np.dtype(c.dtype)))
                arrays.append(col)
            split = pc.if_else(pc.equal(batch.column(SPLIT_COL), 1), "val", "train")
            yield pa.RecordBatch.from_arrays(arrays + [split], [c.name for c in columns] +
                                             [SPLIT_COL])
