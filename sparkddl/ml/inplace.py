"""``TorchModel.transform`` on a table in Parquet: the features read where they lie.

Where the DataFrame's feature columns are columns of its Parquet files as they are (its
optimized plan is a scan of Parquet, with filters and projections that keep or rename those
columns on top), the scoring UDFs take each row's file and its index in that file
(``_metadata.file_path``, ``_metadata.row_index``) instead of the features: Spark then reads
no feature column for them (only what else the query selects), and each Python worker reads
the feature columns of the row groups its rows come from with pyarrow, decoded once per row
group, and gathers its rows by index. Filters, projections and every other column stay
Spark's. Anything else (a computed, cast or joined feature, a partition column, another file
format, a cached DataFrame, Spark Connect, which shows no plan) is scored from the columns
Spark hands over, as before. The decision comes with its reason, which ``transform`` logs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

PATH, ROW = "_metadata.file_path", "_metadata.row_index"
# Spark names a file in ``_metadata.file_path`` with one slash after ``file:``, and in
# ``inputFiles()`` with three: each file is known by both
_LOCAL = ("file:///", "file:/")
# Spark types whose Parquet values the worker converts itself as Spark's cast to float would
NUMERIC = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")


@dataclass(frozen=True)
class InPlace:
    """What the scoring workers need to read the features where they lie: each feature
    column's column in the files, and the table's files by the number Spark's ``xxhash64``
    gives their ``_metadata.file_path`` (the rows carry that number; a file not known by it
    comes with its path)."""

    columns: dict[str, str]
    known: dict[int, str]
    # whether the plan filters rows: then a file may be left out, and so not checked
    filtered: bool = False

    def args(self) -> list[Any]:
        """The scoring UDFs' arguments: each row's file number, its path where the number
        is not known here (null elsewhere: no string per row travels), its index."""
        from pyspark.sql import functions as F
        number = F.xxhash64(F.col(PATH))
        path = F.when(number.isin(list(self.known)), F.lit(None).cast("string")) \
            .otherwise(F.col(PATH)) if self.known else F.col(PATH)
        return [number, path, F.col(ROW)]

    def check_widths(self, shapes: dict[str, list[int]]) -> None:
        """On the driver, from the footer of the table's first file: a feature column whose
        every row holds another count of values than the model takes is a DataError naming
        it (not a failed task at the action). Rows of mixed counts or nulls are left to
        the scoring workers, which name them; a footer that cannot be read is too."""
        import numpy as np

        from sparkddl.errors import DataError
        if self.filtered or not self.known or not any(shapes.get(f) for f in self.columns):
            return
        first = next(iter(self.known.values()))
        try:
            meta = _footer(first)
        except Exception:  # noqa: BLE001 - the workers read the file, and say why not
            return
        for feature, column in self.columns.items():
            want = int(np.prod(shapes.get(feature) or [0]))
            counted = _counts(meta, column)
            if want and counted is not None and counted[0] != want * counted[1]:
                values, rows = counted
                raise DataError(
                    f"feature column {feature!r} holds {values:,} values in {rows:,} rows of "
                    f"{_decoded(first)} ({values / rows:g} a row); the model takes {want} a row "
                    f"(shape {list(shapes[feature])}), as it was trained on. Score a table of "
                    "the width the model was trained on, or select the columns it was "
                    "trained with")


@dataclass(frozen=True)
class Sources:
    """Where transform's features come from (``files`` None: from the columns Spark hands
    over), and why."""

    files: InPlace | None
    why: str


def _decoded(path: str) -> str:
    from sparkddl.store import decode_hadoop_uri
    return decode_hadoop_uri(path)


def _footer(path: str) -> Any:
    import pyarrow.parquet as pq

    from sparkddl.store import Store
    store = Store.from_uri(_decoded(path))
    with store.filesystem().open_input_file(store.fs_path(store.url())) as handle:
        return pq.ParquetFile(handle).metadata


def _counts(meta: Any, column: str) -> tuple[int, int] | None:
    """(values, rows) of ``column`` in a file whose footer is ``meta``, where the footer
    tells them: one leaf column (a number, or a list of numbers) whose statistics count no
    null (Parquet counts a null or empty list as one null value); else None."""
    values = rows = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        leaves = [group.column(c) for c in range(group.num_columns)
                  if group.column(c).path_in_schema.split(".")[0].lower() == column.lower()]
        if len(leaves) != 1:
            return None
        stats = leaves[0].statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            return None
        values, rows = values + leaves[0].num_values, rows + group.num_rows
    return (values, rows) if rows else None


# files known by number at most: each is a literal of the query's plan (an InSet), which
# Spark's UI and explain() show; a table of more files sends each row's path instead
KNOWN_FILES = 1024


def known_files(paths: list[str]) -> dict[int, str]:
    """The table's files (``inputFiles()``) by their number, each as Spark may name it;
    none past :data:`KNOWN_FILES` files."""
    if len(paths) > KNOWN_FILES:
        return {}
    known = {}
    for path in paths:
        forms = [path]
        if path.startswith(_LOCAL[0]):
            forms.append(_LOCAL[1] + path[len(_LOCAL[0]):])
        for form in forms:
            known[spark_xxhash64(form)] = form
    return known


def sources(df: Any, features: list[str]) -> Sources:
    """Whether ``df``'s ``features`` are read from its Parquet files by the scoring workers."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return Sources(None, "the DataFrame's plan cannot be inspected from this session "
                             "(Spark Connect)")
    if any(f.name.lower() == "_metadata" for f in df.schema.fields):
        return Sources(None, "it has a column named _metadata, which hides Spark's file "
                             "metadata")
    try:
        if str(df.sparkSession.conf.get("spark.sql.parquet.fieldId.read.enabled",
                                        "false")).lower() == "true":
            return Sources(None, "Spark matches Parquet columns by field id here")
        node = jdf.queryExecution().optimizedPlan()
        found = _trace(node, _output_ids(node, features))
        if found.files is None:
            return found
        return replace(found, files=replace(found.files,
                                            known=known_files(list(df.inputFiles()))))
    except Exception as exc:  # noqa: BLE001 - a plan not understood is scored as before
        return Sources(None, f"its plan could not be read ({type(exc).__name__})")


