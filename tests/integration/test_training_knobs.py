"""The training loop's knobs on real Spark (local[2]) with scikit-learn's digits: schedules,
mixed precision, accumulation, clipping, callbacks, custom steps, several labels, sample
weights and non-finite losses; each changes what it should, and bad values fail early."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from sparkddl import ConfigError
from sparkddl.errors import DataError, TrainingFailedError
from sparkddl.strategies.fsdp import fsdp_problem
from tests.integration.digits import _arrays, accuracy, digits_df, mlp
from tests.integration.test_estimator import estimator
from tests.integration.test_fault_tolerance import STEPS, FailingLoss
from tests.integration.user_models import NaNAfter, TwoHeads, digit_step, vector_step

LR = 3e-3  # the learning rate of test_estimator's estimator


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The store of every fit here: each dataset is written once, and later fits of the
    same data reuse it (a data cache hit); each fit is a run of its own."""
    return tmp_path_factory.mktemp("knobs-store")


@pytest.fixture
def digits(spark_local):
    df = digits_df(spark_local)
    return df.filter("split != 0"), df.filter("split = 0")


@pytest.mark.timeout(300)
def test_schedule_bf16_clipping_and_accumulation_train_like_fp32(digits, store):
    train, test = digits
    plain = estimator(store, epochs=12).fit(train)
    knobs = estimator(store, epochs=12, batchSize=16, backwardPassesPerStep=2,
                      precision="bf16-mixed", gradientClipNorm=1.0, lrScheduler="step",
                      lrSchedulerOptions={"step_size": 4, "gamma": 0.5}).fit(train)
    acc_plain, acc_knobs = accuracy(plain.transform(test)), accuracy(knobs.transform(test))
    assert acc_knobs >= 0.9 and abs(acc_knobs - acc_plain) <= 0.04, (acc_knobs, acc_plain)
    # the learning rate of each epoch follows the schedule; without one it stays put
    assert [r["lr"] for r in knobs.history] == pytest.approx(
        [LR * 0.5 ** ((e - 1) // 4) for e in range(1, 13)])
    assert all(r["lr"] == pytest.approx(LR) for r in plain.history)
    # two micro-batches of 16 per optimizer step: one synchronization per window of two, as
    # with batch 32 (an odd count of micro-batches ends the epoch with a window of one)
    micro, steps = knobs.steps_per_rank[0] // 12, plain.steps_per_rank[0] // 12
    assert micro in (2 * steps, 2 * steps + 1)
    assert knobs.history[0]["comm_calls"] - math.ceil(micro / 2) == \
        plain.history[0]["comm_calls"] - steps


@pytest.mark.timeout(300)
def test_accumulating_two_micro_batches_matches_one_batch_twice_the_size(spark_local, store):
    x, y = _arrays()
    df = spark_local.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x[:1280], y[:1280])],
                                     "features array<float>, label int")
    common = dict(optimizer=lambda p: torch.optim.SGD(p, lr=0.1), epochs=1, numWorkers=1,
                  validation=None, shuffleBufferSize=0, finalWeights="last")
    big = estimator(store, batchSize=32, **common).fit(df)
    micro = estimator(store, batchSize=16, backwardPassesPerStep=2, **common).fit(df)
    once = estimator(store, batchSize=16, **common).fit(df)
    assert micro.steps_per_rank == [2 * big.steps_per_rank[0]] == [80]
    for k, v in big._state.items():
        torch.testing.assert_close(micro._state[k], v, rtol=1e-4, atol=1e-5)
    # and the comparison can tell: without accumulation batch 16 ends elsewhere
    assert max((once._state[k] - v).abs().max().item() for k, v in big._state.items()) > 1e-3


