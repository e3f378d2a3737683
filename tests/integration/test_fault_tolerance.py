"""Restarts, resume, watchdog and channel safety, black-box, with real processes."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from sparkddl import ConfigError, TorchEstimator, TrainingFailedError
from sparkddl.channel import protocol
from sparkddl.launch import stage
from sparkddl.store import Store
from tests.integration.digits import digits_df, mlp

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 4
STEPS = 21  # digits with 20 % held out for validation: ~1380 rows / 2 ranks / 32 rows


class FailingLoss(torch.nn.Module):
    """Cross-entropy that fails on rank 1 at its ``at_step``-th step: while ``marker`` does
    not exist (first attempt only; it creates it), or always. ``how``: raise, exit (the
    Python worker), kill-executor (its executor JVM), hang."""

    def __init__(self, marker: str, at_step: int, how: str = "raise", always: bool = False):
        super().__init__()
        self.marker, self.at_step, self.how, self.always = marker, at_step, how, always
        self.calls = 0

    def forward(self, output, label):
        on_rank = os.environ.get("RANK") == "1"
        self.calls += on_rank
        if on_rank and self.calls == self.at_step and (self.always or
                                                       not os.path.exists(self.marker)):
            Path(self.marker).touch()
            if self.how == "exit":
                os._exit(3)
            if self.how == "kill-executor":
                kill_executor_jvm()
            if self.how == "hang":
                time.sleep(3600)
            raise RuntimeError(f"injected failure at step {self.at_step}")
        return torch.nn.functional.cross_entropy(output, label)


def kill_executor_jvm() -> None:
    """SIGKILL the executor JVM this Python worker runs under (worker <- daemon <- JVM)."""
    pid = os.getppid()
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
            time.sleep(3600)  # this worker goes down with its executor
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no executor JVM above this Python worker")


def estimator(root, loss, **params) -> TorchEstimator:
    """A digits fit that keeps its store in ``root / "store"``."""
    base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3), loss=loss,
                featuresCol="features", labelCol="label", batchSize=32, epochs=EPOCHS,
                numWorkers=2, validation=0.2, store=str(root / "store"), progress=False,
                maxRestarts=2)
    return TorchEstimator(**{**base, **params})


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One directory whose ``store`` every fit of this module uses: the digits are written
    to it once, and every later fit (a test's, or the driver-death test's second driver)
    reuses them (a data cache hit, as any fit after the first on the same data). Runs stay
    apart: each fit has its own run id; the injected failures' markers stay in tmp_path."""
    return tmp_path_factory.mktemp("fault-tolerance")


def assert_complete(model, epochs: int = EPOCHS, steps: int = STEPS) -> None:
    assert [r["epoch"] for r in model.history] == list(range(1, epochs + 1))
    assert all("val_loss" in r for r in model.history)
    assert model.steps_per_rank == [steps * epochs] * 2  # no step lost, none counted twice


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failed_rank_is_restarted_from_the_checkpoint(spark_local, shared, tmp_path, how):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=2 * STEPS + 5, how=how)  # in epoch 3
    model = estimator(shared, loss).fit(digits_df(spark_local))
    assert (tmp_path / "marker").exists()
    assert_complete(model)
    [restart] = model.restarts
    assert restart["resumed_from_epoch"] == 2 and restart["resumed_from_step"] == 0
    assert 0 < restart["steps_redone"] <= 5 + 2  # heartbeats are up to a second stale
    assert restart["recovery_s"] is not None and restart["recovery_s"] < 60
    assert [r["attempt"] for r in model.history] == [0, 0, 1, 1]


