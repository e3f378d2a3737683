"""What an adversary tried, through the public API on real Spark: each ends in a sparkddl
error naming the culprit (file, value, column, rank and how it died), within seconds, and
leaves the session and its Python workers usable."""
from __future__ import annotations

import ctypes
import faulthandler
import os
import posix
import shutil
import signal
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import sparkddl
from sparkddl import (CheckpointError, ConfigError, DataError, SparkDDLError, StoreError,
                      TorchEstimator, TorchModel, TrainingFailedError, UntrustedArtifactError,
                      checkpoint)
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
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(SAVED_DAMAGE))
def test_a_damaged_saved_model_is_a_store_error_naming_the_file(spark_local, saved_digits_model,
                                                                 tmp_path, case):
    saved = saved_digits_model
    damage, error, pattern = SAVED_DAMAGE[case]
    with pytest.raises(error, match=pattern):
        TorchModel.load(_damaged(saved, tmp_path, damage))


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
    with pytest.raises(Exception, match=r"feature column 'features' has \d+ null row"):
        model.transform(nulls).select("prediction").collect()
    short = df.selectExpr("slice(features, 1, 32) AS features")
    with pytest.raises(Exception, match=r"Expected input at .*64, but got 32|"
                                        r"has 32 value\(s\) per row; the model takes 64"):
        model.transform(short).select("prediction").collect()
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