@pytest.mark.timeout(300)
def test_callbacks_see_the_fit_and_one_stops_every_rank(digits, store):
    train, _ = digits
    events: list[tuple] = []

    class Recorder:
        def on_fit_start(self, est):
            events.append(("start", est))

        def on_epoch_end(self, row):
            events.append(("epoch", row["epoch"], "val_loss" in row))
            return row["epoch"] >= 2

        def on_snapshot(self, epoch, state):
            events.append(("snapshot", epoch, sorted(state)))

        def on_fit_end(self, model):
            events.append(("end", model))

    est = estimator(store, epochs=15, callbacks=[Recorder()])
    model = est.fit(train)
    assert events[0] == ("start", est) and events[-1] == ("end", model)
    epochs = [e[1] for e in events if e[0] == "epoch"]
    assert epochs == list(range(1, model.epochs_done + 1))
    assert all(e[2] for e in events if e[0] == "epoch")  # rows arrive with val_loss
    snaps = [e for e in events if e[0] == "snapshot"]
    assert [s[1] for s in snaps] == epochs and snaps[0][2] == sorted(mlp().state_dict())
    # asked after epoch 2; the ranks agree at an epoch's end, all after the same step
    assert model.stopped_early and 2 < model.epochs_done < 15
    assert model.steps_per_rank[0] == model.steps_per_rank[1]


@pytest.mark.timeout(300)
def test_a_restart_resumes_the_schedule_and_the_accumulation_window(spark_local, store,
                                                                    tmp_path):
    loss = FailingLoss(str(tmp_path / "marker"), at_step=STEPS + 12)
    model = estimator(store, loss=loss, epochs=4, backwardPassesPerStep=2,
                      maxRestarts=2, checkpointEverySteps=5, lrScheduler="exponential",
                      lrSchedulerOptions={"gamma": 0.9}, lrSchedulerInterval="step"
                      ).fit(digits_df(spark_local))
    [restart] = model.restarts
    # step checkpoints wait for the end of an accumulation window: due at global step 30
    # (step 9 of epoch 2), written after step 10
    assert (restart["resumed_from_epoch"], restart["resumed_from_step"]) == (1, 10)
    per_epoch = math.ceil(STEPS / 2)  # optimizer steps
    assert [r["lr"] for r in model.history] == pytest.approx(
        [LR * 0.9 ** (per_epoch * e) for e in range(4)])
    assert model.steps_per_rank == [4 * STEPS] * 2


@pytest.mark.timeout(300)
def test_a_non_finite_loss_stops_the_fit_naming_epoch_step_and_rank(digits, store):
    train, _ = digits
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        estimator(store, model=NaNAfter(after=5), maxRestarts=2).fit(train)
    err = str(info.value)
    assert "non-finite loss (nan) at epoch 1, step 5 on rank" in err, err
    assert info.value.attempts == 1 and "not retried" in err
    assert time.monotonic() - started < 120


@pytest.mark.timeout(300)
def test_nan_features_fail_on_the_driver_or_their_batches_are_skipped(spark_local, store):
    x, y = _arrays()
    x = x.copy()
    x[::50, 3] = np.nan  # 36 rows
    df = spark_local.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x, y)],
                                     "features array<float>, label int")
    with pytest.raises(DataError, match=r"'features' \(\d+ of \d+ sampled rows\) hold NaN"):
        estimator(store, epochs=1).fit(df)
    model = estimator(store, epochs=3, onNonFiniteLoss="skip_batch").fit(df)
    skipped = [r["skipped_batches"] for r in model.history]
    assert all(s > 0 for s in skipped), skipped
    assert all(math.isfinite(r["train_loss"]) for r in model.history)
    assert all(torch.isfinite(v).all() for v in model._state.values())


