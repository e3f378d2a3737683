"""Storage faults while writing to the Store: a full disk or a read-only mount is a
StoreError naming the file, the fault and the space left, and nothing half-written stays
(a real tmpfs, root only; no Spark)."""
from __future__ import annotations

import errno

import pytest

from sparkddl.errors import StoreError
from sparkddl.store import Store
from sparkddl.store.faults import fault_errno, from_executor
from tests.unit.store.tmpfs import fill, free, make_read_only, small_filesystem

KIB = 1024


@pytest.fixture
def small_fs(tmp_path):
    with small_filesystem(tmp_path) as mnt:
        yield mnt


def test_a_full_store_names_the_file_and_the_space_left_and_keeps_the_old_file(small_fs):
    store = Store.from_uri(small_fs / "store")
    url = store.run_url("r1", "history.json")
    store.write_bytes(url, b"v1")
    fill(small_fs, leave=64 * KIB)
    room = free(small_fs)
    with pytest.raises(StoreError) as caught:
        store.write_bytes(url, b"x" * (256 * KIB))
    message = str(caught.value)
    assert f"cannot write 256.0 KiB to {url}: ENOSPC (No space left on device)" in message
    assert f"free of 1.0 MiB at {small_fs}/store/runs/r1" in message
    assert "point the `store` option at another location" in message
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    # the temp that took the space left was removed, and the old file is whole
    assert store.listdir(store.run_url("r1")) == ["history.json"]
    assert free(small_fs) == room
    assert store.read_bytes(url) == b"v1"


def test_a_read_only_store_is_a_store_error_naming_the_file(small_fs):
    store = Store.from_uri(small_fs / "store")
    store.write_bytes(store.url("kept"), b"v1")
    make_read_only(small_fs)
    url = store.run_url("r1", "attempt")
    with pytest.raises(StoreError, match=f"cannot write 5 B to {url}: EROFS "
                                         r"\(Read-only file system\).*remount it read-write"):
        store.write_bytes(url, b"token")
    # the early check says the same, not wrapped in another message
    with pytest.raises(StoreError, match=r"^cannot write 2 B to .*\.write-probe-.*: EROFS"):
        store.check_writable()
    assert store.read_bytes(store.url("kept")) == b"v1"


@pytest.mark.parametrize("exc,code", [
    (OSError(errno.ENOSPC, "Error writing bytes to file"), errno.ENOSPC),
    (OSError("Detail: [errno 122] Disk quota exceeded"), errno.EDQUOT),  # errno in text only
    (PermissionError("Access Denied"), errno.EACCES),  # object stores give no errno
    (FileNotFoundError(errno.ENOENT, "gone"), None),
    (OSError(errno.ENOTDIR, "Not a directory"), None),
])
def test_which_errors_are_storage_faults(exc, code):
    assert fault_errno(exc) == code


def test_a_store_error_raised_on_an_executor_is_raised_again_on_the_driver():
    relayed = RuntimeError(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n  ...\n"
        "OSError: [Errno 28] Error writing bytes to file\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  ...\n"
        "sparkddl.errors.StoreError: cannot write file:///s/data/k/p/part-0.parquet: ENOSPC "
        "(No space left on device), 0 B free of 1.0 MiB at /s; free space\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...")
    error = from_executor(relayed)
    assert isinstance(error, StoreError)
    assert str(error).startswith("cannot write file:///s/data/k/p/part-0.parquet: ENOSPC")
    assert str(error).endswith("free space")
    assert from_executor(RuntimeError("Task failed: ValueError: no")) is None
