"""A KeyboardInterrupt from a callback is a cancel: the fit stops within seconds with
JobCancelledError (as after Ctrl-C), no later epoch is trained, no restart starts, and nothing
keeps running. Before, it killed the driver's evaluator thread and the fit trained on blind."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from sparkddl import JobCancelledError
from tests.integration.digits import digits_df
from tests.integration.test_cancel import EPOCHS, assert_nothing_left, estimator

INTERRUPT_AT_EPOCH = 2


class SlowerLoss(torch.nn.Module):
    """Cross-entropy that takes 30 ms a step (about 0.7 s an epoch), so that the ranks are
    mid-fit when the callback raises and an epoch more would show."""

    def forward(self, output, label):
        time.sleep(0.03)
        return torch.nn.functional.cross_entropy(output, label)


class InterruptAt:
    """Driver callback: a KeyboardInterrupt at the end of ``epoch``, as a user's own stop."""

    def __init__(self, epoch: int = INTERRUPT_AT_EPOCH):
        self.epoch = epoch
        self.seen: list[int] = []
        self.at: float | None = None

    def on_epoch_end(self, row):
        self.seen.append(int(row["epoch"]))
        if row["epoch"] == self.epoch:
            self.at = time.monotonic()
            raise KeyboardInterrupt


@pytest.mark.timeout(300)
def test_a_keyboard_interrupt_from_a_callback_cancels_the_fit(spark_local, tmp_path):
    cb = InterruptAt()
    with pytest.raises(JobCancelledError) as info:
        estimator(tmp_path, callbacks=[cb], loss=SlowerLoss()).fit(digits_df(spark_local))
    assert cb.at is not None, "the fit ended before the callback raised"
    took = time.monotonic() - cb.at
    assert took < 15, f"the fit took {took:.1f}s to stop after the callback's interrupt"
    message = str(info.value)
    assert "callback InterruptAt.on_epoch_end raised KeyboardInterrupt" in message, message
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    (run_id,) = os.listdir(tmp_path / "store" / "runs")
    assert f"runId={run_id!r}" in message, message
    # the callbacks were not called again, and the ranks trained no further epoch
    assert cb.seen == list(range(1, INTERRUPT_AT_EPOCH + 1))
    history = json.loads((tmp_path / "store" / "runs" / run_id / "history.json").read_text())
    trained = [row["epoch"] for row in history]
    assert trained and max(trained) <= INTERRUPT_AT_EPOCH + 1 < EPOCHS, trained
    assert_nothing_left(spark_local)
