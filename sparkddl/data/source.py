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
from sparkddl.data.footers import arrow_kind, check_footers, label_ranges
from sparkddl.data.plan import check_enough_rows
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec
from sparkddl.data.split import (
    GROUP_SPLIT_MIN,
    Selection,
    choose_groups,
    column_rows,
    fraction_rows,
    relative,
)
from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.tables.delta import delta_table
from sparkddl.tables.hive import hive_table, partition_names
from sparkddl.tables.parquet import RowGroup, data_files, list_row_groups, parquet_file
from sparkddl.tables.table import Table

HEAD_ROWS = 1024  # rows read to learn the width of array columns

log = logging.getLogger(__name__)


def open_parquet(url: str, spec: DataSpec, table: Table | None = None) -> Dataset:
    """Describe the Parquet dataset at ``url`` (``table``'s files; every data file under
    ``url`` where it is not given) from its footers: columns, widths, row groups. Null counts
    come from column statistics; unequal array lengths are caught by the reader. Row groups
    without rows (pyarrow writes an empty table as one) stay in ``row_groups``: both readers
    count them when they shard, so the plan must too. Columns of ``spec`` that are not in
    the files but in ``name=value`` folders of a table given by its folder are its partition
    columns (its files are then named one by one)."""
    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(store.url())
    table = table or Table.of_folder(root)
    try:
        groups = list_row_groups(fs, table)
    except FileNotFoundError as exc:
        raise DataError(f"the table at {url} names files that are not there ({exc}): they were "
                        "deleted (a vacuum, an overwrite) after the table was listed; read the "
                        "table again (a new DataFrame or read_delta) and fit on that"
                        if table.paths else f"no Parquet dataset at {url}") from None
    _check_records(table, groups, url)
    counts = [table.kept_rows(fs, g) for g in groups]
    if not sum(g.rows for g in groups):
        raise DataError(f"no Parquet rows under {url}; point at a directory of Parquet files")
    if not sum(counts):
        raise DataError(f"every one of the {sum(g.rows for g in groups)} rows of the table at "
                        f"{url} is deleted (its deletion vectors or delete files delete them "
                        "all): there is nothing to train on; train on a version that has rows")
    # an empty one has no arrays to measure, nor one whose rows are all deleted
    first = next(g for g, n in zip(groups, counts) if n)
    # pages, not whole column chunks
    with parquet_file(fs, first.path, buffer_size=1 << 20) as parquet:
        schema = parquet.schema_arrow
        fields = {n: (arrow_kind(schema.field(n).type), str(schema.field(n).type))
                  for n in schema.names}
        # column mapping: the table's names
        fields = {table.logical_name(n): v for n, v in fields.items()}
        table = _folder_partitions(table, groups, [c for c in spec.columns if c not in fields])
        for name, arrow_type in table.arrow_types().items():
            fields.setdefault(name, (arrow_kind(arrow_type), str(arrow_type)))
        check_columns(spec, fields)
        in_files = table.file_columns(spec.columns)
        # the first rows give the array widths; the footers then check every row group
        head = next(parquet.iter_batches(batch_size=HEAD_ROWS, row_groups=[first.index],
                                         columns=table.physical(in_files), use_threads=False))
        if table.renames or table.masks:
            import pyarrow as pa
            rows = table.logical(pa.Table.from_batches([head]))
            alive = table.keep(fs, first)  # widths of rows that are not deleted
            if alive is not None and alive[:rows.num_rows].any():
                rows = rows.filter(alive[:rows.num_rows])
            head = rows.combine_chunks().to_batches()[0]
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
    # row groups with deleted rows: their statistics count those too (the reader checks)
    partial = frozenset((g.path, g.index) for g, n in zip(groups, counts) if n != g.rows)
    # the footers name the files' columns (column mapping: not the table's)
    names = dict(zip(in_files, table.physical(in_files)))
    check_footers(fs, groups, tuple(dataclasses.replace(c, name=names[c.name])
                                     for c in columns if c.name in names),
                  {names[n]: fields[n] for n in in_files}, first.path,
                  lambda schema, path: table.check_field_ids(schema, in_files, path), partial)
    return Dataset(store.url(), tuple(columns), tuple(counts), table=table)


def _check_records(table: Table, groups: list[RowGroup], url: str) -> None:
    """DataError where a file's footer counts other rows than the table's log (Delta's
    numRecords) or manifest (Iceberg's record_count): its deletes would name other rows."""
    footers = {g.path: g.file_rows for g in groups}
    for path, logged in zip(table.paths, table.records):
        if logged >= 0 and footers.get(path, logged) != logged:
            raise DataError(f"the data file {path} of the table at {url} holds "
                            f"{footers[path]} rows where the table's log says {logged}: it was "
                            "rewritten under the name the log gives it; the table is damaged "
                            "(read it through Spark with its table format's jar to check it)")


def _folder_partitions(table: Table, groups: list[RowGroup], missing: list[str]) -> Table:
    """A table given by its folder whose ``name=value`` folders hold the ``missing`` columns:
    its files named one by one with those partition columns (types inferred as Spark does);
    else ``table`` as it is (check_columns then says they are missing)."""
    if not missing or not table.folder:
        return table
    paths = list(dict.fromkeys(g.path for g in groups))
    if not set(missing) <= set(partition_names(table.folder, paths)):
        return table
    return hive_table(table.folder, paths, missing)


