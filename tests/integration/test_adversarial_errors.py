"""What an adversary tried, through the public API on real Spark: each ends in a sparkddl
error naming the culprit (file, value, column, rank and how it died), within seconds, and
leaves the session and its Python workers usable."""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import posix
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import sparkddl
import sparkddl.data
from sparkddl import (
    CheckpointError,
    ClusterError,
    ConfigError,
    DataError,
    SparkDDLError,
    StoreError,
    TorchEstimator,
    TorchModel,
    TrainingFailedError,
    UntrustedArtifactError,
    checkpoint,
)
from sparkddl.store import Store
from tests.conftest import LOCAL, spark_session
from tests.integration.digits import digits_df, mlp


def estimator(tmp_path, **params) -> TorchEstimator:
    base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                loss="cross_entropy", featuresCol="features", labelCol="label", batchSize=32,
                epochs=2, numWorkers=2, store=str(tmp_path / "store"), progress=False,
                maxRestarts=0)
    return TorchEstimator(**{**base, **params})


# ---- checkpoints, config, data: refused on the driver before any rank runs ----

class Planted:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["all broken", "tampered driver state"])
def test_a_resume_that_cannot_resume_stops_before_training(spark_local, tmp_path, damage):
    store = Store.from_uri(tmp_path / "store")
    refs = [checkpoint.save(store, "run-x", e, 0, {"model": {"w": torch.ones(1)}}, keep=3)
            for e in (1, 2)]
    if damage == "all broken":
        for ref in refs:
            store.write_bytes(ref.url, store.read_bytes(ref.url)[:-5])
        culprits = [ref.url for ref in refs]
    else:  # a file with a valid checksum whose payload would run code
        url = checkpoint.driver_state_url(store, "run-x", 2)
        store.write_bytes(url, checkpoint.encode({"rows": [Planted(str(tmp_path / "ran"))]}))
        culprits = [url]
    started = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        estimator(tmp_path, runId="run-x").fit(digits_df(spark_local))
    assert time.monotonic() - started < 30
    assert all(c in str(info.value) for c in culprits)
    assert "weights_only" not in str(info.value) and not (tmp_path / "ran").exists()


@pytest.mark.timeout(60)
def test_validation_out_of_range_is_a_config_error(spark_local, tmp_path):
    with pytest.raises(ConfigError, match=r"validation=1\.5 .* strictly between 0 and 1"):
        estimator(tmp_path, validation=1.5).fit(digits_df(spark_local))


@pytest.mark.timeout(120)
def test_a_truncated_part_file_of_a_table_read_in_place_is_named(spark_local, tmp_path):
    table = tmp_path / "table"
    table.mkdir()
    for i in range(4):
        ids = np.arange(i * 200, (i + 1) * 200)
        pq.write_table(pa.table({"features": [[float(v)] * 64 for v in ids],
                                 "label": (ids % 10).astype(np.int64)}),
                       table / f"part-{i:05d}.parquet")
    df = spark_local.read.parquet(str(table))  # Spark reads one footer for the schema
    bad = table / "part-00002.parquet"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(DataError) as info:
        estimator(tmp_path).fit(df)
    assert str(bad) in str(info.value) and "Repair or rewrite the table" in str(info.value)


# ---- saved models and transform ----