def _output_ids(node: Any, features: list[str]) -> dict[int, str]:
    """exprId -> feature name, for the plan's output columns that hold the features."""
    wanted = {name.lower(): name for name in features}
    out = node.output()
    ids = {}
    for i in range(out.size()):
        attr = out.apply(i)
        name = str(attr.name())
        if name.lower() in wanted:
            ids[int(attr.exprId().id())] = wanted.pop(name.lower())
    if wanted:
        raise LookupError(f"no output column {sorted(wanted)}")
    return ids


def _trace(node: Any, ids: dict[int, str]) -> Sources:
    """Follow the features' columns down through projections and filters to the scan."""
    filtered = False
    while True:
        kind = _name(node)
        if kind == "Filter":
            node, filtered = node.child(), True
        elif kind == "Project":
            items = node.projectList()
            by_id = {int(items.apply(i).exprId().id()): items.apply(i)
                     for i in range(items.size())}
            traced = {}
            for expr_id, feature in ids.items():
                item = by_id[expr_id]
                if _name(item) == "Alias":  # a rename keeps the values; anything else not
                    item = item.child()
                if _name(item) != "AttributeReference":
                    return Sources(None, f"feature column {feature!r} is computed on top of "
                                         "the scan")
                traced[int(item.exprId().id())] = feature
            ids, node = traced, node.child()
        elif kind == "LogicalRelation":
            columns, why = _scan(node, ids)
            return Sources(InPlace(columns, {}, filtered) if columns else None, why)
        else:
            return Sources(None, f"its plan is not a scan of Parquet files (it has {kind})")


