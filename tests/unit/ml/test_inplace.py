"""transform's features read where they lie, on the executor side: rows named by their file
(a number, else the path) and their index in it, gathered from the files' row groups (real
Parquet files; no Spark: the plan side is tested in tests/integration/test_scoring.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkddl.errors import DataError
from sparkddl.ml.inplace import InPlace, _reset, gather, known_files, spark_xxhash64
from sparkddl.ml.scoring import arrow_column


def table_file(path, start, rows, width=3, group=7, name="features"):
    values = np.arange(start * width, (start + rows) * width, dtype=np.float64)
    features = pa.array(list(values.reshape(rows, width)), pa.list_(pa.float64()))
    pq.write_table(pa.table({"id": np.arange(start, start + rows), name: features}), path,
                   row_group_size=group)
    return values.reshape(rows, width).astype(np.float32)


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "a b.parquet", tmp_path / "b.parquet"  # a space: Spark %-encodes it
    want = {"a": table_file(a, 0, 30), "b": table_file(b, 100, 20)}
    uris = {"a": "file:" + str(a).replace(" ", "%20"), "b": "file:" + str(b)}
    _reset(None)  # no task here: the cache of an earlier test is not this one's
    yield uris, want
    _reset(None)


def rows_of(got):
    return arrow_column(got["features"], [3], "features")


def test_rows_are_gathered_across_row_groups_and_files_by_number_or_path(files):
    uris, want = files
    known = {spark_xxhash64(uris["a"]): uris["a"]}  # b is not known by its number
    where = InPlace({"features": "features"}, known)
    # a run inside one group, one across groups 0-2, rows filtered out, then the other file
    picks = [("a", i) for i in (1, 2, 3, 5, 6, 7, 8, 13, 14, 15, 29)] + \
        [("b", i) for i in (0, 1, 19)]
    numbers = pd.Series([spark_xxhash64(uris[f]) for f, _ in picks])
    paths = pd.Series([None if f == "a" else uris[f] for f, _ in picks], dtype=object)
    got = rows_of(gather(numbers, paths, pd.Series([i for _, i in picks]), where))
    assert np.array_equal(got, np.stack([want[f][i] for f, i in picks]))
    # the same as Arrow arrays (Spark 4.1's Arrow UDFs); contiguous rows are sliced
    number = spark_xxhash64(uris["a"])
    got = rows_of(gather(pa.array([number] * 23, pa.int64()), pa.nulls(23, pa.string()),
                         pa.array(list(range(7, 30)), pa.int64()), where))
    assert np.array_equal(got, want["a"][7:30])


def test_a_file_is_known_by_the_name_spark_gives_it_and_by_inputfiles():
    known = known_files(["file:///t/a.parquet", "s3a://bucket/t/b.parquet"])
    assert set(known.values()) == {"file:///t/a.parquet", "file:/t/a.parquet",
                                   "s3a://bucket/t/b.parquet"}
    assert known[spark_xxhash64("file:/t/a.parquet")] == "file:/t/a.parquet"


def test_bad_rows_and_files_are_named(files, tmp_path):
    uris, _ = files
    where = InPlace({"features": "Features"}, {})  # Spark matched the name ignoring case
    one = (pd.Series([1]), pd.Series([uris["a"]], dtype=object), pd.Series([4]))
    assert rows_of(gather(*one, where)).shape == (1, 3)
    other = tmp_path / "narrow.parquet"
    table_file(other, 0, 5, width=2)
    narrow = (pd.Series([2]), pd.Series(["file:" + str(other)], dtype=object), pd.Series([0]))
    with pytest.raises(ValueError, match="feature column 'features' has 2 value.s. per row; "
                                         "the model takes 3"):
        rows_of(gather(*narrow, where))
    lacking = tmp_path / "lacking.parquet"
    table_file(lacking, 0, 5, name="other")  # a file written before the column was added
    with pytest.raises(ValueError, match="feature column 'features' has 1 null row"):
        rows_of(gather(pd.Series([3]), pd.Series(["file:" + str(lacking)], dtype=object),
                       pd.Series([1]), where))
    gone = (pd.Series([4]), pd.Series(["file:" + str(tmp_path / "gone.parquet")],
                                      dtype=object), pd.Series([0]))
    with pytest.raises(DataError, match="gone.parquet is gone"):
        gather(*gone, where)


def test_a_whole_column_of_another_width_is_refused_on_the_driver(files, tmp_path):
    uris, _ = files
    where = InPlace({"features": "features"}, {spark_xxhash64(uris["a"]): uris["a"]})
    where.check_widths({"features": [3]})  # as trained: nothing to say
    with pytest.raises(DataError, match=r"^feature column 'features' holds 90 values in 30 rows"
                                        r" of .*a b.parquet \(3 a row\); the model takes 4"):
        where.check_widths({"features": [2, 2]})
    # nulls: the footer cannot tell the rows' width; the workers name the null rows
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"features": pa.array([[1.0, 2.0], None, [3.0, 4.0]])}), nulls)
    InPlace({"features": "features"}, {1: "file:" + str(nulls)}).check_widths(
        {"features": [4]})


def test_a_table_of_many_files_sends_each_rows_path():
    from sparkddl.ml.inplace import KNOWN_FILES
    assert known_files([f"file:/t/{i}.parquet" for i in range(KNOWN_FILES + 1)]) == {}
    assert len(known_files([f"s3a://b/{i}.parquet" for i in range(KNOWN_FILES)])) == \
        KNOWN_FILES
