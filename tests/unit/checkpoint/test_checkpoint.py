"""Checkpoint files: atomic writes, checksums, pruning, skipping broken ones (no Spark)."""
from __future__ import annotations

import logging

import pytest
import torch

from sparkddl import checkpoint
from sparkddl.errors import CheckpointError, StaleAttemptError
from sparkddl.store import Store


def payload(v: float) -> dict:
    return {"epoch": 1, "model": {"w": torch.full((3,), v)}, "rows": [{"epoch": 1, "x": v}]}


def test_round_trip_and_weights_only_load(tmp_path):
    store = Store.from_uri(tmp_path)
    ref = checkpoint.save(store, "r1", 2, 0, payload(1.5), keep=3)
    loaded = checkpoint.decode(store.read_bytes(ref.url), ref.url)
    assert torch.equal(loaded["model"]["w"], torch.full((3,), 1.5))
    assert (ref.epoch, ref.step) == (2, 0)


def test_keep_last_k(tmp_path):
    store = Store.from_uri(tmp_path)
    for epoch in range(1, 6):
        checkpoint.save(store, "r1", epoch, 0, payload(epoch), keep=2)
    assert [(r.epoch, r.step) for r in checkpoint.listing(store, "r1")] == [(4, 0), (5, 0)]


def test_steps_order_within_an_epoch(tmp_path):
    store = Store.from_uri(tmp_path)
    for epoch, step in [(1, 0), (1, 40), (1, 7), (2, 0)]:
        checkpoint.save(store, "r1", epoch, step, payload(0), keep=10)
    assert [(r.epoch, r.step) for r in checkpoint.listing(store, "r1")] == \
        [(1, 0), (1, 7), (1, 40), (2, 0)]


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:-10], "is truncated"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum does not match"),
    (lambda b: b"garbage" + b, "bad header"),
])
def test_broken_latest_is_skipped_with_a_warning(tmp_path, caplog, damage, match):
    store = Store.from_uri(tmp_path)
    checkpoint.save(store, "r1", 1, 0, payload(1.0), keep=3)
    bad = checkpoint.save(store, "r1", 2, 0, payload(2.0), keep=3)
    store.write_bytes(bad.url, damage(store.read_bytes(bad.url)))
    with pytest.raises(CheckpointError, match=match):
        checkpoint.decode(store.read_bytes(bad.url), bad.url)
    with caplog.at_level(logging.WARNING, logger="sparkddl.checkpoint"):
        good = checkpoint.latest_good(store, "r1")
    assert good is not None and good.epoch == 1
    assert f"skipping checkpoint {bad.url}" in caplog.text and match in caplog.text


def test_no_checkpoint_at_all(tmp_path):
    assert checkpoint.latest_good(Store.from_uri(tmp_path), "nothing") is None


def test_driver_state_follows_the_kept_checkpoints(tmp_path):
    store = Store.from_uri(tmp_path)
    for epoch in range(1, 5):
        checkpoint.save(store, "r1", epoch, 0, payload(epoch), keep=2)
        checkpoint.save_driver_state(store, "r1", epoch, {"rows": [], "best_value": 0.5})
    names = store.listdir(checkpoint.checkpoint_dir(store, "r1"))
    assert [n for n in names if n.startswith("driver")] == ["driver-00003.pt", "driver-00004.pt"]
    assert checkpoint.load_driver_state(store, "r1", 4)["best_value"] == 0.5
    assert checkpoint.load_driver_state(store, "r1", 1) is None


def test_an_attempt_that_is_no_longer_current_writes_and_deletes_nothing(tmp_path):
    store = Store.from_uri(tmp_path)
    checkpoint.set_fence(store, "r1", "0-aaa")
    checkpoint.save(store, "r1", 1, 0, payload(1.0), keep=1, fence="0-aaa")
    checkpoint.set_fence(store, "r1", "1-bbb")  # the driver relaunched
    with pytest.raises(StaleAttemptError, match="attempt 0-aaa of run r1 is no longer current"):
        checkpoint.save(store, "r1", 2, 0, payload(2.0), keep=1, fence="0-aaa")
    assert [(r.epoch, r.step) for r in checkpoint.listing(store, "r1")] == [(1, 0)]
    checkpoint.save(store, "r1", 2, 0, payload(2.0), keep=1, fence="1-bbb")
    assert [(r.epoch, r.step) for r in checkpoint.listing(store, "r1")] == [(2, 0)]


def test_rotation_never_deletes_the_checkpoint_the_attempt_resumed_from(tmp_path):
    store = Store.from_uri(tmp_path)
    resumed = checkpoint.save(store, "r1", 1, 0, payload(1.0), keep=1)
    for epoch in (2, 3):
        checkpoint.save(store, "r1", epoch, 0, payload(epoch), keep=1, protect=resumed.url)
    assert [(r.epoch, r.step) for r in checkpoint.listing(store, "r1")] == [(1, 0), (3, 0)]
