"""Checkpoints an adversary (or an accident) left behind: tampered files that pass their
checksum, and runs whose every checkpoint is broken. No Spark."""
from __future__ import annotations

import logging
import os
import traceback

import pytest
import torch

from sparkddl import checkpoint
from sparkddl.checkpoint.safe import load_plain
from sparkddl.errors import CheckpointError
from sparkddl.ml.inference import ModelPayload
from sparkddl.store import Store


class Planted:
    """Unpickling it would run ``touch <marker>``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def no_torch_advice(exc: BaseException) -> None:
    """Neither the message nor the traceback (chained errors included) tells the user to
    load the file with weights_only=False or to allowlist what it holds."""
    text = "".join(traceback.format_exception(exc))
    assert "weights_only" not in text and "safe_globals" not in text, text
    assert exc.__cause__ is None and exc.__suppress_context__


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "code-ran"
    yield str(path)
    assert not path.exists(), "the planted code ran"


def test_a_tampered_checkpoint_is_refused_naming_the_file(tmp_path, marker):
    store = Store.from_uri(tmp_path)
    url = f"{checkpoint.checkpoint_dir(store, 'r1')}/ckpt-00002-00000000.pt"
    store.write_bytes(url, checkpoint.encode({"model": Planted(marker)}))  # a valid checksum
    with pytest.raises(CheckpointError) as info:
        checkpoint.decode(store.read_bytes(url), url)  # what every rank does on resume
    assert url in str(info.value)
    assert "objects other than tensors and plain values" in str(info.value)
    assert "posix.system" in str(info.value) or "os.system" in str(info.value)
    no_torch_advice(info.value)


def test_a_tampered_driver_state_stops_the_resume(tmp_path, marker):
    store = Store.from_uri(tmp_path)
    checkpoint.save(store, "r1", 2, 0, {"model": {"w": torch.ones(2)}}, keep=3)
    url = checkpoint.driver_state_url(store, "r1", 2)
    store.write_bytes(url, checkpoint.encode({"rows": [Planted(marker)]}))
    with pytest.raises(CheckpointError) as info:
        checkpoint.load_driver_state(store, "r1", 2)
    assert url in str(info.value) and "not resumed" in str(info.value)
    no_torch_advice(info.value)
    with pytest.raises(CheckpointError, match="driver-00002.pt"):  # before anything runs
        checkpoint.check_resumable(store, "r1")


def test_a_damaged_driver_state_only_costs_the_history(tmp_path, caplog):
    store = Store.from_uri(tmp_path)
    url = checkpoint.driver_state_url(store, "r1", 2)
    store.write_bytes(url, checkpoint.encode({"rows": []})[:-3])  # truncated: an accident
    with caplog.at_level(logging.WARNING, logger="sparkddl.checkpoint"):
        assert checkpoint.load_driver_state(store, "r1", 2) is None
    assert "truncated" in caplog.text and "weights_only" not in caplog.text


def test_rank_state_and_shipped_weights_are_loaded_without_trust(marker):
    import io
    buf = io.BytesIO()
    torch.save({"w": Planted(marker)}, buf)
    with pytest.raises(CheckpointError, match=r"^rank 1's checkpoint state holds objects"):
        load_plain(buf.getvalue(), "rank 1's checkpoint state")
    payload = ModelPayload({"kind": "exported"}, b"", buf.getvalue())
    with pytest.raises(CheckpointError, match=r"the model's weights shipped by the driver") \
            as info:
        payload.module()
    no_torch_advice(info.value)


def test_bytes_that_are_not_torch_save_data_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"^/x/w\.pt .*(not readable|objects other)"):
        load_plain(b"not a checkpoint", "/x/w.pt")


def test_random_bytes_behind_a_forged_header_are_named_whatever_torch_raises():
    """Random bytes make torch's safe unpickler raise many kinds of errors (seed 2 of the
    adversarial benchmark: IndexError); every one is a CheckpointError naming the file."""
    import random
    for seed in range(200):
        with pytest.raises(CheckpointError, match=rf"^/x/{seed}\.pt "):
            load_plain(random.Random(seed).randbytes(256), f"/x/{seed}.pt")


def test_a_resume_whose_checkpoints_are_all_broken_is_refused(tmp_path):
    store = Store.from_uri(tmp_path)
    refs = [checkpoint.save(store, "r1", e, 0, {"model": {"w": torch.ones(2)}}, keep=3)
            for e in (1, 2, 3)]
    data = store.read_bytes(refs[0].url)
    store.write_bytes(refs[0].url, data[:-10])  # truncated
    store.write_bytes(refs[1].url, data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    store.write_bytes(refs[2].url, b"garbage")  # not a checkpoint at all
    with pytest.raises(CheckpointError) as info:
        checkpoint.check_resumable(store, "r1")
    text = str(info.value)
    assert "run r1 cannot be resumed" in text and "would train from epoch 1" in text
    for ref, why in zip(refs, ("truncated", "checksum does not match", "bad header")):
        assert ref.url in text and why in text
    assert "Delete them" in text and "runId" in text


def test_a_resume_takes_the_newest_usable_checkpoint(tmp_path):
    store = Store.from_uri(tmp_path)
    assert checkpoint.check_resumable(store, "new-run") is None  # nothing yet: from scratch
    good = checkpoint.save(store, "r1", 1, 0, {"model": {"w": torch.ones(2)}}, keep=3)
    bad = checkpoint.save(store, "r1", 2, 0, {"model": {"w": torch.ones(2)}}, keep=3)
    store.write_bytes(bad.url, b"garbage")
    assert checkpoint.check_resumable(store, "r1") == good
