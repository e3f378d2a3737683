"""Listings of a table's files: partition values from hive folders, typed as Spark types them,
and added to what is read from each file."""
from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from sparkddl.errors import DataError
from sparkddl.tables.hive import hive_table, hive_values, infer_type, partition_names
from sparkddl.tables.table import Table


def test_hive_folders_give_partition_values_below_the_root():
    path = "/t/year=2024/city=S%C3%A3o Paulo/part-0.parquet"
    assert hive_values("/t", path) == {"year": "2024", "city": "São Paulo"}
    # folders above the root are not the table's
    assert hive_values("/a=1/t", "/a=1/t/b=2/f.parquet") == {"b": "2"}
    assert partition_names("/t", ["/t/y=1/z=a/f", "/t/y=2/f"]) == ["y"]


@pytest.mark.parametrize("values,expected", [
    (["1", "-2"], "int64"), (["1", "2.5"], "float64"), (["true", "False"], "bool"),
    (["a", "1"], "string")])
def test_types_are_inferred_as_spark_infers_them(values, expected):
    assert infer_type(values) == expected


def test_partition_columns_are_added_as_constants_in_the_order_asked():
    listing = hive_table("/t", ["/t/p=0/a", "/t/p=1/b"], ["p"])
    assert listing.types == ("int64",) and listing.values == ((0,), (1,))
    table = pa.table({"x": [1.5, 2.5, 3.5]})
    assert listing.file_columns(["p", "x"]) == ["x"]
    out = listing.add_columns(table, "/t/p=1/b", ["p", "x"])
    assert out.column_names == ["p", "x"] and out.column("p").to_pylist() == [1, 1, 1]
    assert out.schema.field("p").type == pa.int64()
    # a listing travels to the ranks in the shard plan
    again = pickle.loads(pickle.dumps(listing))
    assert again == listing and again.add_columns(table, "/t/p=0/a", ["x", "p"]) \
        .column("p").to_pylist() == [0, 0, 0]


def test_spark_types_are_kept_and_bad_or_null_values_are_data_errors():
    listing = hive_table("", ["/t/p=1/a"], ["p"], {"p": "float32"})
    assert listing.values == ((1.0,),) and listing.arrow_types()["p"] == pa.float32()
    with pytest.raises(DataError, match=r"partition column 'p' is null for /t/p=__HIVE"):
        hive_table("", ["/t/p=__HIVE_DEFAULT_PARTITION__/a"], ["p"], {"p": "int32"})
    with pytest.raises(DataError, match=r"'p' of /t/p=x/a has value 'x', which is not a int32"):
        hive_table("", ["/t/p=x/a"], ["p"], {"p": "int32"})
    with pytest.raises(DataError, match=r"/t/a is not in a p=<value> folder"):
        hive_table("/t", ["/t/a"], ["p"])
    with pytest.raises(ValueError):
        Table(("/a",), ("p",), ("int64",), ())
