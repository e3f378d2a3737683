"""transformFn's plumbing without Spark: what the function sees, what comes out, the shape
rule, the order of batches transformed ahead on threads, and raw columns in Parquet."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparkddl.data.batching import decode_arrow
from sparkddl.data.encode import arrow_type, encode_batch
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec
from sparkddl.data.transform import Shapes, ahead, apply
from sparkddl.errors import DataError, TransformError


def _batch():
    ragged = np.empty(3, dtype=object)
    for i, n in enumerate((1, 3, 2)):
        ragged[i] = np.arange(n, dtype=np.float32)
    return {"img": np.array([b"a", b"bb", b"ccc"], dtype=object),
            "seq": ragged, "label": np.array([0, 1, 2])}


def test_the_function_sees_bytes_lists_and_numbers_and_numbers_pass_through():
    seen = {}

    def fn(batch):
        seen.update(batch)
        return {"img": np.array([[len(b)] for b in batch["img"]], dtype=np.float32),
                "seq": torch.stack([torch.nn.functional.pad(torch.from_numpy(s), (0, 3 - len(s)))
                                    for s in batch["seq"]])}

    out = apply(fn, _batch(), "here")
    assert isinstance(seen["seq"], list) and [len(s) for s in seen["seq"]] == [1, 3, 2]
    assert seen["img"].tolist() == [b"a", b"bb", b"ccc"]
    assert out["img"].tolist() == [[1.0], [2.0], [3.0]] and out["seq"].shape == (3, 3)
    assert out["label"].tolist() == [0, 1, 2]  # not returned, numeric: passes through
    assert set(out) == {"img", "seq", "label"}


def test_errors_name_where_and_what():
    with pytest.raises(TransformError, match=r"failed on rank 1, batch 7: KeyError: 'nope'"):
        apply(lambda b: {"x": b["nope"]}, _batch(), "rank 1, batch 7")
    with pytest.raises(TransformError, match="must return a dict .* got list"):
        apply(lambda b: [1], _batch(), "here")
    with pytest.raises(TransformError, match="'x' with shape \\(2,\\) for a batch of 3 rows"):
        apply(lambda b: {"x": np.zeros(2)}, _batch(), "here", Shapes())
    shapes = Shapes([("x", (4,), "float32")])  # as on the driver's sample
    with pytest.raises(TransformError, match=r"'x' as float32 rows of shape \(5,\) \(batch 3\)"
                                             r", but float32 rows of shape \(4,\) before"):
        apply(lambda b: {"x": np.zeros((3, 5), np.float32)}, _batch(), "batch 3", shapes)


def test_batches_are_transformed_ahead_on_threads_in_order():
    threads = set()

    def slow(batch):
        threads.add(threading.current_thread().name)
        time.sleep(0.01 * (3 - batch["i"][0] % 3))  # later batches finish first
        return {"i": batch["i"] * 10}

    batches = ({"i": np.array([i])} for i in range(12))
    out = [b["i"].item() for b in ahead(slow, batches, 3, lambda i: f"batch {i}", Shapes())]
    assert out == [i * 10 for i in range(12)]
    assert len(threads) > 1 and all(t.startswith("sparkddl-transform") for t in threads)


def test_raw_columns_need_a_transform_and_are_stored_and_read_as_they_are():
    available = {"img": ("binary", "binary"), "text": ("string", "string"),
                 "label": ("integral", "int")}
    with pytest.raises(DataError, match=r"'img' \(binary\), 'text' \(string\) hold bytes or "
                                        r"text, which become tensors only through a transformFn"):
        check_columns(DataSpec.of(["img", "text"], "label"), available)
    with pytest.raises(DataError, match="only feature columns may"):
        check_columns(DataSpec.of("label", "img", raw=True), available)
    check_columns(DataSpec.of(["img", "text"], "label", raw=True), available)
    columns = (column_spec("img", "feature", "binary", None),
               column_spec("text", "feature", "string", None),
               column_spec("seq", "feature", "array:floating", None, varying=True))
    assert [c.encoding for c in columns] == ["binary", "string", "varlist"]
    batch = pa.RecordBatch.from_pydict({
        "img": pa.array([b"\x89PNG", b"xy"], pa.binary()), "text": ["one two", "three"],
        "seq": pa.array([[1.0], [2.0, 3.0, 4.0]], pa.list_(pa.float64())),
        "__split": pa.array([0, 0], pa.int32())})
    schema = pa.schema([(c.name, arrow_type(c)) for c in columns])
    sums, parts = encode_batch(columns, schema, batch)
    assert (sums["lo:len:seq"], sums["hi:len:seq"]) == (1, 3)
    stored = parts["train"]
    assert stored.schema.field("seq").type == pa.list_(pa.float32())
    img, text, seq = (decode_arrow(c, stored.column(c.name)) for c in columns)
    assert img.tolist() == [b"\x89PNG", b"xy"] and text.tolist() == ["one two", "three"]
    assert [s.tolist() for s in seq] == [[1.0], [2.0, 3.0, 4.0]] and seq[1].dtype == np.float32
    assert ColumnSpec("img", "feature", "binary", "object").raw


def test_review_fixes_null_elements_reader_choice_and_saved_functions():
    from sparkddl.data.choice import resolve_reader
    from sparkddl.errors import ConfigError, SparkDDLError
    from sparkddl.ml.architecture import rebuild_function
    from sparkddl.ml.inference import raw_column
    from sparkddl.transforms import decode_images
    ragged = pa.array([[1, 2, None], [4]], pa.list_(pa.int64()))
    with pytest.raises(DataError, match="1 null elements inside its arrays"):
        decode_arrow(ColumnSpec("seq", "feature", "varlist", "int64"), ragged)
    # dbfs:/ without the mount and raw columns of a table read in place: the Arrow reader
    assert resolve_reader("auto", url="dbfs:/ml/data") == "arrow"
    assert resolve_reader("auto", url="file:///x", raw_in_place=True) == "arrow"
    with pytest.raises(ConfigError, match="petastorm' cannot read binary, string or ragged"):
        resolve_reader("petastorm", url="file:///x", raw_in_place=True)
    # a saved transform is sparkddl.transforms' own function or needs trust: nothing else is
    # reached through a sparkddl module without it
    assert rebuild_function({"kind": "import", "target": "sparkddl.transforms:decode_images"},
                            lambda: b"", "here") is decode_images
    for target in ("sparkddl.store.store:os.system", "sparkddl.transforms:np.save",
                   "sparkddl.session.standalone:subprocess.check_call"):
        with pytest.raises(SparkDDLError, match="loading it runs that code"):
            rebuild_function({"kind": "import", "target": target}, lambda: b"", "here")
    # transform's input at inference is decoded as in training: featureShapes, ragged ints
    import pandas as pd
    flat = pd.Series([np.arange(64, dtype=np.float64)] * 2)
    spec = ColumnSpec("img", "feature", "tensor", "float32", (1, 8, 8)).to_json()
    assert raw_column(flat, spec).shape == (2, 1, 8, 8)
    ids = raw_column(pd.Series([np.array([1, 2]), np.array([3])]),
                     ColumnSpec("ids", "feature", "varlist", "int64").to_json())
    assert [a.dtype for a in ids] == [np.int64, np.int64] and ids[1].tolist() == [3]