@pytest.mark.timeout(300)
def test_two_labels_sample_weights_and_a_custom_step(spark_local, store):
    x, y = _arrays()
    rows = [(r.tolist(), int(v), int(v) % 2, 1.0 if v < 5 else 0.0, i % 5)
            for i, (r, v) in enumerate(zip(x, y))]
    df = spark_local.createDataFrame(
        rows, "features array<float>, label int, parity int, w double, split int")
    train, test = df.filter("split != 0"), df.filter("split = 0")
    heads = estimator(store, model=TwoHeads(), labelCol=["label", "parity"],
                      epochs=8).fit(train)
    last = heads.history[-1]
    assert last["train_accuracy"] > 0.85 and last["val_loss"] < heads.history[0]["val_loss"]
    # weight 0 for digits 5-9: the model learns to predict 0-4 only
    weighted = estimator(store, sampleWeightCol="w", epochs=8).fit(train)
    predicted = [r["prediction"] for r in weighted.transform(test).collect()]
    assert sum(p >= 5 for p in predicted) / len(predicted) < 0.1
    custom = estimator(store, trainStep=digit_step, epochs=8).fit(train)
    assert set(custom.history[0]) >= {"train_loss", "val_loss"}
    assert "train_accuracy" not in custom.history[0]
    assert accuracy(custom.transform(test)) >= 0.9


@pytest.mark.timeout(120)
def test_bad_knobs_fail_on_the_driver_before_the_stage(digits, store):
    train, _ = digits

    def broken(optimizer):
        raise RuntimeError("no such schedule")

    cases = [
        (dict(lrScheduler=broken), r"lrScheduler factory could not be built: RuntimeError: "
                                   r"no such schedule"),
        (dict(lrScheduler="sawtooth"), r"unknown lrScheduler 'sawtooth'"),
        (dict(lrScheduler="step", lrSchedulerOptions={"step": 3}),
         r"lrScheduler 'step' with \{'step': 3\} could not be built"),
        (dict(precision="16-mixed"), r"'16-mixed' .* needs CUDA GPUs \(useGpu=True\); on "
                                     r"CPUs use 'bf16-mixed'"),
        (dict(precision="fp8"), r"unknown precision 'fp8'"),
        (dict(backwardPassesPerStep=0), r"backwardPassesPerStep must be an integer >= 1"),
        (dict(gradientClipNorm=-1.0), r"gradientClipNorm must be a positive number"),
        (dict(trainStep=vector_step), r"trainStep must return a scalar loss tensor, got \[8\]"),
        (dict(trainStep=digit_step, metrics=["accuracy"]), r"metrics need the model's output"),
        (dict(loss=torch.nn.functional.cross_entropy, sampleWeightCol="label"),
         r"sampleWeightCol needs a torch loss module"),
        (dict(labelCol=["label", "split"]), r"with 2 label columns the model must return a "
                                            r"tuple of 2 outputs"),
    ]
    for params, pattern in cases:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=pattern):
            estimator(store, **params).fit(train)
        assert time.monotonic() - started < 30, params


@pytest.mark.timeout(300)
def test_fsdp_checkpoints_full_states_and_resumes_after_a_failure(spark_local, store,
                                                                  tmp_path):
    if fsdp_problem("cpu"):  # the oldest stack's torch: refused on the driver
        pytest.skip(fsdp_problem("cpu"))
    loss = FailingLoss(str(tmp_path / "marker"), at_step=2 * STEPS + 5)  # in epoch 3
    df = digits_df(spark_local)
    model = estimator(store, loss=loss, epochs=4, maxRestarts=2, strategy="fsdp",
                      strategyOptions={"min_params": 1000}, gradientClipNorm=1.0,
                      lrScheduler="step", lrSchedulerOptions={"step_size": 1, "gamma": 0.5},
                      ).fit(df.filter("split != 0"))
    [restart] = model.restarts
    assert restart["resumed_from_epoch"] == 2
    assert [r["attempt"] for r in model.history] == [0, 0, 1, 1]
    assert [r["lr"] for r in model.history] == pytest.approx([LR * 0.5 ** e for e in range(4)])
    # the snapshots and the checkpoint held the whole model, gathered from its shards
    assert sorted(model._state) == sorted(mlp().state_dict())
    assert accuracy(model.transform(df.filter("split = 0"))) >= 0.85
    assert model.steps_per_rank[0] == model.steps_per_rank[1]