def _scan(node: Any, ids: dict[int, str]) -> tuple[dict[str, str] | None, str]:
    """Each feature's column in the files the scan ``node`` reads, or None; and why."""
    relation = node.relation()
    if _name(relation) != "HadoopFsRelation" or \
            _name(relation.fileFormat()) != "ParquetFileFormat":
        return None, f"it reads {_name(relation)}, not plain Parquet files"
    partitions = {str(n).lower() for n in relation.partitionSchema().fieldNames()}
    out = node.output()
    files = {}
    for i in range(out.size()):
        attr = out.apply(i)
        feature = ids.get(int(attr.exprId().id()))
        if feature is None:
            continue
        column = str(attr.name())
        if column.lower() in partitions:
            return None, f"feature column {feature!r} is a partition column"
        kind = attr.dataType()
        inner = kind.elementType() if _name(kind) == "ArrayType" else kind
        if _name(inner) not in NUMERIC:
            return None, f"feature column {feature!r} is {kind.simpleString()}"
        files[feature] = column
    if len(files) != len(ids):
        return None, "not every feature column is a column of the scan"
    return files, "the features are columns of its Parquet files: the scoring workers read " \
                  "them there"


def _name(obj: Any) -> str:
    """A JVM object's class name; Scala's singletons (``FloatType$``) without their ``$``."""
    return str(obj.getClass().getSimpleName()).rstrip("$")


# ---- on the executors ----
class _Task:
    """The files and the last row group this task read (per Python worker, reset when the
    worker runs another task: a file may be rewritten between jobs)."""

    lock = threading.Lock()
    attempt: Any = None
    files: dict[str, Any] = {}  # path -> (handle, ParquetFile, first row of each group, names)
    group: Any = None  # (path, group index) of ``columns``
    columns: dict[str, Any] = {}  # file column -> its values in that row group


def gather(numbers: Any, paths: Any, rows: Any, where: InPlace) -> dict[str, Any]:
    """The feature columns (pyarrow arrays, one per feature) of the rows at ``rows`` (their
    index in their file), read from the files' row groups; each row's file is
    ``where.known[number]``, else its ``path`` (the arguments of :meth:`InPlace.args`, per
    row: pandas Series or Arrow arrays)."""
    import numpy as np
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = ctx.taskAttemptId() if ctx is not None else None
    row_values = np.asarray(rows, dtype=np.int64)
    files = where.columns
    pieces: dict[str, list[Any]] = {feature: [] for feature in files}
    with _Task.lock:
        if _Task.attempt != attempt:
            _reset(attempt)
        for start, end, path in _runs(numbers, paths, where.known):
            _, parquet, firsts, names = _open(path)
            at = row_values[start:end]
            groups = np.searchsorted(firsts, at, side="right") - 1
            bounds = [0, *np.flatnonzero(groups[1:] != groups[:-1]) + 1, len(at)]
            for a, b in zip(bounds, bounds[1:]):
                group = int(groups[a])
                columns = _group(path, parquet, group, files, names)
                local = at[a:b] - firsts[group]
                contiguous = bool((np.diff(local) == 1).all())
                for feature, column in files.items():
                    values = columns[column]
                    pieces[feature].append(values.slice(int(local[0]), len(local)) if contiguous
                                           else values.take(pa.array(local)))
    return {feature: (parts[0] if len(parts) == 1 else pa.concat_arrays(parts))
            if parts else pa.array([], pa.float32()) for feature, parts in pieces.items()}


def _runs(numbers: Any, paths: Any, known: dict[int, str]) -> list[tuple[int, int, str]]:
    """(start, end, path) of each run of rows from one file, in order."""
    import numpy as np
    codes = np.asarray(numbers, dtype=np.int64)
    if len(codes) == 0:
        return []
    cuts = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), len(codes)]
    runs = []
    for a, b in zip(cuts, cuts[1:]):
        path = known.get(int(codes[a]))
        if path is None:  # Spark named it another way: it came with the row
            path = paths[a].as_py() if hasattr(paths[a], "as_py") else paths[a]
        runs.append((a, b, path))
    return runs


