"""A materialization that fills the disk: the executor's writer names the file, and nothing of
the failed write stays in the store (the real partition writer on a real tmpfs, root only;
Spark's job is played by a stand-in that runs it in this process)."""
from __future__ import annotations

import traceback

import numpy as np
import pyarrow as pa
import pytest

from sparkddl.data import encode, materialize
from sparkddl.data.encode import SPLIT_COL
from sparkddl.data.schema import ColumnSpec
from sparkddl.errors import StoreError
from sparkddl.store import Store
from tests.unit.store.tmpfs import fill, free, small_filesystem

KIB = 1024
COLUMNS = (ColumnSpec("x", "feature", "tensor", "float32", (256,)),
           ColumnSpec("y", "label", "scalar", "int64"))
ROWS = 1024  # 1 MiB of features: more than the disk has left


@pytest.fixture
def small_fs(tmp_path):
    with small_filesystem(tmp_path) as mnt:
        yield mnt


@pytest.fixture(autouse=True)
def one_task(monkeypatch):
    """Partition 0, attempt 0, as the writer asks Spark's TaskContext."""
    import pyspark

    class Task:
        def partitionId(self) -> int:  # noqa: N802 - TaskContext's name
            return 0

        def attemptNumber(self) -> int:  # noqa: N802 - TaskContext's name
            return 0

    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: Task()))
    monkeypatch.setattr(materialize, "cluster_context",
                        lambda spark: type("Ctx", (), {"partitions": lambda self, df: 1})())


def batches() -> list[pa.RecordBatch]:
    x = np.random.default_rng(0).random((ROWS, 256), np.float32)  # does not compress
    return [pa.RecordBatch.from_pydict({
        "x": pa.array(list(x[i:i + 128]), pa.list_(pa.float32())),
        "y": pa.array(np.arange(i, i + 128)), SPLIT_COL: pa.array(np.zeros(128, np.int32))})
        for i in range(0, ROWS, 128)]


class Selected:
    """Stands in for the selected DataFrame: its one write job runs the partition writer
    here, and a failure reaches the caller as Spark relays it, as text."""
    sparkSession = None  # noqa: N815 - DataFrame's name

    def coalesce(self, n: int) -> "Selected":
        return self

    def mapInArrow(self, fn, schema: str) -> "Selected":  # noqa: N802 - DataFrame's name
        self.fn = fn
        return self

    def collect(self) -> list:
        try:
            return [row for out in self.fn(iter(batches())) for row in out.to_pylist()]
        except Exception:  # noqa: BLE001 - wrapped as Spark's Python worker does
            raise RuntimeError("An exception was thrown from the Python worker.\n" +
                               traceback.format_exc()) from None


def test_the_partition_writer_on_a_full_disk_names_its_file_and_removes_it(small_fs):
    store = Store.from_uri(small_fs / "store")
    fill(small_fs, leave=256 * KIB)
    room = free(small_fs)
    root = store.data_url("k", "parts-1")
    with pytest.raises(StoreError, match=f"cannot write {root}/{SPLIT_COL}=train/"
                                         "part-00000-0.parquet: ENOSPC .* free of 1.0 MiB"):
        list(encode.write_partition(COLUMNS, store, root, 128, iter(batches())))
    assert store.listdir(f"{root}/{SPLIT_COL}=train") == []
    assert free(small_fs) == room


def test_a_failed_write_job_leaves_nothing_and_raises_the_executors_store_error(small_fs):
    store = Store.from_uri(small_fs / "store")
    store.write_bytes(store.url("data", "k", "other"), b"kept")  # not the failed write's
    fill(small_fs, leave=256 * KIB)
    room = free(small_fs)
    with pytest.raises(StoreError, match=r"cannot write .*/data/k/parts-\w+/__split=train/"
                                         "part-00000-0.parquet: ENOSPC") as caught:
        materialize._write(Selected(), COLUMNS, store, "k", ROWS, 4, 128 * KIB)
    assert "An exception was thrown from the Python worker" in str(caught.value.__cause__)
    assert store.listdir(store.data_url("k")) == ["other"]  # no parts folder
    assert free(small_fs) == room


def test_a_write_job_that_fails_otherwise_leaves_nothing_and_raises_as_it_was(small_fs,
                                                                            monkeypatch):
    store = Store.from_uri(small_fs / "store")
    real = encode.encode_batch
    calls = []

    def fail_late(*args):
        calls.append(1)
        if len(calls) == 5:  # after some row groups were written
            raise ValueError("the executor's Python died")
        return real(*args)

    monkeypatch.setattr(encode, "encode_batch", fail_late)
    with pytest.raises(RuntimeError, match="the executor's Python died"):
        materialize._write(Selected(), COLUMNS, store, "k", ROWS, 4, 64 * KIB)
    assert store.listdir(store.data_url("k")) == []