@pytest.mark.timeout(300)
def test_a_lost_executor_is_restarted_from_the_checkpoint(spark_cluster, shared, tmp_path):
    """local-cluster: rank 1's whole executor JVM is killed; its worker starts a new one."""
    marker = tmp_path / "marker"
    loss = FailingLoss(str(marker), at_step=2 * STEPS + 5, how="kill-executor")
    model = estimator(shared, loss).fit(digits_df(spark_cluster))
    assert marker.exists()
    assert_complete(model)
    [restart] = model.restarts
    assert restart["resumed_from_epoch"] == 2 and restart["resumed_from_step"] == 0
    assert [r["attempt"] for r in model.history] == [0, 0, 1, 1]
    # the rank that died is named first (with Spark's ExecutorLostFailure when Spark said it
    # before the stage was cancelled), ahead of its peer's broken allreduce
    assert "First: rank 1: " in restart["reason"], restart["reason"]


@pytest.mark.timeout(300)
def test_resume_inside_an_epoch_from_a_step_checkpoint(spark_local, shared, tmp_path,
                                                       mlflow_store):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=STEPS + 12)
    model = estimator(shared, loss, checkpointEverySteps=5,
                      mlflow=True).fit(digits_df(spark_local))
    assert_complete(model)
    [restart] = model.restarts
    # checkpoints every 5 steps of the run: the last before global step 33 is step 30, which
    # is step 9 of epoch 2
    assert (restart["resumed_from_epoch"], restart["resumed_from_step"]) == (1, 30 - STEPS)
    assert restart["steps_redone"] == 2  # steps 31 and 32; step 33 failed
    assert [r["attempt"] for r in model.history] == [0, 1, 1, 1]
    # MLflow: the restart as a tag; the curves have every epoch once the fit is done
    import mlflow
    [run] = mlflow.search_runs(output_format="list")
    assert run.data.tags["sparkddl.restart.0"].startswith(restart["reason"][:50])
    assert f"resumed from epoch 1 step {30 - STEPS}" in run.data.tags["sparkddl.restart.0"]
    assert run.data.tags["sparkddl.restarts"] == "1"
    history = mlflow_store.get_metric_history(run.info.run_id, "attempt")
    assert {m.step: m.value for m in history} == {1: 0, 2: 1, 3: 1, 4: 1}


@pytest.mark.timeout(300)
def test_without_checkpoints_a_restart_starts_over_and_forgets_the_failed_attempt(
        spark_local, shared, tmp_path):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=2 * STEPS + 5)
    model = estimator(shared, loss, checkpointEvery=0).fit(digits_df(spark_local))
    assert_complete(model)
    [restart] = model.restarts
    assert (restart["resumed_from_epoch"], restart["resumed_from_step"]) == (0, 0)
    assert restart["steps_redone"] == 2 * STEPS + 4
    assert [r["attempt"] for r in model.history] == [1, 1, 1, 1]  # epochs 1-2 of attempt 0 gone


