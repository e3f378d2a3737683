"""Which columns training reads, how they are stored in Parquet and decoded into tensors.

Features are float32. Labels keep their kind: integral labels become int64 (class indices),
floating ones float32. Vectors and fixed-length arrays are stored as ``tensor`` columns: one
fixed-width binary value of raw little-endian bytes per row, which both readers turn into a
``[B, *shape]`` array without touching Python objects per row. Parquet list columns (in
datasets written elsewhere) are decoded too, more slowly.

With a ``transformFn`` (``DataSpec.raw``), feature columns may also hold what only that
function turns into tensors: ``binary`` (bytes per row, e.g. PNG/JPEG), ``string`` (text),
and ``varlist`` (numeric arrays of any length). They reach the function as numpy object
arrays of ``bytes``/``str``, and as a list of 1-D arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sparkddl.errors import DataError

SUPPORTED_TYPES = ("numeric scalars (byte, short, int, long, float, double, decimal, boolean)",
                   "fixed-length array<float|double|int|long|short|byte>",
                   "pyspark.ml.linalg Vector",
                   "with a transformFn, features of binary, string or variable-length arrays")
RAW_KINDS = ("binary", "string")  # need a transformFn, as do arrays of varying length
RAW_ENCODINGS = ("binary", "string", "varlist")
RAW_ROW_BYTES = 1024  # a guess of one raw value's size, for row-group sizing only


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    role: str
    encoding: str
    dtype: str  # numpy dtype of the decoded values
    shape: tuple[int, ...] = ()  # per-row shape; () for scalars

    @property
    def width(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def raw(self) -> bool:
        """Bytes, text or arrays of varying length: a transformFn makes tensors of them."""
        return self.encoding in RAW_ENCODINGS

    @property
    def nbytes(self) -> int:
        import numpy as np
        if self.raw:
            return RAW_ROW_BYTES
        return self.width * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "encoding": self.encoding,
                "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ColumnSpec":
        return cls(d["name"], d["role"], d["encoding"], d["dtype"], tuple(d["shape"]))


@dataclass(frozen=True)
class DataSpec:
    """The columns a training job reads, by role, with optional declared feature shapes."""

    feature_cols: tuple[str, ...]
    label_cols: tuple[str, ...] = ()
    extra_cols: tuple[str, ...] = ()
    feature_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    raw: bool = False  # a transformFn runs on the batches: raw feature columns are allowed

    @classmethod
    def of(cls, features: str | Iterable[str], labels: str | Iterable[str] | None = None,
           extra: str | Iterable[str] | None = None,
           shapes: Mapping[str, Iterable[int]] | None = None, raw: bool = False) -> "DataSpec":
        spec = cls(_names(features), _names(labels), _names(extra),
                   tuple((k, tuple(int(d) for d in v)) for k, v in (shapes or {}).items()),
                   raw)
        if not spec.feature_cols:
            raise DataError("no feature column given; name at least one (featuresCol)")
        seen: set[str] = set()
        for name in spec.columns:
            if name in seen:
                raise DataError(f"column {name!r} is named twice among features/labels/extras")
            seen.add(name)
        for name, _ in spec.feature_shapes:
            if name not in spec.feature_cols:
                raise DataError(f"a shape is declared for {name!r}, which is not a feature column "
                                f"({', '.join(spec.feature_cols)})")
        return spec

    @property
    def columns(self) -> tuple[str, ...]:
        return self.feature_cols + self.label_cols + self.extra_cols

    def role(self, name: str) -> str:
        if name in self.feature_cols:
            return "feature"
        return "label" if name in self.label_cols else "extra"

    def declared_shape(self, name: str) -> tuple[int, ...] | None:
        return dict(self.feature_shapes).get(name)


def _names(cols: str | Iterable[str] | None) -> tuple[str, ...]:
    if cols is None:
        return ()
    if isinstance(cols, str):
        return (cols,)
    return tuple(cols)


# ---- Spark types -> ColumnSpec ----

_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")
_FLOATING = ("FloatType", "DoubleType", "DecimalType")


def spark_kind(data_type: Any) -> str:
    """'integral', 'floating', 'boolean', 'vector', 'array:<elem kind>' or 'unsupported'."""
    name = type(data_type).__name__
    if name in _INTEGRAL:
        return "integral"
    if name in _FLOATING:
        return "floating"
    if name == "BooleanType":
        return "boolean"
    if name == "VectorUDT":
        return "vector"
    if name == "BinaryType":
        return "binary"
    if name == "StringType":
        return "string"
    if name == "ArrayType":
        inner = spark_kind(data_type.elementType)
        return f"array:{inner}" if inner in ("integral", "floating") else "unsupported"
    return "unsupported"


def column_spec(name: str, role: str, kind: str, width: int | None,
                declared: tuple[int, ...] | None = None, varying: bool = False) -> ColumnSpec:
    """The stored/decoded form of one column, given its Spark kind and (for vectors and
    arrays) the fixed length seen in the data; ``varying``: arrays of several lengths (with
    a transformFn)."""
    if kind in RAW_KINDS:
        return ColumnSpec(name, role, kind, "object")
    if varying:
        return ColumnSpec(name, role, "varlist",
                          "int64" if kind == "array:integral" else "float32")
    if declared and not all(isinstance(d, int) and d > 0 for d in declared):
        raise DataError(f"column {name!r}: declared shape {tuple(declared)} has a dimension that "
                        "is not a positive integer; give every dimension as a whole number ≥ 1, "
                        "e.g. (1, 8, 8)")
    if kind in ("integral", "floating", "boolean"):
        if declared and math.prod(declared) != 1:
            raise DataError(f"column {name!r} holds one value per row but shape {tuple(declared)} "
                            "was declared; a scalar column can only take a shape of one value, "
                            "e.g. (1,)")
        dtype = "float32"
        if role == "label" and kind == "integral":
            dtype = "int64"
        if role == "extra":
            dtype = "int64" if kind in ("integral", "boolean") else "float64"
        return ColumnSpec(name, role, "scalar", dtype, tuple(declared or ()))
    assert width is not None, "vector/array columns need their length"
    shape = declared or (width,)
    if math.prod(shape) != width:
        raise DataError(f"column {name!r} has {width} values per row but the declared shape "
                        f"{tuple(shape)} holds {math.prod(shape)}; fix the shape")
    dtype = "float32"
    if role != "feature" and kind == "array:integral":
        dtype = "int64"
    if role == "extra" and kind == "array:floating":
        dtype = "float64"
    return ColumnSpec(name, role, "tensor", dtype, tuple(shape))


def check_columns(spec: DataSpec, available: dict[str, tuple[str, str]]) -> None:
    """Missing or unsupported columns, listing what exists and what is supported.
    ``available`` maps each column to (kind from :func:`spark_kind`, type name)."""
    missing = [c for c in spec.columns if c not in available]
    if missing:
        listing = ", ".join(f"{n} ({t})" for n, (_, t) in available.items()) or "no columns"
        raise DataError(f"column(s) {', '.join(map(repr, missing))} not found; the data has "
                        f"{listing}")
    bad = [f"{c!r} ({available[c][1]})" for c in spec.columns if available[c][0] == "unsupported"]
    raw = [c for c in spec.columns if available[c][0] in RAW_KINDS]
    if raw and not spec.raw:
        what = ", ".join(f"{c!r} ({available[c][1]})" for c in raw)
        raise DataError(f"column(s) {what} hold bytes or text, which become tensors only through "
                        "a transformFn: give transformFn=fn(batch) -> dict of tensors (e.g. "
                        "decoding PNG bytes), or convert the column in Spark first")
    not_features = [c for c in raw if spec.role(c) != "feature"]
    if not_features:
        raise DataError(f"column(s) {', '.join(map(repr, not_features))} hold bytes or text; "
                        "only feature columns may (labels and weights are numbers)")
    if bad:
        raise DataError(f"column(s) {', '.join(bad)} have unsupported types; supported: "
                        f"{'; '.join(SUPPORTED_TYPES)}. Convert them first (e.g. VectorAssembler, "
                        "StringIndexer, or a cast)")
