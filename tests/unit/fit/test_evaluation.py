"""The driver's snapshot evaluator and silent-death detection: state machines that decide
the returned weights, early stopping and who is blamed, tested without Spark."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from sparkddl.channel import messages as m
from sparkddl.channel.server import Message
from sparkddl.data import DataSpec
from sparkddl.data.source import open_parquet
from sparkddl.fit.evaluation import SnapshotEvaluator
from sparkddl.launch.monitor import StageMonitor
from sparkddl.store import Store
from sparkddl.train.metrics import resolve_metrics
from sparkddl.train.steps import LossFn

X = np.array([[1, 0], [0, 1], [2, 0], [0, 2]], dtype=np.float32)
Y = np.array([0, 1, 0, 1], dtype=np.int64)


def state(good: bool) -> bytes:
    """Weights that classify X perfectly (good) or output zeros (loss ln 2)."""
    weight = torch.eye(2) * 5 if good else torch.zeros(2, 2)
    buf = io.BytesIO()
    torch.save({"weight": weight, "bias": torch.zeros(2)}, buf)
    return buf.getvalue()


def val_data(tmp_path):
    """X, Y as a Parquet dataset (two row groups): the evaluator streams it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "val"
    folder.mkdir(exist_ok=True)
    table = pa.table({"x": pa.array(X.tolist(), pa.list_(pa.float32())), "y": Y})
    pq.write_table(table, folder / "part-0.parquet", row_group_size=3)
    return open_parquet(str(folder), DataSpec.of("x", "y"))


def evaluator(tmp_path, patience: int = 2, callbacks=None, **options) -> SnapshotEvaluator:
    return SnapshotEvaluator(lambda: torch.nn.Linear(2, 2),
                             LossFn(("x",), ("y",), (torch.nn.CrossEntropyLoss(),)),
                             resolve_metrics(["accuracy"]), val_data(tmp_path),
                             "val_loss", "min", patience, Store.from_uri(tmp_path), "run1",
                             callbacks=callbacks, **options)


def test_each_epoch_is_reported_once_complete_with_its_validation_metrics(tmp_path):
    """The console's epoch line: after the snapshot's evaluation, not before it; an epoch
    with no snapshot (snapshot_every=2) is reported as the ranks sent it."""
    reported: list[dict] = []
    ev = evaluator(tmp_path, snapshot_every=2, epochs=3, report=reported.append)
    for epoch in (1, 2, 3):
        ev.record_epoch({"epoch": epoch, "train_loss": 1.0 / epoch})
        if epoch != 1:
            ev.submit(m.Snapshot(epoch), state(epoch == 2), lambda header: None)
    ev.close()
    assert [r["epoch"] for r in reported] == [1, 2, 3]
    assert "val_loss" not in reported[0] and reported[0]["train_loss"] == 1.0
    assert reported[1]["val_accuracy"] == 1.0 and reported[1]["train_loss"] == 0.5
    assert math.isclose(reported[2]["val_loss"], math.log(2), rel_tol=1e-6)


def test_best_snapshot_history_and_early_stop(tmp_path):
    ev = evaluator(tmp_path)
    replies: list[dict] = []
    for epoch, good in enumerate([False, True, False, False], 1):
        ev.record_epoch({"epoch": epoch, "train_loss": 1.0 / epoch})
        ev.submit(m.Snapshot(epoch), state(good), replies.append)
    result = ev.close()
    assert result.best.epoch == 2 and result.last.epoch == 4
    assert [r["epoch"] for r in result.history] == [1, 2, 3, 4]
    assert math.isclose(result.history[0]["val_loss"], math.log(2), rel_tol=1e-6)
    assert result.history[1]["val_accuracy"] == 1.0 and result.history[1]["train_loss"] == 0.5
    # two evaluated snapshots without improvement (epochs 3, 4): the ranks are asked to stop
    assert replies == [m.Stop(4).header()] and result.stop_requested_at == 4
    assert result.errors == []


def test_a_snapshot_that_cannot_be_loaded_is_an_error_not_a_crash(tmp_path):
    ev = evaluator(tmp_path)
    ev.submit(m.Snapshot(1), b"not torch.save bytes", lambda header: None)
    ev.submit(m.Snapshot(2), state(True), lambda header: None)
    result = ev.close()
    assert len(result.errors) == 1 and result.best.epoch == 2


def test_rewind_restores_what_the_driver_knew_at_the_checkpoint(tmp_path):
    ev = evaluator(tmp_path, patience=0)
    for epoch, good in enumerate([False, False, True], 1):
        ev.record_epoch({"epoch": epoch, "train_loss": 1.0})
        ev.submit(m.Snapshot(epoch), state(good), lambda header: None)
        if epoch == 2:
            ev.checkpointed(2)  # the ranks checkpointed after epoch 2
    ev.rewind(2)  # a restarted attempt trains epoch 3 again
    result = ev.close()
    assert [r["epoch"] for r in result.history] == [1, 2]
    assert result.best.epoch == 1 and result.last is None


def test_rewind_without_a_saved_state_forgets_a_later_best(tmp_path):
    ev = evaluator(tmp_path, patience=0)
    for epoch, good in enumerate([False, True], 1):
        ev.record_epoch({"epoch": epoch, "train_loss": 1.0})
        ev.submit(m.Snapshot(epoch), state(good), lambda header: None)
    ev.rewind(1)
    result = ev.close()
    assert [r["epoch"] for r in result.history] == [1]
    assert result.best is None and result.last is None  # only the best's weights are kept


def test_a_rank_whose_connection_closed_without_done_or_report_died_silently():
    monitor = StageMonitor()
    for rank in (0, 1, 2):
        monitor.handle(Message(rank, m.Hello(rank).header()))
    monitor.handle(Message(0, m.Done().header()))
    monitor.handle(Message(0, m.Closed().header()))  # finished normally
    monitor.handle(Message(2, m.Error("RuntimeError: x", "Traceback", "h", {}).header()))
    monitor.handle(Message(2, m.Closed().header()))  # reported, then closed
    monitor.handle(Message(1, m.Closed().header()))  # neither: its worker died
    assert monitor.died_silently(before=float("inf")) == [1]
    assert monitor.died_silently(before=0.0) == []  # closed after the decision: a cancel
    assert monitor.accounted() == 2 and monitor.wake.is_set()


def test_ranks_evaluate_a_split_with_fewer_row_groups_than_ranks():
    """Ranks share validation rows by row ranges: two row groups serve four ranks."""
    from sparkddl.config import TrainConfig
    from sparkddl.data.dataset import Dataset
    from sparkddl.errors import ConfigError
    from sparkddl.fit.evaluation import evaluation_mode
    val = Dataset("file:///nowhere", (), (300, 900))
    assert evaluation_mode(TrainConfig(evaluation="ranks", num_workers=4), val) == "ranks"
    tiny = Dataset("file:///nowhere", (), (2, 1))
    with pytest.raises(ConfigError, match=r"3 row\(s\) for 4 ranks"):
        evaluation_mode(TrainConfig(evaluation="ranks", num_workers=4), tiny)