class HangingModel:
    """A model factory that hangs on rank 1 before training starts (first attempt only)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self) -> torch.nn.Module:
        if os.environ.get("RANK") == "1" and not os.path.exists(self.marker):
            Path(self.marker).touch()
            time.sleep(3600)
        return mlp()


@pytest.mark.timeout(300)
def test_watchdog_catches_a_rank_stuck_before_its_first_step(spark_local, shared, tmp_path):
    model = estimator(shared, "cross_entropy", model=HangingModel(str(tmp_path / "marker")),
                      watchdogTimeout=4.0).fit(digits_df(spark_local))
    assert_complete(model)
    [restart] = model.restarts
    # rank 0 waits for rank 1 in DDP's first broadcast: only rank 1 is named as the cause
    assert restart["reason"].startswith("watchdog: no progress for 4s; likely cause: rank 1 "
                                        "at step 0 (building the model), not inside a "
                                        "collective")
    assert "rank 0" not in restart["reason"]


@pytest.mark.timeout(300)
def test_a_failure_that_repeats_ends_the_fit_at_its_first_repeat(spark_local, shared,
                                                                 tmp_path):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=3, always=True)
    with pytest.raises(TrainingFailedError) as info:
        estimator(shared, loss, maxRestarts=2).fit(digits_df(spark_local))
    err = info.value
    assert err.attempts == 2 and 1 in err.ranks
    assert "not retried: attempt 0 failed the same way: RuntimeError: injected failure at " \
           "step 3" in str(err)
    assert "Traceback" in str(err)


@pytest.mark.timeout(300)
def test_watchdog_turns_a_stuck_rank_into_a_restart(spark_local, shared, tmp_path, caplog):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=20, how="hang")
    with caplog.at_level(logging.WARNING, logger="sparkddl.launch.stage"):
        model = estimator(shared, loss, watchdogTimeout=4.0).fit(digits_df(spark_local))
    # the report carries the stuck rank's Python stack: where it is, not only its phase
    [report] = [r.getMessage() for r in caplog.records
                if r.name == "sparkddl.launch.stage" and "watchdog" in r.getMessage()]
    stack = report.split("Python stacks of rank 1:", 1)[1]
    assert 'Thread "MainThread"' in stack and "in forward" in stack and "time.sleep" in stack
    assert_complete(model)
    assert len(model.restarts) == 1, model.restarts
    [restart] = model.restarts
    # rank 0 waits in DDP's allreduce inside backward; rank 1 hangs in its loss
    assert restart["reason"].startswith("watchdog: no progress for 4s; likely cause: rank 1 "
                                        "at step 19 (computing the loss, epoch 1 step 20), "
                                        "not inside a collective")
    assert "rank 0" not in restart["reason"]


@pytest.mark.timeout(300)
def test_a_resume_refuses_another_layout_and_skips_a_truncated_latest_checkpoint(
        spark_local, shared, caplog):
    """One run, resumed twice: with another layout (refused), then after its latest
    checkpoint was cut short (it falls back to the previous one)."""
    df = digits_df(spark_local)
    first = estimator(shared, "cross_entropy", epochs=3, runId="run-resumes").fit(df)
    with pytest.raises(ConfigError, match=r"run run-resumes cannot be resumed with a different "
                                          r"setup \(numWorkers 2 -> 1"):
        estimator(shared, "cross_entropy", epochs=3, runId="run-resumes", numWorkers=1).fit(df)
    store = Store.from_uri(shared / "store")
    ckpts = sorted(store.listdir(store.run_url(first.run_id, "checkpoints")))
    assert "ckpt-00002-00000000.pt" in ckpts
    latest = Path(store.fs_path(store.run_url(first.run_id, "checkpoints",
                                              "ckpt-00002-00000000.pt")))
    latest.write_bytes(latest.read_bytes()[:1000])  # a crash in the middle of a write
    with caplog.at_level(logging.WARNING, logger="sparkddl.checkpoint"):
        resumed = estimator(shared, "cross_entropy", epochs=5, runId="run-resumes").fit(df)
    assert "skipping checkpoint" in caplog.text and "is truncated" in caplog.text
    assert_complete(resumed, 5)
    assert [r["attempt"] for r in resumed.history] == [0, 0, 0, 0, 0]
    assert resumed.history[0] == first.history[0]  # epoch 1 kept from the first fit


DRIVER = """
import sys
sys.path.insert(0, {root!r})
from tests.conftest import spark_session
from tests.integration.digits import digits_df
from tests.integration.test_fault_tolerance import estimator, SlowLoss
spark = spark_session("local[2]")
estimator(__import__("pathlib").Path({tmp!r}), SlowLoss(), epochs=6, runId="run-driver").fit(
    digits_df(spark))
