"""Existing Parquet datasets used as they are: no Spark job, no copy."""
from __future__ import annotations

from typing import Any

from sparkddl.data import fingerprint as fp
from sparkddl.data.dataset import Dataset, PreparedData
from sparkddl.data.plan import check_enough_rows, data_files, list_row_groups
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec
from sparkddl.errors import DataError
from sparkddl.store import Store


def arrow_kind(t: Any) -> str:
    import pyarrow as pa
    if pa.types.is_integer(t):
        return "integral"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "floating"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = arrow_kind(t.value_type)
        return f"array:{inner}" if inner in ("integral", "floating") else "unsupported"
    return "unsupported"


def open_parquet(url: str, spec: DataSpec) -> Dataset:
    """Describe the Parquet dataset at ``url`` from its footers: columns, widths, row groups.
    Null counts come from column statistics; unequal array lengths are caught by the reader.
    Row groups without rows (pyarrow writes an empty table as one) stay in ``row_groups``:
    both readers count them when they shard, so the plan must too."""
    import pyarrow.parquet as pq

    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(store.url())
    try:
        groups = list_row_groups(fs, root)
    except FileNotFoundError:
        raise DataError(f"no Parquet dataset at {url}") from None
    if not sum(g.rows for g in groups):
        raise DataError(f"no Parquet rows under {url}; point at a directory of Parquet files")
    first = next(g for g in groups if g.rows)  # an empty one has no arrays to measure
    with fs.open_input_file(first.path) as f:
        parquet = pq.ParquetFile(f)
        schema = parquet.schema_arrow
        fields = {n: (arrow_kind(schema.field(n).type), str(schema.field(n).type))
                  for n in schema.names}
        check_columns(spec, fields)
        head = parquet.read_row_group(first.index, columns=list(spec.columns))
    _check_nulls(fs, groups, spec)
    columns = []
    for name in spec.columns:
        kind = fields[name][0]
        width = None
        if kind.startswith("array"):
            lengths = set(head.column(name).combine_chunks().value_lengths().to_pylist())
            width = lengths.pop() if len(lengths) == 1 else None
            if width is None:
                raise DataError(f"column {name!r} holds arrays of unequal length; every row "
                                "needs the same length")
        col = column_spec(name, spec.role(name), kind, width, spec.declared_shape(name))
        columns.append(ColumnSpec(col.name, col.role, "list" if width else "scalar", col.dtype,
                                  col.shape))
    return Dataset(store.url(), tuple(columns), tuple(g.rows for g in groups))


def _check_nulls(fs: Any, groups: list, spec: DataSpec) -> None:
    import pyarrow.parquet as pq

    seen: dict[str, int] = {}
    for path in dict.fromkeys(g.path for g in groups):
        with fs.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for rg in range(meta.num_row_groups):
            for i, name in enumerate(names):
                top = name.split(".")[0]
                stats = meta.row_group(rg).column(i).statistics
                if top in spec.columns and stats is not None and stats.has_null_count and \
                        stats.null_count and "." not in name:
                    seen[top] = seen.get(top, 0) + stats.null_count
    if seen:
        what = ", ".join(f"{c!r} ({n} rows)" for c, n in seen.items())
        raise DataError(f"null values in {what}; drop or fill them first")


def prepare_parquet(url: str, spec: DataSpec, *, num_workers: int, batch_size: int,
                    validation_url: str | None = None) -> PreparedData:
    """An existing Parquet dataset, read in place. Its fingerprint is the identity of its data
    files, so resuming a run by its id can tell that they were changed since."""
    train = open_parquet(url, spec)
    check_enough_rows(train.rows, num_workers, batch_size)
    val = open_parquet(validation_url, spec) if validation_url else None
    identity = {"train": file_identity(train.url), "val": file_identity(val.url) if val else None}
    return PreparedData(train, val, fp.fingerprint(identity), source=url)


def file_identity(url: str) -> list[tuple[str, int, int]]:
    """(path, size, modification time in ns) of every data file of the dataset at ``url``:
    what changes when a file is rewritten, without reading any data."""
    store = Store.from_uri(url)
    files = data_files(store.filesystem(), store.fs_path(store.url()))
    return [(f.path, f.size, f.mtime_ns) for f in files]
