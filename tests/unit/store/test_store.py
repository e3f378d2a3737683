"""Store URIs and layout; the local filesystem for real."""
from __future__ import annotations

import os
import pickle

import pytest

from sparkddl.errors import StoreError
from sparkddl.store import Store


@pytest.mark.parametrize("uri,root", [
    ("/tmp/ddl/", "file:///tmp/ddl"),
    ("file:///tmp/ddl", "file:///tmp/ddl"),
    ("hdfs://nn:8020/user/me/ddl/", "hdfs://nn:8020/user/me/ddl"),
    ("s3://bucket/prefix/x", "s3://bucket/prefix/x"),
    ("s3a://bucket/p", "s3://bucket/p"),
    ("dbfs:/ml/ddl", "dbfs:/ml/ddl"),
    ("dbfs:///ml/ddl/", "dbfs:/ml/ddl"),
    ("gs://bucket/p/", "gs://bucket/p"),
    ("abfss://c@acct.dfs.core.windows.net/p", "abfss://c@acct.dfs.core.windows.net/p"),
    ("memory://scratch/x", "memory://scratch/x"),
    ("/Volumes/main/default/vol/ddl", "file:///Volumes/main/default/vol/ddl"),
])
def test_uris_normalize(uri, root):
    assert Store.from_uri(uri).root == root


def test_relative_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Store.from_uri("rel/dir").root == f"file://{tmp_path}/rel/dir"


def test_layout_and_scheme_mapping(monkeypatch):
    monkeypatch.setattr("sparkddl.store.store._dbfs_mounted", lambda: True)  # a cluster
    s3 = Store.from_uri("s3://bucket/root")
    assert s3.data_url("fp1", "train") == "s3://bucket/root/data/fp1/train"
    assert s3.spark_url("data", "fp1") == "s3a://bucket/root/data/fp1"
    assert s3.run_url("r1", "checkpoints") == "s3://bucket/root/runs/r1/checkpoints"
    assert s3.fs_path(s3.url("a")) == "bucket/root/a"
    dbfs = Store.from_uri("dbfs:/ml/ddl")
    assert dbfs.url("data", "x") == "file:///dbfs/ml/ddl/data/x"  # the FUSE mount
    assert dbfs.spark_url("data", "x") == "dbfs:/ml/ddl/data/x"   # Spark writes DBFS directly
    hdfs = Store.from_uri("hdfs://nn:8020/a")
    assert hdfs.url("runs", "r") == hdfs.spark_url("runs", "r") == "hdfs://nn:8020/a/runs/r"


@pytest.mark.parametrize("uri,match", [
    ("nosuchfs://b/p", "scheme 'nosuchfs'"), ("s3:///nobucket", "has no bucket"),
    ("", "empty")])
def test_bad_uris_are_explained(uri, match):
    with pytest.raises(StoreError, match=match):
        Store.from_uri(uri)


def test_dbfs_outside_databricks_is_explained(monkeypatch):
    monkeypatch.delenv("DATABRICKS_HOST", raising=False)
    with pytest.raises(StoreError, match="needs the /dbfs FUSE mount .* or DATABRICKS_HOST and "
                                         "DATABRICKS_TOKEN for the DBFS API"):
        Store.from_uri("dbfs:/x").filesystem()


def test_dbfs_without_the_mount_goes_through_the_dbfs_api(monkeypatch):
    """Standard (shared) compute has no /dbfs: fsspec's Databricks filesystem (REST API);
    built here without contacting a workspace."""
    monkeypatch.setenv("DATABRICKS_HOST", "https://adb-1.2.azuredatabricks.net")
    monkeypatch.setenv("DATABRICKS_TOKEN", "dapi-test")
    store = Store.from_uri("dbfs:/ml/ddl")
    assert store.url("data") == "dbfs:/ml/ddl/data"  # not the mount's file:// path
    fs = store.filesystem()
    assert type(fs.handler.fs).__name__ == "DatabricksFileSystem"
    assert fs.handler.fs.instance == "adb-1.2.azuredatabricks.net"
    assert store.fs_path(store.url("data", "x")) == "/ml/ddl/data/x"


