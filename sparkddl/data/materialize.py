"""Driver side: a DataFrame -> validated, fingerprinted Parquet shards in the Store (the
executors' side, encoding and writing each partition: data/encode.py).

Data identified by its plan and input files (file scans, ranges) is written in one pass:
a count sizes the row groups (a file scan answers it from the footers), then one job, without
a shuffle, has every task encode its partition and write it with pyarrow, and report its
files and what the driver checks afterwards (nulls, array lengths, labels, the split); data
that fails the checks is deleted and refused. Other data (local rows, RDDs) is profiled first,
with a content hash, so that a cache hit writes nothing. A later call with unchanged data finds
``meta.json`` under the same fingerprint and writes nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

from sparkddl.config import check_validation
from sparkddl.data import fingerprint as fp
from sparkddl.data.dataset import Dataset, PreparedData, read_meta, write_meta
from sparkddl.data.encode import SPLIT_COL, merge_stats, write_partition
from sparkddl.data.memory import job_errors, row_group_bytes
from sparkddl.data.plan import check_enough_rows
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec, spark_kind
from sparkddl.errors import DataError, StoreError
from sparkddl.session import cluster_context
from sparkddl.store import Store, faults
from sparkddl.tables.parquet import list_row_groups

log = logging.getLogger(__name__)

ROW_GROUP_BYTES = 16 << 20  # smaller groups shuffle better; 16 MiB keeps reads efficient
FILE_BYTES = 128 << 20
MIN_GROUPS_PER_RANK = 4


@dataclass(frozen=True)
class Profile:
    rows: int
    val_rows: int
    nulls: dict[str, int]
    # array column -> (min, max) length (None, None: no rows)
    lengths: dict[str, tuple[int | None, int | None]]
    null_elements: dict[str, int]
    bad_split_values: int
    content_hash: str | None
    label_ranges: tuple[tuple[str, int, int], ...] = ()


def min_row_groups(num_workers: int) -> int:
    """Row groups every materialization gets at least: 4 per rank for up to the next power
    of two of ``num_workers`` ranks. Ranks share rows, not row groups, so any world reads
    the copy exactly; the row groups are for the reader threads of each rank (one piece
    each) and for memory (a row group is decoded whole)."""
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
    if spec.raw:  # arrays of varying length are kept as they are
        identity["raw"] = True
    sc = cluster_context(spark)
    if fp.identified_by_files(df):
        # the plan and the files identify the data: one pass, which checks while it writes
        with job_errors(sc, "listing the DataFrame's files"):
            identity.update(plan=fp.plan_text(df), roots=fp.root_paths(df),
                            files=fp.input_file_identity(spark, df))
        cached = _cached(store, fp.fingerprint(identity))
        if cached:
            return cached
        with job_errors(sc, "sizing the training data"):
            rows, widths, varying = _size(df, selected, spec, kinds)
        if not rows:
            raise DataError("the DataFrame is empty: there is nothing to train on")
        profile = None
    else:  # local data, RDDs, tables: a content hash first, so that a cache hit writes nothing
        with job_errors(sc, "profiling the training data"):
            profile = _profile(selected, spec, kinds, split_col, content_hash=True)
        _check(profile, spec, split_col, fraction, num_workers, batch_size)
        identity.update(content=profile.content_hash, rows=profile.rows)
        cached = _cached(store, fp.fingerprint(identity))
        if cached:
            return cached
        rows, widths = profile.rows, {c: lo for c, (lo, _) in profile.lengths.items()}
        varying = {c for c, (lo, hi) in profile.lengths.items() if lo != hi and _may_vary(spec, c)}
    key = fp.fingerprint(identity)
    columns = tuple(column_spec(c, spec.role(c), kinds[c], widths.get(c),
                                spec.declared_shape(c), varying=c in varying)
                    for c in spec.columns)
    with job_errors(sc, "writing the training data"):
        prepared, sums = _write(selected, columns, store, key, rows, groups,
                                row_group_bytes(sc, ROW_GROUP_BYTES))
    if profile is None:
        profile = _written_profile(sums, spec, kinds, split_col)
        try:
            _check(profile, spec, split_col, fraction, num_workers, batch_size)
        except DataError:
            store.delete(store.data_url(key))  # nothing of bad data stays in the store
            raise
    prepared = dataclasses.replace(prepared, label_ranges=profile.label_ranges)
    try:
        write_meta(store, key, prepared)  # last: it marks the Parquet beside it complete
    except BaseException:  # unmarked, no fit reads the parts again: free their space
        store.discard(posixpath.dirname(prepared.train.url))
        raise
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
    check_validation(validation)
    if isinstance(validation, str):
        if validation not in kinds:
            raise DataError(f"validation column {validation!r} not found; the data has "
                            f"{', '.join(kinds)}")
        if kinds[validation] not in ("boolean", "integral"):
            raise DataError(f"validation column {validation!r} must be boolean or 0/1, "
                            f"not {kinds[validation]}")
        return validation, 0.0
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
    arrays = [c for c in spec.columns if _is_array(kinds[c])]
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
        if _may_vary(spec, name):
            continue  # kept as they are: the transformFn makes tensors of them
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


def _may_vary(spec: DataSpec, name: str) -> bool:
    """Arrays of this column may differ in length: a transformFn makes tensors of them."""
    return spec.raw and spec.role(name) == "feature"


def _size(df: Any, selected: Any, spec: DataSpec, kinds: dict[str, str]
          ) -> tuple[int, dict[str, int], set[str]]:
    """Rows (a count of ``df``, which has the rows of ``selected``: a file scan answers it
    without reading columns, where the split's ``rand`` would make Spark read them), the
    length of every array column in its first row with values (the write checks every
    other row), and the array columns whose lengths vary (with a transformFn: their lengths
    are aggregated over all rows)."""
    from pyspark.sql import functions as F

    rows = df.count()
    arrays = [c for c in spec.columns if _is_array(kinds[c])]
    if not rows or not arrays:
        return rows, {}, set()
    free = [c for c in arrays if _may_vary(spec, c)]
    varying: set[str] = set()
    if free:
        row = selected.agg(*[F.min(F.size(_q(c))).alias(f"lo{i}") for i, c in enumerate(free)],
                           *[F.max(F.size(_q(c))).alias(f"hi{i}") for i, c in enumerate(free)]
                           ).collect()[0]
        varying = {c for i, c in enumerate(free) if row[f"lo{i}"] != row[f"hi{i}"]}
    present = functools.reduce(lambda a, b: a & b, [_q(c).isNotNull() for c in arrays])
    first = selected.where(present).select(*[F.size(_q(c)).alias(f"w{i}")
                                             for i, c in enumerate(arrays)]).limit(1).collect()
    if not first:  # every row has a null array: the check says so
        return rows, {c: 0 for c in arrays}, varying
    return rows, {c: int(first[0][f"w{i}"]) for i, c in enumerate(arrays)}, varying


def _is_array(kind: str) -> bool:
    return kind == "vector" or kind.startswith("array")


def _written_profile(sums: dict[str, Any], spec: DataSpec, kinds: dict[str, str],
                     split_col: str | None) -> Profile:
    arrays = [c for c in spec.columns if _is_array(kinds[c])]
    labels = [c for c in spec.label_cols if kinds[c] == "integral"]
    return Profile(
        rows=int(sums.get("rows", 0)), val_rows=int(sums.get("val_rows", 0)),
        nulls={c: int(sums.get(f"nulls:{c}", 0)) for c in spec.columns},
        lengths={c: (sums.get(f"lo:len:{c}"), sums.get(f"hi:len:{c}")) for c in arrays},
        null_elements={c: int(sums.get(f"elements:{c}", 0)) for c in arrays},
        bad_split_values=int(sums.get("bad_split", 0)) if split_col else 0,
        content_hash=None,
        label_ranges=tuple((c, int(sums[f"lo:label:{c}"]), int(sums[f"hi:label:{c}"]))
                           for c in labels if f"lo:label:{c}" in sums))


def _write(selected: Any, columns: tuple[ColumnSpec, ...], store: Store, key: str, rows: int,
           min_groups: int, group_bytes: int) -> tuple[PreparedData, dict[str, Any]]:
    """One Spark job, no shuffle: every task encodes its partition and writes it with pyarrow
    into row groups of exactly the same number of rows (a few of them short: the end of each
    task's part), so that the ranks' pieces are whole row groups where the counts allow; each
    task reports its
    files and the statistics :func:`_check` needs, which come back summed."""
    row_bytes = sum(c.nbytes for c in columns) + 8
    total_bytes = max(rows * row_bytes, 1)
    group_rows = max(1, min(group_bytes, math.ceil(total_bytes / min_groups)) // row_bytes)
    files = max(min_groups, math.ceil(total_bytes / FILE_BYTES))
    parts = f"parts-{uuid.uuid4().hex[:8]}"  # a concurrent writer of the same data gets its own
    root = store.data_url(key, parts)
    partitions = cluster_context(selected.sparkSession).partitions(selected)
    # many small partitions: fewer files; unknown (Connect): coalescing never adds files
    if partitions is None or partitions > 2 * files:
        selected = selected.coalesce(files)
    try:
        return _write_job(selected, columns, store, key, root, group_rows)
    except BaseException as exc:
        # what the failed job wrote (as much as a full disk took) has no meta.json, so no
        # fit reads it again; left, it would hold the space the next fit needs
        store.discard(root)
        error = None if isinstance(exc, StoreError) else faults.from_executor(exc)
        if error is None:
            raise
        raise error from exc


def _write_job(selected: Any, columns: tuple[ColumnSpec, ...], store: Store, key: str,
               root: str, group_rows: int) -> tuple[PreparedData, dict[str, Any]]:
    """:func:`_write`'s Spark job, writing under ``root``, and what it reported."""
    reports = selected.mapInArrow(
        functools.partial(write_partition, columns, store, root, group_rows),
        "split string, path string, stats string").collect()
    sums: dict[str, Any] = {}
    written: dict[str, set[str]] = {"train": set(), "val": set()}
    for report in reports:
        sums = merge_stats(sums, json.loads(report["stats"]))
        if report["path"]:
            written[report["split"]].add(store.fs_path(report["path"]))
    fs = store.filesystem()

    def split(name: str) -> Dataset | None:
        url = f"{root}/{SPLIT_COL}={name}"
        for stray in store.listdir(url):  # what failed or retried task attempts left
            if posixpath.join(store.fs_path(url), stray) not in written[name]:
                store.delete(f"{url}/{stray}")
        if not written[name]:
            return None
        groups = list_row_groups(fs, store.fs_path(url))
        return Dataset(url, columns, tuple(g.rows for g in groups))

    train, val = split("train"), split("val")
    if train is None and not sums.get("bad_rows"):
        raise DataError("no training rows were written; check the validation setting")
    # (train is None only when rows could not be encoded: the caller's _check refuses them)
    return PreparedData(train, val, key, cache_hit=False), sums  # pyright: ignore[reportArgumentType]
