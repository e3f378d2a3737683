"""A checkpoint that cannot be written (full disk, read-only mount) leaves nothing of itself,
and the one before it stays the one a resume loads (a real tmpfs, root only; no Spark)."""
from __future__ import annotations

import pytest
import torch

from sparkddl import checkpoint
from sparkddl.errors import StoreError
from sparkddl.store import Store
from tests.unit.store.tmpfs import fill, free, make_read_only, small_filesystem

KIB = 1024


@pytest.fixture
def small_fs(tmp_path):
    with small_filesystem(tmp_path) as mnt:
        yield mnt


def payload(v: float, kib: int) -> dict:
    return {"epoch": int(v), "model": {"w": torch.full((kib * KIB // 4,), v)}}


def only_the_first(store: Store) -> None:
    """What a resume finds: checkpoint 1, whole, and no temp files beside it."""
    assert store.listdir(checkpoint.checkpoint_dir(store, "r1")) == ["ckpt-00001-00000000.pt"]
    good = checkpoint.latest_good(store, "r1")
    assert good is not None and (good.epoch, good.step) == (1, 0)
    loaded = checkpoint.decode(store.read_bytes(good.url), good.url)
    assert torch.equal(loaded["model"]["w"], payload(1.0, 64)["model"]["w"])
    assert checkpoint.check_resumable(store, "r1") == good


def test_a_checkpoint_the_disk_has_no_room_for_leaves_the_previous_one_usable(small_fs):
    store = Store.from_uri(small_fs / "store")
    checkpoint.save(store, "r1", 1, 0, payload(1.0, 64), keep=3)
    filler = fill(small_fs, leave=128 * KIB)
    room = free(small_fs)
    url = f"{checkpoint.checkpoint_dir(store, 'r1')}/ckpt-00002-00000000.pt"
    with pytest.raises(StoreError, match=f"epoch 2, step 0 of run r1 was not written .*"
                                         f"cannot write .* to {url}: ENOSPC .* free of 1.0 MiB"
                                         ".*runId='r1' resumes from the newest"):
        checkpoint.save(store, "r1", 2, 0, payload(2.0, 512), keep=3)
    only_the_first(store)
    assert free(small_fs) == room  # the partial temp does not hold the space
    filler.unlink()  # once there is room, the run goes on
    checkpoint.save(store, "r1", 2, 0, payload(2.0, 512), keep=3)
    assert checkpoint.latest_good(store, "r1").epoch == 2


def test_a_checkpoint_on_a_store_turned_read_only_leaves_the_previous_one_usable(small_fs):
    store = Store.from_uri(small_fs / "store")
    checkpoint.save(store, "r1", 1, 0, payload(1.0, 64), keep=3)
    make_read_only(small_fs)
    with pytest.raises(StoreError, match="was not written .*: EROFS"):
        checkpoint.save(store, "r1", 2, 0, payload(2.0, 64), keep=3)
    only_the_first(store)


def test_the_drivers_fence_write_on_a_full_disk_names_the_file(small_fs):
    store = Store.from_uri(small_fs / "store")
    store.write_bytes(store.run_url("r1", "run.json"), b"{}")  # the run's folder exists
    fill(small_fs)
    with pytest.raises(StoreError, match=f"cannot write 9 B to {store.run_url('r1', 'attempt')}"
                                         ": ENOSPC .* 0 B free of 1.0 MiB"):
        checkpoint.set_fence(store, "r1", "attempt-1")
    assert store.listdir(store.run_url("r1")) == ["run.json"]
