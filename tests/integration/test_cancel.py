"""A cancel is a stop: a user's cancel (cancelAllJobs, the caller's job group, a
KeyboardInterrupt) ends the fit or run with JobCancelledError within seconds, nothing keeps
running, and the last checkpoint resumes the run with every epoch exactly once."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from sparkddl import JobCancelledError, TorchEstimator, run
from sparkddl.launch import stage
from tests.integration.digits import digits_df, mlp

EPOCHS = 8
STEPS = 21  # digits, 20 % held out, 2 ranks, batch 32
CANCEL_AT_EPOCH = 3
# how long the checkpoints of a cancelled run must stay as they are once the fit returned
QUIET_S = 2.0


class SlowLoss(torch.nn.Module):
    """Cross-entropy that takes 10 ms a step, so a cancel lands mid-fit."""

    def forward(self, output, label):
        time.sleep(0.01)
        return torch.nn.functional.cross_entropy(output, label)


class CancelAt:
    """Driver callback: at the end of ``epoch``, cancel as a user would (``how``)."""

    def __init__(self, spark, how: str, epoch: int = CANCEL_AT_EPOCH):
        self.spark, self.how, self.epoch = spark, how, epoch
        self.at: float | None = None

    def on_epoch_end(self, row):
        if row["epoch"] == self.epoch and self.at is None:
            self.at = time.monotonic()
            if self.how == "all":
                self.spark.sparkContext.cancelAllJobs()
            elif self.how == "group":
                self.spark.sparkContext.cancelJobGroup("users-notebook-cell")
            else:  # a notebook's interrupt: KeyboardInterrupt in the driver's main thread
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def estimator(tmp_path, **params) -> TorchEstimator:
    base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                loss=SlowLoss(), featuresCol="features", labelCol="label", batchSize=32,
                epochs=EPOCHS, numWorkers=2, validation=0.2, store=str(tmp_path / "store"),
                progress=False, maxRestarts=2)
    return TorchEstimator(**{**base, **params})


def assert_nothing_left(spark) -> None:
    assert not list(stage.OPEN_CHANNELS), "a stage's channel is still open"
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 10
    while tracker.getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveStageIds(), "Spark still runs a stage after the cancel"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The directory of the store the cancel tests share: the digits are written to it once;
    each cancelled fit is a run of its own."""
    return tmp_path_factory.mktemp("cancel")


def cancelled_fit(spark, tmp_path, how: str) -> tuple[float, str, JobCancelledError]:
    """Fit until the callback cancels; (seconds from the cancel to the error, run id, error).
    The fit's store is ``tmp_path / "store"``; runs there before it are not its own."""
    runs_dir = tmp_path / "store" / "runs"
    earlier = set(os.listdir(runs_dir)) if runs_dir.exists() else set()
    cb = CancelAt(spark, how)
    df = digits_df(spark)
    sc = spark.sparkContext
    if how == "group":
        sc.setJobGroup("users-notebook-cell", "a notebook cell", interruptOnCancel=True)
    try:
        with pytest.raises(JobCancelledError) as info:
            estimator(tmp_path, callbacks=[cb]).fit(df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert cb.at is not None, "the fit ended before the cancel"
    took = time.monotonic() - cb.at
    runs = sorted(set(os.listdir(runs_dir)) - earlier)
    assert len(runs) == 1  # the cancelled fit's run is kept
    return took, runs[0], info.value


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["all", "group", "interrupt"])
def test_a_cancel_stops_the_fit_and_the_run_resumes_from_its_last_checkpoint(
        spark_local, shared, how):
    took, run_id, err = cancelled_fit(spark_local, shared, how)
    assert took < 15, f"the fit took {took:.1f}s to stop after the cancel"
    message = str(err)
    assert f"runId={run_id!r}" in message and "is kept" in message, message
    assert_nothing_left(spark_local)
    # nothing wrote after the fit returned: the cancelled ranks are gone (ranks still
    # training would write a checkpoint every epoch, a third of a second)
    ckpts = shared / "store" / "runs" / run_id / "checkpoints"
    before = sorted(os.listdir(ckpts))
    time.sleep(QUIET_S)
    assert sorted(os.listdir(ckpts)) == before
    model = estimator(shared, runId=run_id).fit(digits_df(spark_local))
    assert [r["epoch"] for r in model.history] == list(range(1, EPOCHS + 1))
    assert model.steps_per_rank == [STEPS * EPOCHS] * 2
    assert model.restarts == []


def cancel_once_running(spark, started: Path, ranks: int, stop: threading.Event) -> None:
    """cancelAllJobs once every rank has said (a file in ``started``) that it runs."""
    deadline = time.monotonic() + 60
    while len(os.listdir(started)) < ranks and time.monotonic() < deadline:
        if stop.wait(0.05):
            return
    spark.sparkContext.cancelAllJobs()


@pytest.mark.timeout(120)
def test_a_cancel_stops_sparkddl_run(spark_local, tmp_path):
    started_dir = tmp_path / "started"
    started_dir.mkdir()

    def slow(seconds, started):
        (started / os.environ["RANK"]).touch()  # the cancel comes while every rank sleeps
        time.sleep(seconds)
        return 1

    stop = threading.Event()
    canceller = threading.Thread(target=cancel_once_running,
                                 args=(spark_local, started_dir, 2, stop), daemon=True)
    canceller.start()
    began = time.monotonic()
    try:
        with pytest.raises(JobCancelledError, match="cancelled as part of cancellation of "
                                                    "all jobs"):
            run(slow, 120, started_dir, num_workers=2)
    finally:
        stop.set()
        canceller.join(10)
    assert sorted(os.listdir(started_dir)) == ["0", "1"]  # both ranks ran before the cancel
    assert time.monotonic() - began < 25  # startup, the cancel, and the ranks' end
    assert_nothing_left(spark_local)