def prepare_parquet(url: str, spec: DataSpec, *, num_workers: int, batch_size: int,
                    validation_url: str | None = None) -> PreparedData:
    """An existing Parquet dataset (or Delta table: its current version), read in place. Its
    fingerprint is the identity of its data files, so resuming a run by its id can tell that
    they were changed since."""
    train = _open(url, spec)
    check_enough_rows(train.rows, num_workers, batch_size)
    val = _open(validation_url, spec) if validation_url else None
    identity = {"train": file_identity(train.url, train.table),
                "val": file_identity(val.url, val.table) if val else None,
                "deletes": [train.table.mask_identity(),
                            val.table.mask_identity() if val else None]}
    return PreparedData(_checked(train, identity["train"]),
                        val and _checked(val, identity["val"]),
                        fp.fingerprint(identity), source=url)


def _checked(dataset: Dataset, identity: list[tuple[str, int, int]]) -> Dataset:
    """A dataset whose files are named one by one, with the identity of its files, which the
    readers check before each epoch (a named file that is gone is named, not just missing)."""
    return dataclasses.replace(dataset, files=tuple(identity)) if dataset.table.listed \
        else dataset


def _open(url: str, spec: DataSpec) -> Dataset:
    """:func:`open_parquet` of a folder of Parquet files or of a Delta table's current
    version (whose folder holds the files of every version)."""
    return open_parquet(url, spec, delta_table(url))


def file_identity(url: str, table: Table | None = None) -> list[tuple[str, int, int]]:
    """(path, size, modification time in ns) of every data file of the dataset at ``url``
    (or of ``table``): what changes when a file is rewritten, without reading any data."""
    store = Store.from_uri(url)
    files = data_files(store.filesystem(), table or store.fs_path(store.url()))
    return [(f.path, f.size, f.mtime_ns) for f in files]


def prepare_table(url: str, spec: DataSpec, *, num_workers: int, batch_size: int,
                  validation: float | str | None, seed: int, table: Table | None = None
                  ) -> PreparedData:
    """The Parquet table at ``url`` read in place, split by ``validation`` (a fraction or a
    boolean/0-1 column of the table) inside its row groups, whatever its layout: the ranks
    share its rows by row ranges (:func:`sparkddl.data.plan.shard_pieces`)."""
    columns = list(spec.columns) + ([validation] if isinstance(validation, str) and
                                    validation not in spec.columns else [])
    whole = open_parquet(url, DataSpec.of(spec.feature_cols, spec.label_cols,
                                          [c for c in columns if c not in spec.feature_cols
                                           and c not in spec.label_cols],
                                          dict(spec.feature_shapes), raw=spec.raw), table)
    table = whole.table
    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(store.url())
    groups = list_row_groups(fs, table)
    files = tuple(file_identity(url, table))
    keep = tuple(c for c in whole.columns if c.name in spec.columns)
    if not validation:
        train = dataclasses.replace(whole, columns=keep, files=files)
        val = None
    else:
        fraction = validation if isinstance(validation, float) else 0.0
        column = validation if isinstance(validation, str) else None
        # row groups counted by their rows that are not deleted (deletion vectors)
        kept = [dataclasses.replace(g, rows=n) for g, n in zip(groups, whole.row_groups)]
        by_groups = _by_groups(fs, root, kept, fraction, seed) if column is None else None
        empty = frozenset((relative(root, g.path), g.index) for g, n in
                          zip(groups, whole.row_groups) if g.rows and not n)
        val_rows = by_groups[0] if by_groups else \
            _validation_counts(fs, root, groups, fraction, seed, column, table)
        chosen = by_groups[1] if by_groups else frozenset()
        train_rows = tuple(n - v for n, v in zip(whole.row_groups, val_rows))
        if not sum(val_rows):
            raise DataError(f"the validation split selected no rows out of {whole.rows}; raise "
                            "validation or mark some rows in the validation column")
        train = Dataset(whole.url, keep, train_rows,
                        Selection("train", fraction, seed, column, bool(by_groups), chosen,
                                  empty),
                        files, table)
        val = Dataset(whole.url, keep, tuple(val_rows),
                      Selection("val", fraction, seed, column, bool(by_groups), chosen, empty),
                      files, table)
    if not train.rows:
        raise DataError(f"the validation split left no training rows out of {whole.rows}")
    check_enough_rows(train.rows, num_workers, batch_size)
    identity = {"table": files, "columns": [c.to_json() for c in keep],
                "validation": validation, "seed": seed,
                "partitions": [table.columns, table.values] if table.listed else None,
                "deletes": table.mask_identity()}
    return PreparedData(train, val, fp.fingerprint(identity), source=url, in_place=True,
                        label_ranges=label_ranges(fs, groups, keep, table))


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
                       column: str | None, table: Table) -> list[int]:
    """Validation rows of every row group (rows deleted by a deletion vector are on no
    side): from the seeded draws alone for a fraction, by reading the one column for a
    split column."""
    counts = []
    for g in groups:
        if column is None:
            val = fraction_rows(fraction, seed, root, g.path, g.index, g.rows)
        else:
            in_file = table.physical([column])[0]
            with parquet_file(fs, g.path) as f:
                values = f.read_row_group(g.index, columns=[in_file]).column(in_file)
            val = column_rows(column, values, f"{g.path} row group {g.index}")
        kept = table.keep(fs, g)
        counts.append(int((val if kept is None else val & kept).sum()))
    return counts