@pytest.mark.timeout(60)
def test_loading_a_model_from_a_missing_path_names_it(spark_local, tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(StoreError, match=rf"{missing}.* does not exist"):
        TorchModel.load(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match=r"empty.* not a saved model"):
        TorchModel.load(str(tmp_path / "empty"))


@pytest.mark.timeout(60)
def test_transform_without_the_feature_column_names_it_and_the_columns_present(spark_local):
    model = TorchModel()
    model._set(featuresCol="pixels")
    df = spark_local.createDataFrame([(1.0, 2)], "features double, label int")
    with pytest.raises(DataError) as info:
        model.transform(df)
    assert "no column 'pixels'" in str(info.value)
    assert "features, label" in str(info.value)


@pytest.fixture(scope="module")
def saved_digits_model(tmp_path_factory):
    """A fitted digits model saved once (a folder: it outlives the session); tests damage
    copies of it."""
    tmp = tmp_path_factory.mktemp("saved")
    model = estimator(tmp, epochs=1, numWorkers=1).fit(digits_df(spark_session(LOCAL)))
    model.save(str(tmp / "model"))
    return tmp / "model"


def _damaged(saved, tmp_path, damage) -> str:
    copy = tmp_path / "model"
    shutil.copytree(saved, copy)
    damage(copy)
    return str(copy)


def _other_weights(folder) -> None:
    other = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    torch.save(other.state_dict(), folder / "weights.pt")


def _metadata_not_json(folder) -> None:
    for crc in (folder / "metadata").glob(".*.crc"):
        crc.unlink()
    next((folder / "metadata").glob("part-*")).write_text("{oops")


def _metadata_without(key: str):
    def damage(folder) -> None:
        for crc in (folder / "metadata").glob(".*.crc"):
            crc.unlink()
        part = next((folder / "metadata").glob("part-*"))
        meta = json.loads(part.read_text())
        del meta[key]
        part.write_text(json.dumps(meta))
    return damage


SAVED_DAMAGE = {
    "weights.pt deleted": (lambda d: (d / "weights.pt").unlink(),
                           StoreError, r"lacks weights\.pt"),
    # without its program, a model saved from a notebook needs trust: both are said
    "program.json deleted": (lambda d: (d / "program.json").unlink(), SparkDDLError,
                             r"trusted=True.*saved with program\.json, .*but that file is "
                             r"missing"),
    "history.json deleted": (lambda d: (d / "history.json").unlink(),
                             StoreError, r"lacks history\.json"),
    "weights.pt truncated": (lambda d: (d / "weights.pt").write_bytes(
        (d / "weights.pt").read_bytes()[:200]), UntrustedArtifactError,
        r"weights\.pt is not readable torch\.save data"),
    "weights of another model": (_other_weights, StoreError,
                                 r"weights\.pt does not fit its architecture \(ValueError: weight "
                                 r"'0\.weight' is torch\.float32 \[32, 64\]"),
    # Hadoop's local filesystem checks the .crc beside it: an editor leaves it stale
    "metadata edited": (lambda d: next((d / "metadata").glob("part-*")).write_text("{oops"),
                        StoreError, r"its metadata/ cannot be read.*Checksum error"),
    "metadata not JSON": (_metadata_not_json, StoreError,
                          r"its metadata/ cannot be read.*JSONDecodeError"),
    "metadata without a field": (_metadata_without("run_id"), StoreError,
                                 r"its metadata lacks run_id, which model\.save\(\) writes"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(SAVED_DAMAGE))
def test_a_damaged_saved_model_is_a_store_error_naming_the_file(spark_local, saved_digits_model,
                                                                 tmp_path, case):
    saved = saved_digits_model
    damage, error, pattern = SAVED_DAMAGE[case]
    with pytest.raises(error, match=pattern):
        TorchModel.load(_damaged(saved, tmp_path, damage))


def _executor_failure(frame) -> str:
    """The message of the failed job that collecting ``frame`` raises. Spark 4.0 may hand the
    next task an idle Python worker whose channel closed when the previous job's task failed
    (java.nio.channels.ClosedChannelException at PythonWorker.refresh, seen once here): that
    is Spark's pool, not the input, so the job is run once more then."""
    for _attempt in range(2):
        with pytest.raises(Exception) as failed:
            frame.collect()
        text = str(failed.value)
        if "ClosedChannelException" not in text or "PythonWorker.refresh" not in text:
            return text
    return text


@pytest.mark.timeout(120)
def test_transform_input_problems_are_named(saved_digits_model, spark_local):
    df = digits_df(spark_local)
    model = TorchModel.load(str(saved_digits_model))
    strings = df.selectExpr("transform(features, x -> concat('px', x)) AS features")
    with pytest.raises(DataError, match=r"feature column 'features' is array<string>"):
        model.transform(strings)
    with pytest.raises(ConfigError, match=r"inferenceBatchSize must be an integer >= 1"):
        model.copy({model.inferenceBatchSize: 0}).transform(df)
    with pytest.raises(ConfigError, match=r"no model to run"):
        TorchModel().transform(df)
    # what only the rows show is named by the executors, with the column and the fix
    nulls = df.selectExpr("IF(label = 3, NULL, features) AS features")
    assert re.search(r"feature column 'features' has \d+ null row",
                     _executor_failure(model.transform(nulls).select("prediction")))
    short = df.selectExpr("slice(features, 1, 32) AS features")
    assert re.search(r"feature column 'features' has 32 value\(s\) per row; the model takes 64",
                     _executor_failure(model.transform(short).select("prediction")))
    # the session's Python workers still predict
    assert model.transform(df.limit(5)).select("prediction").count() == 5


# ---- ranks that end the process: sys.exit, os._exit, fatal signals ----

def die(how: str) -> None:
    import torch.distributed as dist
    sparkddl.init_process_group(timeout_s=1800)
    if dist.get_rank() == 1:
        if how == "sys.exit":
            sys.exit(3)
        if how == "os._exit":
            os._exit(9)
        if how == "segfault":
            ctypes.string_at(0)
        if how == "kill -SEGV":
            os.kill(os.getpid(), signal.SIGSEGV)
    dist.all_reduce(torch.ones(1))  # rank 0 waits here until the stage is cancelled


def worker_state(_: int) -> tuple[bool, bool]:
    return os._exit is posix._exit, faulthandler.is_enabled()


DEATHS = {"sys.exit": "exited with code 3 (sys.exit(3) ", "os._exit": "called os._exit(9)",
          "segfault": "killed by signal SIGSEGV (11) in string_at",
          "kill -SEGV": "killed by signal SIGSEGV (11) in die"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", list(DEATHS))
def test_a_rank_that_ends_its_process_is_named_with_how(spark_local, how):
    check_named(spark_local, how, DEATHS[how])


@pytest.mark.timeout(120)
def test_a_segfault_on_an_executor_of_its_own_is_named(spark_cluster):
    check_named(spark_cluster, "segfault", DEATHS["segfault"])


def check_named(spark, how: str, said: str) -> None:
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        sparkddl.run(die, how, num_workers=2, spark=spark)
    assert time.monotonic() - started < 60  # not the collective's 30 minutes
    first = info.value.failures[0]
    assert first.rank == 1 and said in first.message, str(info.value)
    assert first.host  # the executor's address
    assert "die" in first.traceback  # the Python stack, down to the user's function
    # the session and its reused workers are as they were: os._exit and faulthandler too
    states = spark.sparkContext.parallelize(range(4), 2).map(worker_state).collect()
    assert states == [(True, False)] * 4
    assert sparkddl.run(sum, [1, 2], num_workers=2, spark=spark) == 3


# ---- stores that fill up, slots that are busy, one run id fitted twice ----

@pytest.mark.timeout(240)
def test_a_store_that_fills_up_during_materialization_names_the_file_and_keeps_nothing(
        spark_local, tmp_path):
    from tests.unit.store.tmpfs import free, small_filesystem
    rng = np.random.default_rng(0)
    rows = [(rng.random(256).astype(float).tolist(), int(i % 10)) for i in range(4000)]
    df = spark_local.createDataFrame(rows, "features array<double>, label long")  # ~8 MB
    with small_filesystem(tmp_path, "2m") as mnt:
        empty = free(mnt)
        with pytest.raises(StoreError, match=r"cannot write .*part-.*\.parquet: ENOSPC .* free "
                                             r"of .*point the `store` option"):
            sparkddl.data.prepare(df, sparkddl.data.DataSpec.of("features", "label"),
                                  num_workers=2, batch_size=32, store=str(mnt / "store"))
        data = mnt / "store" / "data"
        left = [p for p in data.rglob("*") if p.is_file()] if data.exists() else []
        assert left == [] and free(mnt) >= empty - (64 << 10)  # no parts, no meta.json
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        again = sparkddl.data.prepare(df, sparkddl.data.DataSpec.of("features", "label"),
                                      num_workers=2, batch_size=32, store=str(mnt / "store"))
        assert not again.cache_hit and again.train.rows == 4000


class ReadOnlyAfter:
    """Remounts the store's filesystem read-only once ``epoch`` has ended (a driver
    callback, so the ranks meet it at their next write: the epoch's checkpoint)."""

    def __init__(self, mnt, epoch: int):
        self.mnt, self.epoch = mnt, epoch

    def on_epoch_end(self, row):
        if row["epoch"] == self.epoch:
            subprocess.run(["mount", "-o", "remount,ro", str(self.mnt)], check=True, timeout=30)


@pytest.mark.timeout(240)
def test_a_store_that_turns_read_only_after_two_epochs_leads_with_the_store_error(
        spark_local, tmp_path):
    from tests.unit.store.tmpfs import small_filesystem
    with small_filesystem(tmp_path, "64m") as mnt:
        fit = estimator(mnt, epochs=4, maxRestarts=2, runId="ro",
                        callbacks=[ReadOnlyAfter(mnt, 2)])
        with pytest.raises(TrainingFailedError) as info:
            fit.fit(digits_df(spark_local))
        first = str(info.value).splitlines()[0]
    # the ranks' StoreError first, with when it came and where the run can resume from;
    # not "every rank failed the same way before its first step". The callback runs on the
    # driver while the ranks go on: the first write to fail is the checkpoint of epoch 2 or 3
    found = re.match(r"rank \d could not write to the store while writing a checkpoint in "
                     r"epoch ([23]) \(step \d+ of the run\): the checkpoint at epoch \1, step 0 of "
                     r"run ro was not written .*: cannot write .*: EROFS \(Read-only file "
                     r"system\).*remount it read-write .* a fit with runId='ro' resumes from the "
                     r"newest \(not retried: a relaunch would meet the same store\)", first)
    assert found, first
    assert "before its first step" not in first
    assert info.value.attempts == 1


def hold_slots(spark, group: str, seconds: float) -> None:
    """A job of this application that holds both slots for ``seconds``. Its tasks sleep in
    the JVM (Thread.sleep through reflect), not in Python workers: the cancel interrupts the
    sleep and kills no Python worker, so the run after it needs no fresh ones (~5 s)."""
    spark.sparkContext.setJobGroup(group, "holds every slot", interruptOnCancel=True)
    try:
        spark.range(0, 2, 1, 2).selectExpr(
            f"reflect('java.lang.Thread', 'sleep', bigint({int(seconds * 1000)}))").collect()
    except Exception:  # noqa: BLE001 - cancelled below
        pass


@pytest.mark.timeout(120)
def test_a_fit_waiting_for_busy_slots_says_so_and_ends_at_slot_wait_timeout(spark_local,
                                                                            tmp_path, caplog,
                                                                            monkeypatch):
    import logging
    import threading
    monkeypatch.setattr("sparkddl.launch.stage.SLOT_NOTICE_S", 1.0)
    table = str(tmp_path / "digits")
    digits_df(spark_local).write.parquet(table)
    df = spark_local.read.parquet(table)  # read in place: no Spark job before the stage
    holder = threading.Thread(target=hold_slots, args=(spark_local, "busy-slots", 90))
    holder.start()
    try:
        deadline = time.monotonic() + 30
        tracker = spark_local.sparkContext.statusTracker()
        while not tracker.getActiveStageIds() and time.monotonic() < deadline:
            time.sleep(0.2)
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="sparkddl"):
            with pytest.raises(ClusterError, match=r"0 of 2 tasks of run .* have a slot after "
                                                   r"\d+s.*slotWaitTimeout=4s"):
                estimator(tmp_path, slotWaitTimeout=4.0).fit(df)
        assert time.monotonic() - started < 45
        assert "task slots are free at once (other jobs hold them?)" in caplog.text
    finally:
        spark_local.sparkContext.cancelJobGroup("busy-slots")
        holder.join(30)
    assert sparkddl.run(sum, [1, 2], num_workers=2, spark=spark_local) == 3


@pytest.mark.timeout(180)
def test_two_fits_of_one_run_id_at_once_are_refused(spark_local, tmp_path):
    import threading
    store = Store.from_uri(tmp_path / "store")
    active = store.fs_path(store.run_url("same", "active.json"))
    first: dict = {}

    def fit_first() -> None:
        try:
            first["model"] = estimator(tmp_path, runId="same", numWorkers=1,
                                       epochs=6).fit(digits_df(spark_local))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            first["error"] = exc

    thread = threading.Thread(target=fit_first)
    thread.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(active) and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(ConfigError, match=r"run 'same' is being fitted by another fit"):
        estimator(tmp_path, runId="same", numWorkers=1).fit(digits_df(spark_local))
    thread.join(150)
    assert "error" not in first and first["model"].epochs_done == 6
    assert not os.path.exists(active)
