"""Store URIs and layout; the local filesystem for real."""
from __future__ import annotations

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
])
def test_uris_normalize(uri, root):
    assert Store.from_uri(uri).root == root


def test_relative_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Store.from_uri("rel/dir").root == f"file://{tmp_path}/rel/dir"


def test_layout_and_scheme_mapping():
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
    ("gs://b/p", "scheme 'gs'"), ("s3:///nobucket", "has no bucket"), ("", "empty")])
def test_bad_uris_are_explained(uri, match):
    with pytest.raises(StoreError, match=match):
        Store.from_uri(uri)


def test_dbfs_outside_databricks_is_explained():
    with pytest.raises(StoreError, match="needs the /dbfs FUSE mount"):
        Store.from_uri("dbfs:/x").filesystem()


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