def _reset(attempt: Any) -> None:
    for handle, *_ in _Task.files.values():
        handle.close()
    _Task.attempt, _Task.files, _Task.group, _Task.columns = attempt, {}, None, {}


def _open(path: str) -> Any:
    import numpy as np
    import pyarrow.parquet as pq

    from sparkddl.store import Store, decode_hadoop_uri
    from sparkddl.tables.parquet import read_errors, unreadable
    if path not in _Task.files:
        url = decode_hadoop_uri(path)
        try:
            store = Store.from_uri(url)
            handle = store.filesystem().open_input_file(store.fs_path(store.url()))
            parquet = pq.ParquetFile(handle)
        except read_errors() as exc:
            raise unreadable(url, exc, "TorchModel.transform") from exc
        meta = parquet.metadata
        firsts = np.cumsum([0] + [meta.row_group(i).num_rows
                                  for i in range(meta.num_row_groups)])
        _Task.files[path] = (handle, parquet, firsts, parquet.schema_arrow.names)
    return _Task.files[path]


def _group(path: str, parquet: Any, group: int, files: dict[str, str],
           names: list[str]) -> dict[str, Any]:
    """The feature columns of one row group, decoded once for the rows of a task."""
    if _Task.group != (path, group):
        import pyarrow as pa
        lower = {name.lower(): name for name in names}
        present = {c: c if c in names else lower.get(c.lower()) for c in set(files.values())}
        read = sorted({c for c in present.values() if c})
        from sparkddl.tables.parquet import read_errors, unreadable
        try:
            table = parquet.read_row_group(group, columns=read)
        except read_errors() as exc:  # rewritten since Spark listed it
            raise unreadable(path, exc, f"TorchModel.transform, row group {group}") from exc
        rows = parquet.metadata.row_group(group).num_rows
        # a column a file lacks (schema evolution) is null there, as Spark reads it
        missing = pa.nulls(rows, pa.list_(pa.float32()))
        _Task.columns = {c: _one_chunk(table.column(p)) if p else missing
                         for c, p in present.items()}
        _Task.group = (path, group)
    return _Task.columns


# ---- Spark's xxhash64 of a string, to name each row's file by a number ----
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5, _M = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, (1 << 64) - 1
SEED = 42  # Spark's xxhash64()


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def spark_xxhash64(text: str, seed: int = SEED) -> int:
    """What Spark's ``xxhash64(col)`` gives for a string ``text`` (XXH64 of its UTF-8 bytes,
    as a signed 64-bit number): the driver names the table's files by it, so that the rows
    carry a number, not a path."""
    import struct
    data = text.encode("utf-8")
    n, at = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while at + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, at)
            v = [_round(a, lane) for a, lane in zip(v, lanes)]
            at += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for a in v:
            h = ((h ^ _round(0, a)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while at + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, at)[0]), 27) * _P1 + _P4) & _M
        at += 8
    if at + 4 <= n:
        h = (_rotl(h ^ (struct.unpack_from("<I", data, at)[0] * _P1 & _M), 23) * _P2 + _P3) & _M
        at += 4
    while at < n:
        h = (_rotl(h ^ (data[at] * _P5 & _M), 11) * _P1) & _M
        at += 1
    h = ((h ^ (h >> 33)) * _P2) & _M
    h = ((h ^ (h >> 29)) * _P3) & _M
    h ^= h >> 32
    return h - (1 << 64) if h >= 1 << 63 else h


def _one_chunk(column: Any) -> Any:
    """A column read from one row group as one array (a copy only where pyarrow gave
    several chunks)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
