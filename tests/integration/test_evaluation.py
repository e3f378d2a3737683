"""Where snapshots are evaluated: on the driver or on the ranks (each its share of the
validation row groups, merged), with the same metrics, the same best snapshot and the same
early stop either way (real Spark, local[2], digits)."""
from __future__ import annotations

import math

import pytest
import torch

from sparkddl import ConfigError, TorchEstimator
from sparkddl.fit import evaluation
from tests.integration.digits import digits_df, mlp

METRICS = ["accuracy", "f1", "auroc", "mcc"]


def _fit(df, store, **params):
    torch.manual_seed(0)
    base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                loss=torch.nn.CrossEntropyLoss(), featuresCol="features", labelCol="label",
                batchSize=32, epochs=4, numWorkers=2, validation="is_val", store=str(store),
                metrics=METRICS, progress=False, seed=3, bestBy="val_f1",
                earlyStoppingPatience=1)
    return TorchEstimator(**{**base, **params}).fit(df)


@pytest.fixture
def digits(spark_local):
    # a validation column: the split is the same rows whatever evaluates them
    return digits_df(spark_local).selectExpr("features", "label", "split = 0 AS is_val") \
        .repartition(6)


@pytest.mark.timeout(600)
def test_ranks_and_driver_give_the_same_metrics_best_snapshot_and_stop(digits, tmp_path,
                                                                     monkeypatch):
    on_driver = _fit(digits, tmp_path / "driver", evaluation="driver")
    driver_evaluate = evaluation.SnapshotEvaluator._evaluate

    def refuse(self, state):  # with evaluation="ranks" the driver reads no validation row
        raise AssertionError("the driver evaluated a snapshot")
    monkeypatch.setattr(evaluation.SnapshotEvaluator, "_evaluate", refuse)
    on_ranks = _fit(digits, tmp_path / "ranks", evaluation="ranks")
    monkeypatch.setattr(evaluation.SnapshotEvaluator, "_evaluate", driver_evaluate)
    assert_same_evaluation(on_driver, on_ranks)


def assert_same_evaluation(on_driver, other) -> None:
    """The same training, every metric the same, the same best snapshot and early stop."""
    assert len(other.history) == len(on_driver.history) >= 2
    keys = ["val_loss"] + [f"val_{m}" for m in METRICS]
    for a, b in zip(on_driver.history, other.history):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)  # same training
        for k in keys:
            assert math.isfinite(a[k]) and a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k
    assert all(r["val_time_s"] > 0 for r in on_driver.history + other.history)
    assert other.chosen_epoch == on_driver.chosen_epoch
    assert other.stopped_early == on_driver.stopped_early
    assert other.epochs_done == on_driver.epochs_done


@pytest.mark.timeout(120)
def test_ranks_evaluation_that_cannot_be_done_says_why(digits, tmp_path):
    from sparkddl.strategies.fsdp import fsdp_problem
    # a torch whose FSDP2 cannot train on CPU refuses the strategy itself, first
    refused = (r"evaluation='ranks' is not possible here: strategy 'fsdp'.*use "
               r"evaluation='driver'" if fsdp_problem("cpu") is None else
               r"strategy='fsdp' runs on CUDA only with torch")
    with pytest.raises(ConfigError, match=refused):
        _fit(digits, tmp_path, evaluation="ranks", strategy="fsdp", epochs=1)


@pytest.mark.timeout(600)
def test_a_spark_job_beside_the_fit_gives_the_driver_s_metrics(digits, tmp_path, monkeypatch,
                                                               caplog):
    import logging

    from sparkddl.fit import cluster_eval
    # one rank on local[2] leaves one slot free; the job is cut in 3 parts all the same
    # (queued on that slot) so that the driver merges several tasks' states
    on_driver = _fit(digits, tmp_path / "driver", evaluation="driver", numWorkers=1)
    monkeypatch.setattr(cluster_eval, "free_slots", lambda sc, n: 3)
    monkeypatch.setattr(evaluation.SnapshotEvaluator, "_evaluate",
                        lambda self, state: pytest.fail("the driver evaluated a snapshot"))
    with caplog.at_level(logging.INFO, logger="sparkddl"):
        on_cluster = _fit(digits, tmp_path / "cluster", evaluation="cluster", numWorkers=1)
    assert "each snapshot by a Spark job of 3 task(s) beside the fit" in caplog.text
    assert_same_evaluation(on_driver, on_cluster)


@pytest.mark.timeout(120)
def test_cluster_evaluation_without_free_slots_is_refused_before_any_work(digits, tmp_path):
    with pytest.raises(ConfigError, match=r"evaluation='cluster' needs executor slots the "
                                          r"fit's 2 ranks do not hold, and the cluster has 2"):
        _fit(digits, tmp_path, evaluation="cluster", epochs=1)
    assert not (tmp_path / "data").exists()  # refused before the data was prepared