"""


class SlowLoss(torch.nn.Module):
    """Cross-entropy that takes ``seconds`` a step."""

    def __init__(self, seconds: float = 0.05):
        super().__init__()
        self.seconds = seconds

    def forward(self, output, label):
        time.sleep(self.seconds)
        return torch.nn.functional.cross_entropy(output, label)


@pytest.mark.timeout(400)
def test_a_run_resumes_after_its_driver_died(spark_local, shared):
    """The first driver (its own process and JVM) trains with slow steps, so that it is
    killed mid-training, 4 epochs (over 4 s) before its end; it finds the digits already in
    the shared store. The second resumes the run; how fast its steps are does not matter."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT),
                                                                 tmp=str(shared))],
                            cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    run_dir = shared / "store" / "runs" / "run-driver"
    ckpt = run_dir / "checkpoints" / "driver-00002.pt"
    try:
        deadline = time.time() + 200
        while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert ckpt.exists(), "the first driver never wrote its second checkpoint"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM die mid-training
        proc.wait(30)
    # a fit writes its history when it ends, whichever way: the first one never did
    assert not (run_dir / "history.json").exists(), "the first driver ended before its kill"
    model = estimator(shared, "cross_entropy", epochs=6, runId="run-driver").fit(
        digits_df(spark_local))
    assert model.run_id == "run-driver"
    assert_complete(model, 6)
    assert model.history[0]["attempt"] == 0 and model.history[1]["val_loss"] > 0


def attack(found: dict, done: threading.Event) -> None:
    """While a fit runs: connect without the secret, then with it but an oversized frame."""
    deadline = time.time() + 60
    while not stage.OPEN_CHANNELS and time.time() < deadline:
        time.sleep(0.02)
    channel = next(iter(stage.OPEN_CHANNELS))
    time.sleep(1.0)  # let the ranks connect first: intruders must not disturb them
    found["channel"], found["secret"] = channel, channel.secret
    with socket.create_connection(("127.0.0.1", channel.port)) as s:
        try:
            protocol.client_handshake(s, protocol.new_secret())
        except (protocol.ProtocolError, OSError):
            pass
    with socket.create_connection(("127.0.0.1", channel.port)) as s:
        protocol.client_handshake(s, channel.secret)
        protocol.send_frame(s, {"type": "hello", "rank": 0})
        s.sendall(struct.pack(">I", 20) + b'{"type":"snapshot",')  # an unterminated header
        s.sendall(b'"size":99999999999}')
        time.sleep(0.5)
    done.set()


@pytest.mark.timeout(300)
def test_channel_rejects_intruders_and_training_goes_on(spark_local, shared, caplog, capfd):
    found: dict = {}
    done = threading.Event()
    thread = threading.Thread(target=attack, args=(found, done), daemon=True)
    thread.start()
    # slow steps: the fit (3 x 87 steps of 20 ms, over 5 s) outlasts the attack (1.5 s from
    # the channel's opening)
    with caplog.at_level(logging.DEBUG):
        model = estimator(shared, SlowLoss(0.02), epochs=3, batchSize=8).fit(
            digits_df(spark_local))
    thread.join(30)
    assert done.is_set()
    assert found["channel"].rejected >= 2
    # batches of 8: the plan's steps per epoch (row groups decide how the rows fall to ranks)
    run = json.loads((shared / "store" / "runs" / model.run_id / "run.json").read_text())
    assert 4 * STEPS <= run["steps_per_epoch"] <= 4 * STEPS + 3
    assert_complete(model, 3, steps=run["steps_per_epoch"])
    captured = capfd.readouterr()
    everything = caplog.text + captured.out + captured.err
    assert found["secret"] not in everything  # the run's secret never reaches a log


@pytest.mark.timeout(300)
def test_a_hang_is_retried_once(spark_local, shared, tmp_path):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=5, how="hang", always=True)
    with pytest.raises(TrainingFailedError) as info:
        estimator(shared, loss, watchdogTimeout=3.0, maxRestarts=5).fit(
            digits_df(spark_local))
    assert info.value.attempts == 2
    assert str(info.value).startswith("watchdog: no progress for 3s; likely cause: rank 1")
    assert "(not retried: attempt 0 hung too; a hang is retried once)" in str(info.value)
