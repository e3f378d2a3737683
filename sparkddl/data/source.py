"""Existing Parquet datasets used as they are: no Spark job, no copy. A Parquet URL, or a
DataFrame that is a plain scan of Parquet files (:mod:`sparkddl.data.inplace` decides),
split into training and validation rows inside its row groups (:mod:`sparkddl.data.split`)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from sparkddl.data import fingerprint as fp
from sparkddl.data.batching import value_counts
from sparkddl.data.dataset import Dataset, PreparedData
from sparkddl.data.delta import delta_listing
from sparkddl.data.listing import Listing, hive_listing, partition_names
from sparkddl.data.plan import (RowGroup, check_enough_rows, data_files, list_row_groups,
                                parquet_file)
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec
from sparkddl.data.split import (GROUP_SPLIT_MIN, Selection, choose_groups, column_rows,
                                 fraction_rows, relative)
from sparkddl.errors import DataError
from sparkddl.store import Store

HEAD_ROWS = 1024  # rows read to learn the width of array columns

log = logging.getLogger(__name__)


def arrow_kind(t: Any) -> str:
    import pyarrow as pa
    if pa.types.is_integer(t):
        return "integral"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "floating"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = arrow_kind(t.value_type)
        return f"array:{inner}" if inner in ("integral", "floating") else "unsupported"
    return "unsupported"


def open_parquet(url: str, spec: DataSpec, listing: Listing | None = None) -> Dataset:
    """Describe the Parquet dataset at ``url`` (or ``listing``'s files) from its footers:
    columns, widths, row groups. Null counts come from column statistics; unequal array
    lengths are caught by the reader. Row groups without rows (pyarrow writes an empty table
    as one) stay in ``row_groups``: both readers count them when they shard, so the plan
    must too. Columns of ``spec`` that are not in the files but in ``name=value`` folders
    of a table given by its folder are its partition columns (a listing of its files)."""
    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(store.url())
    try:
        groups = list_row_groups(fs, root, listing)
    except FileNotFoundError as exc:
        raise DataError(f"no Parquet dataset at {url}" if listing is None else
                        f"the table at {url} names files that are not there ({exc}): they were "
                        "deleted (a vacuum, an overwrite) after the table was listed; read the "
                        "table again (a new DataFrame or read_delta) and fit on that") from None
    if not sum(g.rows for g in groups):
        raise DataError(f"no Parquet rows under {url}; point at a directory of Parquet files")
    first = next(g for g in groups if g.rows)  # an empty one has no arrays to measure
    # pages, not whole column chunks
    with parquet_file(fs, first.path, buffer_size=1 << 20) as parquet:
        schema = parquet.schema_arrow
        fields = {n: (arrow_kind(schema.field(n).type), str(schema.field(n).type))
                  for n in schema.names}
        if listing is None:
            listing = _folder_partitions(root, groups, [c for c in spec.columns
                                                        if c not in fields])
        for name, arrow_type in (listing.arrow_types().items() if listing else ()):
            fields.setdefault(name, (arrow_kind(arrow_type), str(arrow_type)))
        check_columns(spec, fields)
        in_files = listing.file_columns(spec.columns) if listing else list(spec.columns)
        # the first rows give the array widths; the footers then check every row group
        head = next(parquet.iter_batches(batch_size=HEAD_ROWS, row_groups=[first.index],
                                         columns=in_files, use_threads=False))
    columns = []
    for name in spec.columns:
        kind = fields[name][0]
        width, varying = None, False
        if kind.startswith("array"):
            lengths = set(np.unique(value_counts(head.column(name))).tolist())
            width = lengths.pop() if len(lengths) == 1 else None
            # with a transformFn, arrays of varying length are read as they are (told from
            # the first rows: a later row of another length in a column whose first rows
            # agree is the reader's DataError)
            varying = width is None and spec.raw and spec.role(name) == "feature"
            if width is None and not varying:
                raise DataError(f"column {name!r} holds arrays of unequal length; every row "
                                "needs the same length (or give a transformFn, which gets "
                                "them as they are)")
        col = column_spec(name, spec.role(name), kind, width, spec.declared_shape(name),
                          varying=varying)
        if not col.raw:
            col = ColumnSpec(col.name, col.role, "list" if width else "scalar", col.dtype,
                             col.shape)
        columns.append(col)
    _check_footers(fs, groups, tuple(columns), {n: fields[n] for n in in_files}, first.path)
    return Dataset(store.url(), tuple(columns), tuple(g.rows for g in groups), listing=listing)


def _folder_partitions(root: str, groups: list[RowGroup], missing: list[str]
                       ) -> Listing | None:
    """The listing of a partitioned table given by its folder whose ``name=value`` folders
    hold the ``missing`` columns (types inferred as Spark does); None where they are not
    partition columns (check_columns then says they are missing)."""
    if not missing:
        return None
    paths = list(dict.fromkeys(g.path for g in groups))
    if not set(missing) <= set(partition_names(root, paths)):
        return None
    return hive_listing(root, paths, missing)


def _footers(fs: Any, groups: list[RowGroup]) -> Any:
    """(path, metadata) of every file of ``groups``, each footer read once."""
    for path in dict.fromkeys(g.path for g in groups):
        with parquet_file(fs, path) as f:
            meta = f.metadata
        yield path, meta


def _check_footers(fs: Any, groups: list[RowGroup], columns: tuple[ColumnSpec, ...],
                   types: dict[str, tuple[str, str]], reference: str) -> None:
    """What the footers already tell, before any rank reads: every file holds the columns
    of the kinds in ``types`` (kind, Arrow type name) of ``reference``, the file they were read
    from, no nulls (column statistics), and no
    arrays of another length than the first row group's (value counts), naming the file."""
    by_name = {c.name: c for c in columns}
    nulls: dict[str, int] = {}
    for path, meta in _footers(fs, groups):
        _check_types(meta.schema.to_arrow_schema(), types, path, reference)
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for i, leaf in enumerate(leaves):
                col = by_name.get(_top_level(leaf, by_name))
                if col is None:
                    continue
                chunk = group.column(i)
                stats = chunk.statistics
                null_count = stats.null_count if stats is not None and stats.has_null_count \
                    else 0
                if col.encoding in ("scalar", "binary", "string"):
                    nulls[col.name] = nulls.get(col.name, 0) + null_count
                    continue
                if col.encoding == "varlist":  # any length; nulls are the reader's error
                    continue
                if null_count:
                    raise DataError(f"column {col.name!r} of {path} (row group {rg}) holds "
                                    f"{null_count} null or missing array elements (null arrays, "
                                    "null elements or empty arrays); fill or drop them first")
                if chunk.num_values != group.num_rows * col.width:
                    raise DataError(
                        f"column {col.name!r} of {path} (row group {rg}) holds arrays of "
                        f"varying length: {chunk.num_values} values in {group.num_rows} rows, "
                        f"where every row of the first row group has {col.width}; pad or "
                        "truncate them to one length first")
    seen = {c: n for c, n in nulls.items() if n}
    if seen:
        what = ", ".join(f"{c!r} ({n} rows)" for c, n in seen.items())
        raise DataError(f"null values in {what}; drop or fill them first")


def _top_level(leaf: str, names: Any) -> str:
    """The column of ``names`` a Parquet leaf path belongs to: itself for a scalar, the
    longest name it starts with for a list (``x.list.element``); a dotted column name
    (``a.b``) is one column, not a field of ``a``."""
    owners = [n for n in names if leaf == n or leaf.startswith(n + ".")]
    return max(owners, key=len) if owners else ""


def _check_types(schema: Any, types: dict[str, tuple[str, str]], path: str, first: str
                 ) -> None:
    """Each of ``types``' columns in ``path``'s schema, of the same kind: a file whose label is
    double where the others' is long would be decoded as the others' (3.5 as class 3), and
    one without a column has nothing to read. Widths may differ (int32 and int64, float and
    double): every kind is decoded to one dtype (int64 labels, float32 features) whatever
    the file holds."""
    for name, (kind, expected) in types.items():
        index = schema.get_field_index(name)
        if index < 0:
            raise DataError(f"column {name!r} is missing from {path} (its columns: "
                            f"{', '.join(schema.names)}), while {first} has it; every file of "
                            "a table needs the same columns: rewrite that file, or leave it out "
                            "of the table")
        found = schema.field(index).type
        if arrow_kind(found) != kind:
            raise DataError(f"column {name!r} is {found} in {path} but {expected} in {first}; "
                            "every file of a table needs one kind of value per column "
                            "(integers, floating point, ...): rewrite the odd files with the "
                            f"column cast to one type, e.g. df.withColumn({name!r}, "
                            f"df[{name!r}].cast(...)).write.parquet(...)")


def label_ranges(fs: Any, groups: list[RowGroup], columns: tuple[ColumnSpec, ...]
                 ) -> tuple[tuple[str, int, int], ...]:
    """(label, min, max) of integral label columns from the footers' statistics; a label
    without statistics in some row group is left out (the sample check does without)."""
    labels = [c.name for c in columns if c.role == "label" and c.encoding == "scalar"
              and c.dtype == "int64"]
    lows: dict[str, list[int]] = {n: [] for n in labels}
    highs: dict[str, list[int]] = {n: [] for n in labels}
    missing: set[str] = set()
    for _, meta in _footers(fs, groups):
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for rg in range(meta.num_row_groups):
            if not meta.row_group(rg).num_rows:
                continue
            for i, leaf in enumerate(leaves):
                if leaf not in lows:
                    continue
                stats = meta.row_group(rg).column(i).statistics
                if stats is None or not stats.has_min_max:
                    missing.add(leaf)
                else:
                    lows[leaf].append(int(stats.min))
                    highs[leaf].append(int(stats.max))
    return tuple((n, min(lows[n]), max(highs[n])) for n in labels
                 if n not in missing and lows[n])


def prepare_parquet(url: str, spec: DataSpec, *, num_workers: int, batch_size: int,
                    validation_url: str | None = None) -> PreparedData:
    """An existing Parquet dataset (or Delta table: its current version), read in place. Its
    fingerprint is the identity of its data files, so resuming a run by its id can tell that
    they were changed since."""
    train = _open(url, spec)
    check_enough_rows(train.rows, num_workers, batch_size)
    val = _open(validation_url, spec) if validation_url else None
    identity = {"train": file_identity(train.url, train.listing),
                "val": file_identity(val.url, val.listing) if val else None}
    return PreparedData(_checked(train, identity["train"]),
                        val and _checked(val, identity["val"]),
                        fp.fingerprint(identity), source=url)


def _checked(dataset: Dataset, identity: list[tuple[str, int, int]]) -> Dataset:
    """A listed dataset with the identity of its files, which the readers check before each
    epoch (a listed file that is gone is named, not just missing)."""
    return dataclasses.replace(dataset, files=tuple(identity)) if dataset.listing else dataset


def _open(url: str, spec: DataSpec) -> Dataset:
    """:func:`open_parquet` of a folder of Parquet files or of a Delta table's current
    version (whose folder holds the files of every version)."""
    return open_parquet(url, spec, delta_listing(url))


def file_identity(url: str, listing: Listing | None = None) -> list[tuple[str, int, int]]:
    """(path, size, modification time in ns) of every data file of the dataset at ``url``
    (or of ``listing``): what changes when a file is rewritten, without reading any data."""
    store = Store.from_uri(url)
    files = data_files(store.filesystem(), store.fs_path(store.url()), listing)
    return [(f.path, f.size, f.mtime_ns) for f in files]


def prepare_table(url: str, spec: DataSpec, *, num_workers: int, batch_size: int,
                  validation: float | str | None, seed: int, listing: Listing | None = None
                  ) -> PreparedData:
    """The Parquet table at ``url`` read in place, split by ``validation`` (a fraction or a
    boolean/0-1 column of the table) inside its row groups, whatever its layout: the ranks
    share its rows by row ranges (:func:`sparkddl.data.plan.shard_pieces`)."""
    columns = list(spec.columns) + ([validation] if isinstance(validation, str) and
                                    validation not in spec.columns else [])
    whole = open_parquet(url, DataSpec.of(spec.feature_cols, spec.label_cols,
                                          [c for c in columns if c not in spec.feature_cols
                                           and c not in spec.label_cols],
                                          dict(spec.feature_shapes), raw=spec.raw), listing)
    listing = whole.listing
    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(store.url())
    groups = list_row_groups(fs, root, listing)
    files = tuple(file_identity(url, listing))
    keep = tuple(c for c in whole.columns if c.name in spec.columns)
    if not validation:
        train = dataclasses.replace(whole, columns=keep, files=files)
        val = None
    else:
        fraction = validation if isinstance(validation, float) else 0.0
        column = validation if isinstance(validation, str) else None
        by_groups = _by_groups(fs, root, groups, fraction, seed) if column is None else None
        val_rows = by_groups[0] if by_groups else \
            _validation_counts(fs, root, groups, fraction, seed, column)
        chosen = by_groups[1] if by_groups else frozenset()
        train_rows = tuple(g.rows - v for g, v in zip(groups, val_rows))
        if not sum(val_rows):
            raise DataError(f"the validation split selected no rows out of {whole.rows}; raise "
                            "validation or mark some rows in the validation column")
        train = Dataset(whole.url, keep, train_rows,
                        Selection("train", fraction, seed, column, bool(by_groups), chosen),
                        files, listing)
        val = Dataset(whole.url, keep, tuple(val_rows),
                      Selection("val", fraction, seed, column, bool(by_groups), chosen), files,
                      listing)
    if not train.rows:
        raise DataError(f"the validation split left no training rows out of {whole.rows}")
    check_enough_rows(train.rows, num_workers, batch_size)
    identity = {"table": files, "columns": [c.to_json() for c in keep],
                "validation": validation, "seed": seed,
                "partitions": [listing.columns, listing.values] if listing else None}
    return PreparedData(train, val, fp.fingerprint(identity), source=url, in_place=True,
                        label_ranges=label_ranges(fs, groups, keep))


def _by_groups(fs: Any, root: str, groups: list[RowGroup], fraction: float, seed: int
               ) -> tuple[list[int], frozenset[tuple[str, int]]] | None:
    """Validation rows of every row group for a split by whole row groups, or None where
    the table has too few row groups for one (or the draws leave a side empty): then the
    split is per row, which reads every row group for either side."""
    if len(groups) < GROUP_SPLIT_MIN:
        log.info("data: validation=%g split per row inside each row group: the table has %d "
                 "row group(s), fewer than %d (every row group is read for either side)",
                 fraction, len(groups), GROUP_SPLIT_MIN)
        return None
    chosen = choose_groups(fraction, seed, root, groups)
    rows = [g.rows if (relative(root, g.path), g.index) in chosen else 0 for g in groups]
    if not any(rows) or all(rows):
        log.info("data: validation=%g split per row: the draws by row group left a side "
                 "empty", fraction)
        return None
    log.info("data: validation=%g split by whole row groups: %d of %d row groups (%d of %d "
             "rows) held out; readers skip the other side's row groups", fraction,
             sum(1 for r in rows if r), len(groups), sum(rows), sum(g.rows for g in groups))
    return rows, chosen


def _validation_counts(fs: Any, root: str, groups: list[RowGroup], fraction: float, seed: int,
                       column: str | None) -> list[int]:
    """Validation rows of every row group: from the seeded draws alone for a fraction, by
    reading the one column for a split column."""
    if column is None:
        return [int(fraction_rows(fraction, seed, root, g.path, g.index, g.rows).sum())
                for g in groups]
    counts = []
    for g in groups:
        with parquet_file(fs, g.path) as f:
            values = f.read_row_group(g.index, columns=[column]).column(column)
        counts.append(int(column_rows(column, values, f"{g.path} row group {g.index}").sum()))
    return counts