def test_volumes_are_local_paths_to_python_and_dbfs_volumes_to_spark():
    store = Store.from_uri("/Volumes/main/default/vol/ddl")
    assert store.url("data", "x") == "file:///Volumes/main/default/vol/ddl/data/x"
    assert store.spark_url("data", "x") == "dbfs:/Volumes/main/default/vol/ddl/data/x"
    assert store.fs_path(store.url("a")) == "/Volumes/main/default/vol/ddl/a"


def test_a_filesystem_whose_package_is_missing_names_it():
    for uri, package in (("gs://bucket/p", "gcsfs"), ("abfss://c@a.dfs.core.windows.net/p",
                                                     "adlfs")):
        with pytest.raises(StoreError, match=f"filesystem's package is not installed "
                                             f"\\(pip install {package}\\)"):
            Store.from_uri(uri).filesystem()


def test_a_memory_store_round_trip_through_the_data_plane():
    """Any fsspec filesystem goes through one code path: pyarrow wraps it, and the Parquet
    readers use it as they use the local disk."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkddl.data import DataSpec
    from sparkddl.data.local import batches
    from sparkddl.data.source import open_parquet
    store = Store.from_uri("memory://sparkddl-test/root")
    url = store.run_url("r1", "history.json")
    store.write_bytes(url, b"v1")
    store.write_bytes(url, b"v2")
    assert store.read_bytes(url) == b"v2" and store.exists(url)
    assert store.listdir(store.run_url("r1")) == ["history.json"]
    store.check_writable()
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    fs, folder = store.filesystem(), store.fs_path(store.url("data", "fp", "train"))
    fs.create_dir(folder, recursive=True)
    with fs.open_output_stream(f"{folder}/part-0.parquet") as f:
        pq.write_table(pa.table({"x": pa.array(x.tolist(), pa.list_(pa.float32())),
                                 "y": np.arange(10)}), f, row_group_size=4)
    data = open_parquet(store.url("data", "fp", "train"), DataSpec.of("x", "y"))
    assert data.rows == 10
    got = list(batches(data, 3))
    assert np.array_equal(np.concatenate([b["x"] for b in got]), x)
    store.delete(store.url())
    assert not store.exists(url)
    with pytest.raises(StoreError, match="executors cannot reach"):
        store.check_shared()


def test_local_store_reads_writes_lists_atomically(tmp_path):
    store = Store.from_uri(tmp_path / "root")
    url = store.run_url("r1", "history.json")
    store.write_bytes(url, b"v1")
    store.write_bytes(url, b"v2")
    assert store.read_bytes(url) == b"v2" and store.exists(url)
    assert store.listdir(store.run_url("r1")) == ["history.json"]  # no temp files left
    assert store.listdir(store.url("missing")) == []
    store.delete(store.run_url("r1"))
    assert not store.exists(url)
    copy = pickle.loads(pickle.dumps(store))  # ships to executors
    assert copy == store and copy.root == store.root
    store.check_writable()


def test_unwritable_store_is_reported(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match=r"store file://.*/a-file/store is not writable"):
        Store.from_uri(blocker / "store").check_writable()


@pytest.mark.parametrize("name", ["run#1", "run?x=1", "a b", "100%", "a%20b", "café"])
def test_a_store_path_is_the_folder_as_named_whatever_its_characters(tmp_path, name):
    for given in (str(tmp_path / name / "store"), "file://" + str(tmp_path / name / "store")):
        store = Store.from_uri(given)
        store.write_bytes(store.run_url("r", "run.json"), b"{}")
        assert (tmp_path / name / "store" / "runs" / "r" / "run.json").read_bytes() == b"{}"
        assert store.listdir(store.run_url("r")) == ["run.json"]
    assert os.listdir(tmp_path) == [name]


@pytest.mark.parametrize("name", ["a b", "100%", "a%20b", "run#1", "run?x=1", "café"])
def test_spark_uris_are_decoded_once(tmp_path, name):
    from urllib.parse import quote

    from sparkddl.store import decode_hadoop_uri
    path = str(tmp_path / name / "part-0.parquet")
    assert decode_hadoop_uri("file:" + quote(path)) == "file:" + path
    assert Store.from_uri(decode_hadoop_uri("file:" + quote(path))).fs_path(
        Store.from_uri(decode_hadoop_uri("file:" + quote(path))).url()) == path
