"""What the Parquet footers of a table read in place tell before any rank reads: every file
holds the columns planned, of one kind each, without nulls or arrays of another length, and
the range of integral labels (from statistics, or from the rows that are not deleted)."""
from __future__ import annotations

from typing import Any

from sparkddl.data.schema import ColumnSpec
from sparkddl.errors import DataError
from sparkddl.tables.parquet import RowGroup, parquet_file
from sparkddl.tables.table import Table


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


def _footers(fs: Any, groups: list[RowGroup]) -> Any:
    """(path, metadata) of every file of ``groups``, each footer read once."""
    for path in dict.fromkeys(g.path for g in groups):
        with parquet_file(fs, path) as f:
            meta = f.metadata
        yield path, meta


def check_footers(fs: Any, groups: list[RowGroup], columns: tuple[ColumnSpec, ...],
                   types: dict[str, tuple[str, str]], reference: str,
                   check_schema: Any = None,
                   partial: frozenset[tuple[str, int]] = frozenset()) -> None:
    """What the footers already tell, before any rank reads: every file holds the columns
    of the kinds in ``types`` (kind, Arrow type name) of ``reference``, the file they were read
    from, no nulls (column statistics), and no
    arrays of another length than the first row group's (value counts), naming the file."""
    by_name = {c.name: c for c in columns}
    nulls: dict[str, int] = {}
    for path, meta in _footers(fs, groups):
        schema = meta.schema.to_arrow_schema()
        _check_types(schema, types, path, reference)
        if check_schema is not None:  # e.g. the field ids of a column-mapped table
            check_schema(schema, path)
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for rg in range(meta.num_row_groups):
            if (path, rg) in partial:  # statistics of deleted rows too: the reader checks
                continue
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


def label_ranges(fs: Any, groups: list[RowGroup], columns: tuple[ColumnSpec, ...],
                 layout: Table) -> tuple[tuple[str, int, int], ...]:
    """(label, min, max) of integral label columns from the footers' statistics; a label
    without statistics in some row group is left out (the sample check does without). A row
    group with rows deleted by a deletion vector has statistics of the deleted rows too: its
    labels are read, and the rows that are not deleted measured."""
    labels = [c.name for c in columns if c.role == "label" and c.encoding == "scalar"
              and c.dtype == "int64"]
    labels = layout.physical(labels)  # the footers name the files' columns
    lows: dict[str, list[int]] = {n: [] for n in labels}
    highs: dict[str, list[int]] = {n: [] for n in labels}
    missing: set[str] = set()
    by_place = {(g.path, g.index): g for g in groups}
    for path, meta in _footers(fs, groups):
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for rg in range(meta.num_row_groups):
            if not meta.row_group(rg).num_rows:
                continue
            kept = layout.keep(fs, by_place[(path, rg)])
            if kept is not None:  # statistics of deleted rows too: measure the others
                if kept.any():
                    with parquet_file(fs, path) as f:
                        table = f.read_row_group(rg, columns=[n for n in labels if n in leaves])
                    for n in table.column_names:
                        values = table.column(n).to_numpy()[kept]
                        lows[n].append(int(values.min()))
                        highs[n].append(int(values.max()))
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
    return tuple((layout.logical_name(n), min(lows[n]), max(highs[n])) for n in labels
                 if n not in missing and lows[n])
