"""Adversarial harness: bad inputs and faults a new user or an adversary would try, each run
against sparkddl in one local[2] session, recording what was raised, how fast, and whether
the message names the culprit.

One row per case: area, case, outcome (the exception class, ``ok``, ``no error``, ``HANG``,
or ``exit N`` for the CLI), kind (sparkddl: a SparkDDLError subclass, or the CLI's one-line
``sparkddl: error``; raw: anything else; finding: a check of the harness failed, e.g. a
payload ran), seconds to the outcome, clear (the message holds the substring that names the
culprit: the Param, file, column, rank...), the first 160 characters of the message, and a
note. Nothing is fixed here: the harness only records.

    flock /tmp/spark.lock .venv/bin/python benchmarks/adversarial.py            # everything
    flock /tmp/spark.lock .venv/bin/python benchmarks/adversarial.py --only cli,run --list

Every case has a wall-clock limit (fits also get ``timeout`` and, where a hang is the case,
``watchdogTimeout``); a case that outlives it is recorded as HANG, its Spark jobs are
cancelled and the next case runs. The CLI cases run first, before this session's JVM starts,
because some of them start Spark themselves (one Spark at a time on this machine).
"""
from __future__ import annotations

import argparse
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.integration.digits import digits_df, mlp  # noqa: E402

CASE_LIMIT_S = 200.0  # hard limit per case: then HANG, its jobs are cancelled, the next runs
FIT_TIMEOUT_S = 120  # every fit's own timeout Param
CLEAR_WITHIN_S = 10.0  # "a sparkddl error within 10 s" in the summary
CLI_TIMEOUT_S = 120
PWNED = Path("/tmp/adv-PWNED")  # what a payload in a tampered file would create
MESSAGE_CHARS = 160
OK = None  # expected outcome of a case that should succeed

Action = Callable[[], Any]
CaseFn = Callable[["Ctx"], tuple[Action, "str | None"]]


@dataclass(frozen=True)
class Case:
    area: str
    name: str
    make: CaseFn


CASES: list[Case] = []
AREAS = ("cli", "params", "faults", "cancel", "run", "model", "store", "channel")


def case(area: str, name: str) -> Callable[[CaseFn], CaseFn]:
    """Register a case: ``make(ctx)`` returns (the action to time, the substring(s), '|'
    separated, that a clear message holds; OK if the action should succeed)."""
    assert area in AREAS, area

    def register(make: CaseFn) -> CaseFn:
        CASES.append(Case(area, name, make))
        return make
    return register


class Finding(Exception):
    """A harness check failed: what an adversary did had an effect it must not have."""


class CliExit(Exception):
    """The console script exited non-zero; the message is its stderr."""

    def __init__(self, code: int, stderr: str, started_spark: bool):
        self.code, self.stderr, self.started_spark = code, stderr, started_spark
        # what the CLI itself said: its "sparkddl: ..." lines (argparse's too)
        self.said = "\n".join(line for line in stderr.splitlines()
                              if line.startswith("sparkddl: "))
        super().__init__(self.said or stderr.strip())


# ---- the shared session, data and fixtures ----

class Ctx:
    """What cases share: the session, a temp dir, scikit-learn's digits as one DataFrame, one
    Store (so the digits are materialized once), and fixtures built on first use."""

    def __init__(self, spark: Any, tmp: Path):
        self.spark, self.tmp = spark, tmp
        self.sc = spark.sparkContext if spark is not None else None
        self.df = digits_df(spark).drop("split").cache() if spark is not None else None
        if self.df is not None:
            self.df.count()
        self.store = str(tmp / "store")
        self.notes: list[str] = []
        self._saved_model: Path | None = None
        self._n = 0

    def path(self, name: str) -> Path:
        """A fresh path under the temp dir."""
        self._n += 1
        return self.tmp / f"{self._n:03d}-{name}"

    def estimator(self, **params: Any) -> Any:
        from sparkddl import TorchEstimator
        base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                    loss="cross_entropy", featuresCol="features", labelCol="label",
                    batchSize=32, epochs=1, numWorkers=2, store=self.store, progress=False,
                    maxRestarts=0, timeout=FIT_TIMEOUT_S)
        return TorchEstimator(**{**base, **params})

    def fit(self, df: Any = None, **params: Any) -> Action:
        """An action fitting the digits (or ``df``) with the defaults above and ``params``;
        the estimator is built inside it, so bad Params fail in the timed action too."""
        return lambda: self.estimator(**params).fit(self.df if df is None else df)

    def saved_model(self) -> Path:
        """A model fitted for one epoch and saved (once); cases tamper with copies."""
        if self._saved_model is None:
            path = self.tmp / "saved-model"
            self.estimator(epochs=1).fit(self.df).save(str(path))
            self._saved_model = path
        return self._saved_model

    def model_copy(self, name: str) -> Path:
        dst = self.path(name)
        shutil.copytree(self.saved_model(), dst)
        return dst

    def parquet(self, name: str) -> Path:
        """The digits written by Spark as a Parquet table (2 part files)."""
        path = self.path(name)
        self.df.repartition(2).write.parquet(str(path))
        return path

    def note(self, text: str) -> None:
        self.notes.append(text)


# ---- injected faults (they travel to the ranks by value: cloudpickle) ----

class Sabotage(torch.nn.Module):
    """Cross-entropy that misbehaves on rank ``rank`` from its ``at_step``-th step on: raise,
    os_exit, sys_exit, hang, segv, nan; or always: detach (no grad), vector (not a scalar)."""

    def __init__(self, how: str, at_step: int = 3, rank: str = "1"):
        super().__init__()
        self.how, self.at_step, self.rank = how, at_step, rank
        self.calls = 0

    def forward(self, output: Any, label: Any) -> Any:
        loss = torch.nn.functional.cross_entropy(output, label, reduction="none")
        if self.how == "vector":
            return loss
        if self.how == "detach":
            return loss.mean().detach()
        if os.environ.get("RANK") != self.rank:
            return loss.mean()
        self.calls += 1
        if self.calls < self.at_step:
            return loss.mean()
        if self.how == "raise":
            raise RuntimeError(f"injected failure at step {self.at_step}")
        if self.how == "os_exit":
            os._exit(9)
        if self.how == "sys_exit":
            sys.exit(3)
        if self.how == "hang":
            time.sleep(3600)
        if self.how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.how == "nan":
            return loss.mean() * float("nan")
        return loss.mean()


class SlowLoss(torch.nn.Module):
    """Cross-entropy taking ``seconds`` a step: the fit outlasts a cancel or an attack."""

    def __init__(self, seconds: float = 0.05):
        super().__init__()
        self.seconds = seconds

    def forward(self, output: Any, label: Any) -> Any:
        time.sleep(self.seconds)
        return torch.nn.functional.cross_entropy(output, label)


class Planted:
    """Unpickling this runs ``touch PWNED``: proof that a file's code ran."""

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {PWNED}",)


class CancelAt:
    """Driver callback: at the end of ``epoch``, cancel as a user would."""

    def __init__(self, sc: Any, how: str, epoch: int = 2):
        self.sc, self.how, self.epoch = sc, how, epoch

    def on_epoch_end(self, row: dict) -> None:
        if row["epoch"] == self.epoch:
            if self.how == "all":
                self.sc.cancelAllJobs()
            else:
                self.sc.cancelJobGroup("adv-users-cell")


class NoHooks:
    """A callback object with none of the hooks (a typo: on_epoch_ends)."""

    def on_epoch_ends(self, row: dict) -> None:
        pass


class FailsAtStart:
    def on_fit_start(self, estimator: Any) -> None:
        raise RuntimeError("refused to start")  # does sparkddl say which callback?


def no_payload_ran(action: Action) -> Action:
    """``action``, then a Finding if the planted payload created its marker."""
    def checked() -> Any:
        PWNED.unlink(missing_ok=True)
        try:
            return action()
        finally:
            if PWNED.exists():
                PWNED.unlink()
                raise Finding(f"the payload ran: {PWNED} was created")
    return checked


# ---- Estimator Params ----

for _name, _params, _expect in [
    ("numWorkers=0", {"numWorkers": 0}, "numWorkers|num_workers"),
    ("numWorkers=-1", {"numWorkers": -1}, "numWorkers|num_workers"),
    ("numWorkers=3 on local[2]", {"numWorkers": 3}, "numWorkers|num_workers"),
    ("numWorkers='two'", {"numWorkers": "two"}, "numWorkers"),
    ("batchSize=0", {"batchSize": 0}, "batchSize|batch_size"),
    ("batchSize=2.5", {"batchSize": 2.5}, "batchSize|batch_size"),
    ("epochs=0", {"epochs": 0}, "epochs"),
    ("epochs=-3", {"epochs": -3}, "epochs"),
    ("validation=1.5", {"validation": 1.5}, "validation"),
    ("validation=-0.1", {"validation": -0.1}, "validation"),
    ("validation=True", {"validation": True}, "validation"),
    ("validation names no column", {"validation": "is_val"}, "is_val"),
    ("strategy unknown", {"strategy": "allreduse"}, "allreduse"),
    ("strategyOptions unknown key", {"strategyOptions": {"compresion": "fp16"}}, "compresion"),
    ("strategyOptions not a dict", {"strategyOptions": "fp16"},
     "strategyOptions|strategy_options"),
    ("strategyOptions bad value", {"strategy": "local_sgd",
                                   "strategyOptions": {"sync_every": -2}}, "sync_every"),
    ("minWorkers with strategy ssp", {"strategy": "ssp", "minWorkers": 1},
     "minWorkers|min_workers"),
    ("metric unknown", {"metrics": ["acurracy"]}, "acurracy"),
    ("metrics=42", {"metrics": 42}, "metrics"),
    ("bestBy unknown", {"bestBy": "val_nosuch", "validation": 0.2}, "val_nosuch"),
    ("bestBy without prefix", {"bestBy": "accuracy"}, "accuracy"),
    ("bestBy val_ without validation", {"bestBy": "val_loss"}, "validation"),
    ("bestByMode='up'", {"bestByMode": "up"}, "bestByMode|best_mode"),
    ("featuresCol missing", {"featuresCol": "pixels"}, "pixels"),
    ("labelCol missing", {"labelCol": "target"}, "target"),
    ("featuresCol=123", {"featuresCol": 123}, "featuresCol"),
    ("sampleWeightCol missing", {"sampleWeightCol": "w"}, "'w'"),
    ("model is a string", {"model": "not a module"}, "not a module"),
    ("model=42", {"model": 42}, "model"),
    ("model factory returns 42", {"model": lambda: 42}, "model"),
    ("model import target missing", {"model": "nosuchpkg.nets:make"}, "nosuchpkg"),
    ("optimizer=42 (not callable)", {"optimizer": 42}, "optimizer"),
    ("optimizer unknown name", {"optimizer": "adamm"}, "adamm"),
    ("optimizer factory raises", {"optimizer": lambda p: torch.optim.SGD(p, lr=-1)},
     "optimizer"),
    ("loss unknown name", {"loss": "cross_entropyy"}, "cross_entropyy"),
    ("loss=42", {"loss": 42}, "loss"),
    ("lrScheduler unknown", {"lrScheduler": "cosinus"}, "cosinus"),
    ("lrScheduler multistep without milestones", {"lrScheduler": "multistep"}, "milestones"),
    ("lrSchedulerOptions unknown keyword", {"lrScheduler": "step",
                                            "lrSchedulerOptions": {"step_sise": 5}},
     "step_sise"),
    ("lrSchedulerOptions without lrScheduler", {"lrSchedulerOptions": {"gamma": 0.5}},
     "lrScheduler|lr_scheduler"),
    ("lrSchedulerInterval='batch'", {"lrSchedulerInterval": "batch"},
     "lrSchedulerInterval|lr_scheduler_interval"),
    ("precision unknown", {"precision": "fp8"}, "fp8|precision"),
    ("precision 16-mixed on CPU", {"precision": "16-mixed"}, "16-mixed"),
    ("minWorkers > numWorkers", {"minWorkers": 3}, "minWorkers|min_workers"),
    ("minWorkers=0", {"minWorkers": 0}, "minWorkers|min_workers"),
    ("slotWaitTimeout=0", {"slotWaitTimeout": 0}, "slotWaitTimeout|slot_wait"),
    ("watchdogTimeout=-1", {"watchdogTimeout": -1}, "watchdog"),
    ("watchdogTimeout='fast'", {"watchdogTimeout": "fast"}, "watchdog"),
    ("timeout=0", {"timeout": 0}, "timeout"),
    ("timeout='soon'", {"timeout": "soon"}, "timeout"),
    ("runId with bad characters", {"runId": "../../etc/passwd"}, "runId|run_id"),
    ("learningRate=-1", {"learningRate": -1}, "learningRate|learning_rate"),
    ("gradientClipNorm=0", {"gradientClipNorm": 0}, "gradientClipNorm|gradient_clip_norm"),
    ("backwardPassesPerStep=0", {"backwardPassesPerStep": 0},
     "backwardPassesPerStep|backward_passes"),
    ("keepCheckpoints=0", {"keepCheckpoints": 0}, "keepCheckpoints|keep_checkpoints"),
    ("maxRestarts=-1", {"maxRestarts": -1}, "maxRestarts|max_restarts"),
    ("readerPool='process'", {"readerPool": "process"}, "readerPool|reader_pool"),
    ("reader unknown", {"reader": "fastparquet"}, "fastparquet|reader"),
    ("onNonFiniteLoss unknown", {"onNonFiniteLoss": "ignore"},
     "onNonFiniteLoss|on_non_finite"),
    ("finalWeights unknown", {"finalWeights": "middle"}, "finalWeights|final_weights"),
    ("featureShapes do not fit", {"featureShapes": {"features": [3, 3]}},
     "featureShapes|feature_shapes|(3, 3)"),
    ("useGpu without GPUs", {"useGpu": True}, "useGpu|use_gpu|GPU"),
    ("mlflow='yes'", {"mlflow": "yes"}, "mlflow"),
    ("store=''", {"store": ""}, "store"),
    ("transformFn not callable", {"transformFn": "decode_images"},
     "transformFn|transform_fn"),
    ("transformFn import target missing", {"transformFn": "nosuchmod:fn"}, "nosuchmod"),
    ("callbacks without hooks", {"callbacks": [NoHooks()]}, "NoHooks|hooks"),
    ("callback on_fit_start raises", {"callbacks": [FailsAtStart()]},
     "FailsAtStart|on_fit_start"),
]:
    case("params", _name)(lambda ctx, p=_params, e=_expect: (ctx.fit(**p), e))


@case("params", "no model, optimizer or loss")
def _no_model(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import TorchEstimator
    return lambda: TorchEstimator(epochs=1).fit(ctx.df), "model"


@case("params", "batchSize larger than the data")
def _huge_batch(ctx: Ctx) -> tuple[Action, str | None]:
    return ctx.fit(batchSize=5000), "batch"


@case("params", "label of type string")
def _string_label(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("features", "concat('digit-', label) as label")
    return ctx.fit(df), "label"


@case("params", "all features NaN")
def _nan_features(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("array_repeat(cast('NaN' as float), 64) as features", "label")
    return ctx.fit(df), "NaN|finite"


@case("params", "features NaN in 10% of rows")
def _some_nan(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("if(label = 7, array_repeat(cast('NaN' as float), 64), features) "
                           "as features", "label")
    return ctx.fit(df), "NaN|finite"


@case("params", "features null in some rows")
def _null_features(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("if(label = 7, null, features) as features", "label")
    return ctx.fit(df), "null|features"


@case("params", "features of varying length")
def _ragged(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("if(label = 7, slice(features, 1, 60), features) as features",
                           "label")
    return ctx.fit(df), "features"


@case("params", "empty DataFrame")
def _empty(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(ctx.df.limit(0)), "empty|no rows|0 rows"


@case("params", "label null in some rows")
def _null_label(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(ctx.df.selectExpr("features", "if(label = 7, null, label) as label")), \
        "null"


@case("params", "label -1 in some rows")
def _negative_label(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(ctx.df.selectExpr("features", "if(label = 7, -1, label) as label")), "-1"


@case("params", "featuresCol is the labelCol")
def _same_column(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(featuresCol="label"), "label"


@case("params", "featuresCol lists a column twice")
def _twice(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(featuresCol=["features", "features"]), "features"


@case("params", "3 rows of data")
def _three_rows(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(ctx.df.limit(3)), "3"


@case("params", "a streaming DataFrame")
def _streaming(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.spark.readStream.format("rate").load().selectExpr(
        "array_repeat(cast(value as float), 64) as features", "cast(value % 10 as int) as label")
    return ctx.fit(df), "stream"


@case("params", "model without parameters")
def _no_params(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(model=torch.nn.Softmax(dim=1)), "parameters"


@case("params", "model in float64")
def _double(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(model=mlp().double()), "double|float64|dtype"


@case("params", "runId resumed with other numWorkers")
def _resume_layout(ctx: Ctx) -> tuple[Action, str]:
    ctx.estimator(runId="adv-layout").fit(ctx.df)

    def resume() -> Any:
        return ctx.estimator(runId="adv-layout", numWorkers=1, epochs=2).fit(ctx.df)
    return resume, "num_workers 2 -> 1|numWorkers"


def _raising_transform(batch: dict) -> dict:
    raise ValueError("transformFn cannot read this batch")


def _list_transform(batch: dict) -> list:
    return [batch["features"]]


def _narrow_transform(batch: dict) -> dict:
    return {"features": np.zeros((len(batch["label"]), 32), np.float32)}


def _sample_only_transform(batch: dict) -> dict:
    """64 wide on the driver's sample of 8 rows, 32 wide on the ranks' batches."""
    width = 64 if len(batch["label"]) == 8 else 32
    return {"features": np.zeros((len(batch["label"]), width), np.float32)}


for _name, _fn, _expect in [
    ("transformFn raises", _raising_transform, "transformFn|cannot read this batch"),
    ("transformFn returns a list", _list_transform, "transformFn|transform_fn|list"),
    ("transformFn returns 32-wide features", _narrow_transform, "32"),
    ("transformFn shapes differ on the ranks", _sample_only_transform, "shape"),
]:
    case("params", _name)(lambda ctx, f=_fn, e=_expect: (ctx.fit(transformFn=f), e))


@case("params", "trainStep returns a vector")
def _vector_step(ctx: Ctx) -> tuple[Action, str]:
    def step(model: Any, batch: dict) -> Any:
        return torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"],
                                                 reduction="none")
    return ctx.fit(trainStep=step), "scalar|trainStep|train_step"


@case("params", "trainStep returns a float")
def _float_step(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(trainStep=lambda model, batch: 1.0), "trainStep|train_step|tensor"


# ---- faults on the ranks ----

for _name, _how, _expect, _params in [
    ("rank 1 raises at step 3 (always)", "raise", "injected failure at step 3", {}),
    ("os._exit(9) in the loss on rank 1", "os_exit", "os._exit(9)", {}),
    ("sys.exit(3) in the loss on rank 1", "sys_exit", "sys.exit(3)|exit code 3|code 3", {}),
    ("hang in the loss, watchdogTimeout=3", "hang", "watchdog", {"watchdogTimeout": 3.0}),
    ("SIGSEGV in the loss on rank 1", "segv", "SIGSEGV", {}),
    ("NaN loss on rank 1 at step 3", "nan", "rank 1", {}),
    ("loss detached from the graph (no grad)", "detach", "grad", {}),
    ("loss returns a vector", "vector", "scalar", {}),
]:
    case("faults", _name)(lambda ctx, h=_how, e=_expect, p=_params: (
        ctx.fit(loss=Sabotage(h), maxRestarts=2, epochs=2, **p), e))


class RankOnlyModel:
    """A model factory that raises on the ranks only (the driver's checks pass)."""

    def __call__(self) -> torch.nn.Module:
        if os.environ.get("RANK") is not None:
            raise ImportError("no module named 'custom_layers' on the executors")
        return mlp()


@case("faults", "model factory fails on the ranks only")
def _rank_model(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(model=RankOnlyModel(), maxRestarts=2), "custom_layers"


# ---- cancellation ----

@case("cancel", "cancelAllJobs from a callback at epoch 2")
def _cancel_all(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(loss=SlowLoss(0.01), epochs=6, maxRestarts=2,
                   callbacks=[CancelAt(ctx.sc, "all")]), "cancel"


@case("cancel", "cancelJobGroup of the caller's group at epoch 2")
def _cancel_group(ctx: Ctx) -> tuple[Action, str]:
    def fit() -> Any:
        ctx.sc.setJobGroup("adv-users-cell", "a notebook cell", interruptOnCancel=True)
        try:
            return ctx.fit(loss=SlowLoss(0.01), epochs=6, maxRestarts=2,
                           callbacks=[CancelAt(ctx.sc, "group")])()
        finally:
            ctx.sc.setLocalProperty("spark.jobGroup.id", None)
    return fit, "cancel"


def _slow_label(label: int) -> int:
    time.sleep(0.02)
    return label


@case("cancel", "cancelAllJobs while the data is prepared")
def _cancel_prepare(ctx: Ctx) -> tuple[Action, str]:
    from pyspark.sql import functions as F
    slow = F.udf(_slow_label, "int")
    big = ctx.df.crossJoin(ctx.spark.range(4).hint("broadcast")).drop("id")  # 7,188 rows
    df = big.withColumn("label", slow(F.col("label")))

    def fit() -> Any:
        timer = threading.Timer(4.0, ctx.sc.cancelAllJobs)
        timer.start()
        try:
            return ctx.fit(df)()
        finally:
            timer.cancel()
    return fit, "cancel"


@case("cancel", "sparkddl.run cancelled by its job group")
def _cancel_run(ctx: Ctx) -> tuple[Action, str]:
    import sparkddl

    def nap(seconds: float) -> int:
        time.sleep(seconds)
        return 1

    def go() -> Any:
        ctx.sc.setJobGroup("adv-run-group", "a cell", interruptOnCancel=True)
        timer = threading.Timer(4.0, ctx.sc.cancelJobGroup, ("adv-run-group",))
        timer.start()
        try:
            return sparkddl.run(nap, 60, num_workers=2, timeout=90, spark=ctx.spark)
        finally:
            timer.cancel()
            ctx.sc.setLocalProperty("spark.jobGroup.id", None)
    return go, "cancel"


# ---- sparkddl.run ----

def _raises() -> None:
    raise ValueError("user code failed on purpose")


def _nccl() -> None:
    import torch.distributed as dist
    dist.init_process_group("nccl")


def _returns_lock() -> Any:
    return threading.Lock()


def _exit_with(code: int) -> None:
    sys.exit(code)


def _exit_rank1(code: int) -> str:
    if os.environ["RANK"] == "1":
        os._exit(code)
    return "rank 0 done"


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int):
        super().__init__(f"needs two arguments {a} {b}")


def _raises_odd() -> None:
    raise _Unpicklable(1, 2)


def _returns_big() -> bytes:
    return b"x" * (100 << 20)


def _sleeps() -> None:
    time.sleep(600)


def _run(ctx: Ctx, fn: Any, *args: Any, **kwargs: Any) -> Action:
    import sparkddl
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("timeout", 90)
    return lambda: sparkddl.run(fn, *args, spark=ctx.spark, **kwargs)


@case("run", "fn not picklable (closes over a lock)")
def _run_lock(ctx: Ctx) -> tuple[Action, str]:
    lock = threading.Lock()

    def uses_lock() -> None:
        with lock:
            pass
    return _run(ctx, uses_lock), "lock"


@case("run", "fn closes over the SparkContext")
def _run_sc(ctx: Ctx) -> tuple[Action, str]:
    sc = ctx.sc

    def uses_sc() -> int:
        return sc.defaultParallelism
    return _run(ctx, uses_sc), "'sc'"


for _name, _fn, _args, _kwargs, _expect in [
    ("fn raises", _raises, (), {}, "user code failed on purpose"),
    ("num_workers=0", len, ([1],), {"num_workers": 0}, "num_workers"),
    ("num_workers=3 on local[2]", len, ([1],), {"num_workers": 3}, "num_workers"),
    ("num_workers='2'", len, ([1],), {"num_workers": "2"}, "num_workers"),
    ("timeout=-1", len, ([1],), {"timeout": -1}, "timeout"),
    ("fn=42 (not callable)", 42, (), {}, "callable|fn"),
    ("script path missing", "/no/such/train.py", (), {}, "/no/such/train.py"),
    ("script with keyword arguments", str(ROOT / "jobs" / "train.py"), (), {"lr": 1},
     "keyword"),
    ("init_process_group('nccl') on CPU", _nccl, (), {}, "nccl|NCCL"),
    ("fn returns an unpicklable object", _returns_lock, (), {}, "pickle|lock"),
    ("fn raises an exception that cannot be unpickled", _raises_odd, (), {},
     "needs two arguments"),
    ("fn calls sys.exit(0)", _exit_with, (0,), {}, OK),
    ("fn calls sys.exit(2)", _exit_with, (2,), {}, "exit|code 2"),
    ("rank 1 calls os._exit(0)", _exit_rank1, (0,), {}, "os._exit(0)|rank 1"),
    ("fn sleeps past timeout=3", _sleeps, (), {"timeout": 3}, "timed out"),
    ("torch_threads=0", len, ([1],), {"torch_threads": 0}, "torch_threads"),
    ("fn returns 100 MB", _returns_big, (), {}, OK),
]:
    case("run", _name)(lambda ctx, f=_fn, a=_args, k=_kwargs, e=_expect: (
        _run(ctx, f, *a, **k), e))


# ---- saved models and transform ----

def _load(path: Path, **kwargs: Any) -> Action:
    from sparkddl import TorchModel
    return no_payload_ran(lambda: TorchModel.load(str(path), **kwargs))


@case("model", "load from a missing path")
def _missing(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("no/such/model")
    return _load(path), str(path)


@case("model", "load from a file, not a folder")
def _file(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("model.pt")
    torch.save(mlp().state_dict(), path)
    return _load(path), str(path)


@case("model", "load from an empty folder")
def _empty_dir(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("empty")
    path.mkdir()
    return _load(path), str(path)


@case("model", "program.json guards_code payload")
def _guard(ctx: Ctx) -> tuple[Action, str]:
    import json
    path = ctx.model_copy("guard")
    program = json.loads((path / "program.json").read_text())
    program["guards_code"] = [f"__import__('os').system('touch {PWNED}')"]
    (path / "program.json").write_text(json.dumps(program))
    return _load(path), "program.json"


@case("model", "program.json node target os.system")
def _node_target(ctx: Ctx) -> tuple[Action, str]:
    import json
    path = ctx.model_copy("node")
    program = json.loads((path / "program.json").read_text())
    for node in program["graph_module"]["graph"]["nodes"]:
        if node.get("target", "").startswith("torch.ops"):
            node["target"] = "os.system"
            break
    (path / "program.json").write_text(json.dumps(program))
    return _load(path), "program.json"


@case("model", "program.json truncated")
def _program_cut(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("cut")
    data = (path / "program.json").read_bytes()
    (path / "program.json").write_bytes(data[:len(data) // 2])
    return _load(path), "program.json"


@case("model", "program.json deleted")
def _program_gone(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("gone")
    (path / "program.json").unlink()
    return _load(path), "program.json"


@case("model", "weights.pt replaced by a __reduce__ pickle")
def _weights_pickle(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("weights-pickle")
    (path / "weights.pt").write_bytes(pickle.dumps({"net.0.weight": Planted()}))
    return _load(path), "weights.pt"


@case("model", "weights.pt torch.save of a payload")
def _weights_torch(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("weights-torch")
    torch.save({"0.weight": Planted()}, path / "weights.pt")
    return _load(path), "weights.pt"


@case("model", "weights.pt of another architecture")
def _weights_other(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("weights-other")
    torch.save(torch.nn.Sequential(torch.nn.Linear(64, 7)).state_dict(), path / "weights.pt")
    return _load(path), "weights|size mismatch|shape"


@case("model", "weights.pt deleted")
def _weights_gone(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("weights-gone")
    (path / "weights.pt").unlink()
    return _load(path), "weights.pt"


def _edit_metadata(path: Path, edit: Callable[[dict], None]) -> None:
    import json
    [meta] = [p for p in (path / "metadata").glob("part-*")]
    data = json.loads(meta.read_text())
    edit(data)
    meta.write_text(json.dumps(data))
    for crc in (path / "metadata").glob(".*.crc"):
        crc.unlink()  # Hadoop's checksum of the old text would refuse the new one


@case("model", "weights.pt truncated")
def _weights_cut(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("weights-cut")
    data = (path / "weights.pt").read_bytes()
    (path / "weights.pt").write_bytes(data[:len(data) // 2])
    return _load(path), "weights.pt"


@case("model", "metadata architecture import os:system")
def _os_system(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("os-system")

    def edit(meta: dict) -> None:
        meta["architecture"] = {"kind": "import", "target": "os:system",
                                "kwargs": {"command": f"touch {PWNED}"}}
        meta["program"] = None
    _edit_metadata(path, edit)
    return _load(path), "os:system"


@case("model", "metadata architecture pickle, architecture.pkl payload")
def _arch_pickle(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("arch-pickle")

    def edit(meta: dict) -> None:
        meta["architecture"] = {"kind": "pickle"}
        meta["program"] = None
    _edit_metadata(path, edit)
    (path / "architecture.pkl").write_bytes(pickle.dumps(Planted()))
    return _load(path), "pickle|trusted"


@case("model", "metadata transform import os:system")
def _transform_os(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("transform-os")
    _edit_metadata(path, lambda m: m.update(transform={"kind": "import",
                                                       "target": "os:system"}))
    return _load(path), "os:system"


@case("model", "metadata not JSON")
def _meta_garbage(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.model_copy("meta-garbage")
    [meta] = list((path / "metadata").glob("part-*"))
    meta.write_text("{not json")
    for crc in (path / "metadata").glob(".*.crc"):
        crc.unlink()
    return _load(path), "metadata"


def _transform(ctx: Ctx, df: Any) -> Action:
    from sparkddl import TorchModel

    def go() -> Any:
        return TorchModel.load(str(ctx.saved_model())).transform(df).select(
            "prediction").collect()
    return go


@case("model", "transform without the feature column")
def _no_col(ctx: Ctx) -> tuple[Action, str]:
    return _transform(ctx, ctx.df.withColumnRenamed("features", "pixels")), "features"


@case("model", "transform with 32 features instead of 64")
def _short(ctx: Ctx) -> tuple[Action, str]:
    return _transform(ctx, ctx.df.selectExpr("slice(features, 1, 32) as features")), "32"


@case("model", "transform with string features")
def _strings(ctx: Ctx) -> tuple[Action, str]:
    return _transform(ctx, ctx.df.selectExpr("cast(label as string) as features")), \
        "'features'|string"


@case("model", "transform with array<string> features")
def _string_array(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("transform(features, x -> concat('px', x)) as features")
    return _transform(ctx, df), "'features'"


@case("model", "transform with null features")
def _null_transform(ctx: Ctx) -> tuple[Action, str]:
    df = ctx.df.selectExpr("if(label = 7, null, features) as features")
    return _transform(ctx, df), "null"


@case("model", "transform with inferenceDevice='tpu'")
def _tpu(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import TorchModel

    def go() -> Any:
        model = TorchModel.load(str(ctx.saved_model()))
        return model.setInferenceDevice("tpu").transform(ctx.df).collect()
    return go, "inferenceDevice|tpu"


@case("model", "transform with inferenceBatchSize=0")
def _batch0(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import TorchModel

    def go() -> Any:
        model = TorchModel.load(str(ctx.saved_model()))
        return model.setInferenceBatchSize(0).transform(ctx.df).select("prediction").collect()
    return go, "inferenceBatchSize"


@case("model", "transform of a TorchModel never fitted")
def _unfitted(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import TorchModel
    return lambda: TorchModel().transform(ctx.df).collect(), "not fitted|TorchModel.load|fit("


# ---- checkpoints and the Store ----

@case("store", "store is a file")
def _store_file(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("a-file")
    path.write_text("")
    return ctx.fit(store=str(path)), str(path)


@case("store", "store under a read-only folder")
def _store_ro(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(store="/proc/sparkddl-store"), "/proc/sparkddl-store"


@case("store", "store with an unknown scheme")
def _store_scheme(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(store="nosuchfs://bucket/x"), "nosuchfs"


@case("store", "store path with spaces and non-ASCII")
def _store_odd(ctx: Ctx) -> tuple[Action, str | None]:
    return ctx.fit(store=str(ctx.path("my store ü"))), OK


@case("store", "store path with '#' and '?'")
def _store_hash(ctx: Ctx) -> tuple[Action, str | None]:
    """Refused: as a URI the path would be cut at '#' and the files written elsewhere."""
    return ctx.fit(store=str(ctx.path("run#1?x=2"))), "contains '#' and '?'"


@case("store", "store in memory:// (executors cannot reach it)")
def _store_memory(ctx: Ctx) -> tuple[Action, str]:
    return ctx.fit(store="memory://adv"), "memory"


def _planted_run(ctx: Ctx, run_id: str, damage: Callable[[Any, list], None]) -> Path:
    """A Store with two small checkpoints of ``run_id``, then ``damage(store, refs)``."""
    from sparkddl import checkpoint
    from sparkddl.store import Store
    root = ctx.path("ckpt-store")
    store = Store.from_uri(str(root))
    refs = [checkpoint.save(store, run_id, e, 0, {"model": {"w": torch.ones(1)}}, keep=3)
            for e in (1, 2)]
    damage(store, refs)
    return root


@case("store", "resume with every checkpoint truncated")
def _all_truncated(ctx: Ctx) -> tuple[Action, str]:
    def damage(store: Any, refs: list) -> None:
        for ref in refs:
            store.write_bytes(ref.url, store.read_bytes(ref.url)[:-5])
    root = _planted_run(ctx, "adv-cut", damage)
    return ctx.fit(store=str(root), runId="adv-cut"), "ckpt-00002"


@case("store", "resume from a checkpoint payload with a valid checksum")
def _ckpt_payload(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import checkpoint

    def damage(store: Any, refs: list) -> None:
        store.write_bytes(refs[-1].url, checkpoint.encode({"model": {"w": Planted()}}))
    root = _planted_run(ctx, "adv-payload", damage)
    return no_payload_ran(ctx.fit(store=str(root), runId="adv-payload")), "ckpt-00002"


@case("store", "resume with a driver-state payload with a valid checksum")
def _driver_payload(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl import checkpoint

    def damage(store: Any, refs: list) -> None:
        url = checkpoint.driver_state_url(store, "adv-driver", 2)
        store.write_bytes(url, checkpoint.encode({"rows": [Planted()]}))
    root = _planted_run(ctx, "adv-driver", damage)
    return no_payload_ran(ctx.fit(store=str(root), runId="adv-driver")), "driver-00002"


@case("store", "resume with a checkpoint of garbage and a forged header")
def _ckpt_garbage(ctx: Ctx) -> tuple[Action, str]:
    """Seeded: most random bytes make torch's safe unpickler refuse an opcode, some (this
    seed among them) make it fail otherwise."""
    import hashlib
    import random

    def damage(store: Any, refs: list) -> None:
        for ref in refs:
            body = random.Random(2).randbytes(256)
            head = b"SPARKDDL-CHECKPOINT 1 %s %d\n" % (hashlib.sha256(body).hexdigest().encode(),
                                                      len(body))
            store.write_bytes(ref.url, head + body)
    root = _planted_run(ctx, "adv-garbage", damage)
    return ctx.fit(store=str(root), runId="adv-garbage"), "ckpt-00002"


@case("store", "resume with the latest real checkpoint truncated")
def _latest_truncated(ctx: Ctx) -> tuple[Action, str | None]:
    from sparkddl.store import Store
    store_root = ctx.path("trunc-store")
    ctx.estimator(store=str(store_root), epochs=3, runId="adv-trunc").fit(ctx.df)
    store = Store.from_uri(str(store_root))
    folder = Path(store.fs_path(store.run_url("adv-trunc", "checkpoints")))
    latest = sorted(folder.glob("ckpt-*.pt"))[-1]
    latest.write_bytes(latest.read_bytes()[:1000])
    ctx.note(f"truncated {latest.name} of {len(list(folder.glob('ckpt-*.pt')))}")

    def resume() -> Any:
        model = ctx.fit(store=str(store_root), epochs=4, runId="adv-trunc")()
        ctx.note(f"history epochs {[r['epoch'] for r in model.history]}, attempts "
                 f"{[r['attempt'] for r in model.history]}, steps {model.steps_per_rank}")
        return model
    return resume, OK


@case("store", "resume with run.json not JSON")
def _run_json(ctx: Ctx) -> tuple[Action, str]:
    from sparkddl.store import Store
    store_root = ctx.path("runjson-store")
    ctx.estimator(store=str(store_root), runId="adv-runjson").fit(ctx.df)
    store = Store.from_uri(str(store_root))
    Path(store.fs_path(store.run_url("adv-runjson", "run.json"))).write_text("{oops")
    return ctx.fit(store=str(store_root), epochs=2, runId="adv-runjson"), "run.json"


@case("store", "Parquet part truncated after spark.read")
def _part_truncated(ctx: Ctx) -> tuple[Action, str]:
    table = ctx.parquet("table-cut")
    df = ctx.spark.read.parquet(str(table))
    part = sorted(table.glob("part-*.parquet"))[-1]
    part.write_bytes(part.read_bytes()[:100])
    return ctx.fit(df), part.name


@case("store", "Parquet part deleted after spark.read")
def _part_deleted(ctx: Ctx) -> tuple[Action, str]:
    table = ctx.parquet("table-gone")
    df = ctx.spark.read.parquet(str(table))
    part = sorted(table.glob("part-*.parquet"))[-1]
    part.unlink()
    return ctx.fit(df), part.name


@case("store", "Parquet part replaced by garbage after spark.read")
def _part_garbage(ctx: Ctx) -> tuple[Action, str]:
    table = ctx.parquet("table-garbage")
    df = ctx.spark.read.parquet(str(table))
    part = sorted(table.glob("part-*.parquet"))[-1]
    part.write_bytes(b"PAR1" + os.urandom(4096) + b"PAR1")
    return ctx.fit(df), part.name


@case("store", "Parquet table of another schema behind the same path")
def _part_schema(ctx: Ctx) -> tuple[Action, str]:
    table = ctx.parquet("table-schema")
    df = ctx.spark.read.parquet(str(table))
    part = sorted(table.glob("part-*.parquet"))[-1]
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"features": ["not", "numbers"], "label": [1, 2]}), part)
    return ctx.fit(df), part.name


# ---- the console script ----

def _cli(ctx: Ctx, *args: str) -> Action:
    """Run ``sparkddl ARGS`` with outputs under the temp dir; CliExit on a non-zero exit."""
    exe = str(ROOT / ".venv" / "bin" / "sparkddl")
    outs = ["--set", f"output.dir={ctx.tmp / 'cli-out'}", "--set",
            f"train.store={ctx.tmp / 'cli-store'}"]

    def go() -> str:
        proc = subprocess.run([exe, *args, *outs], cwd=ROOT, capture_output=True, text=True,
                              timeout=CLI_TIMEOUT_S)
        started = "spark master:" in proc.stdout
        if proc.returncode != 0:
            raise CliExit(proc.returncode, proc.stderr, started)
        return proc.stdout
    return go


@case("cli", "unknown preset file")
def _cli_preset(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "conf/nosuch.toml"), "conf/nosuch.toml"


@case("cli", "unknown preset name")
def _cli_name(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "nosuch"), "nosuch"


@case("cli", "--set train.epochs=abc")
def _cli_type(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "train.epochs=abc"), "train.epochs"


@case("cli", "--set nosuch.key=1")
def _cli_section(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "nosuch.key=1"), "nosuch"


@case("cli", "--set train.epochz=3 (typo)")
def _cli_typo(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "train.epochz=3"), "epochz"


@case("cli", "--set without '='")
def _cli_noeq(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "train.epochs"), "train.epochs"


@case("cli", "bad TOML preset")
def _cli_toml(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("bad.toml")
    path.write_text("[train\nepochs = = 3\n")
    return _cli(ctx, "train", str(path)), "bad.toml"


@case("cli", "preset with an unknown section")
def _cli_unknown(ctx: Ctx) -> tuple[Action, str]:
    path = ctx.path("section.toml")
    path.write_text("[trian]\nepochs = 3\n")
    return _cli(ctx, "train", str(path)), "trian"


@case("cli", "plan --workers 0")
def _cli_workers(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "plan", "--workers", "0"), "--workers"


@case("cli", "unknown command")
def _cli_command(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "fit"), "fit"


@case("cli", "--set train.num_workers=0 (valid type, bad value)")
def _cli_workers0(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "train.num_workers=0"), "num_workers"


@case("cli", "--set data.validation=1.5")
def _cli_validation(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "train", "--set", "data.validation=1.5"), "validation"


@case("cli", "evaluate --model of a missing path")
def _cli_eval(ctx: Ctx) -> tuple[Action, str]:
    return _cli(ctx, "evaluate", "--model", "/no/such/model"), "/no/such/model"


# ---- the driver channel ----

def _open_channel(timeout: float = 90.0) -> Any:
    from sparkddl.launch import stage
    deadline = time.time() + timeout
    while not stage.OPEN_CHANNELS and time.time() < deadline:
        time.sleep(0.02)
    return next(iter(stage.OPEN_CHANNELS), None)


def _wrong_secret(port: int) -> None:
    from sparkddl.channel import protocol
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            protocol.client_handshake(s, protocol.new_secret())
        except (protocol.ProtocolError, OSError):
            pass


def _garbage(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.recv(32)
        s.sendall(os.urandom(4096))
        time.sleep(0.3)


def _flood(port: int) -> None:
    """100 idle connections held for 3 s: more than the channel keeps pending."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(100)]
    time.sleep(3)
    for s in socks:
        s.close()


def _attacked_fit(ctx: Ctx, attack: Callable[[int], None], need: int, early: bool) -> Action:
    """Fit while ``attack(port)`` runs against the channel (``early``: before the ranks have
    connected, else after a second); a Finding unless the fit succeeds with at least
    ``need`` rejected connections."""
    def go() -> Any:
        found: dict[str, Any] = {}

        def attacker() -> None:
            channel = _open_channel()
            if channel is None:
                return
            if not early:
                time.sleep(1.0)
            found["channel"] = channel
            try:
                attack(channel.port)
            except OSError as exc:
                found["error"] = f"{type(exc).__name__}: {exc}"
        thread = threading.Thread(target=attacker, daemon=True)
        thread.start()
        model = ctx.estimator(loss=SlowLoss(0.03), epochs=3).fit(ctx.df)
        thread.join(30)
        channel = found.get("channel")
        if channel is None:
            raise Finding("the attack found no open channel")
        ctx.note(f"rejected={channel.rejected}, epochs={len(model.history)}"
                 + (f", attacker: {found['error']}" if "error" in found else ""))
        if channel.rejected < need:
            raise Finding(f"only {channel.rejected} of {need} intruders were rejected")
        return model
    return go


@case("channel", "wrong secret while a fit runs")
def _ch_secret(ctx: Ctx) -> tuple[Action, str | None]:
    return _attacked_fit(ctx, _wrong_secret, 1, early=False), OK


@case("channel", "garbage bytes while a fit runs")
def _ch_garbage(ctx: Ctx) -> tuple[Action, str | None]:
    return _attacked_fit(ctx, _garbage, 1, early=False), OK


@case("channel", "100 idle connections before the ranks connect")
def _ch_flood(ctx: Ctx) -> tuple[Action, str | None]:
    return _attacked_fit(ctx, _flood, 1, early=True), OK


# ---- running and recording ----

@dataclass
class Row:
    area: str
    case: str
    outcome: str
    kind: str  # sparkddl, raw, ok, no error, finding, HANG, setup error
    seconds: float
    clear: str
    message: str
    note: str = ""
    exc: BaseException | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "exc"}


def classify(exc: BaseException | None, expected: str | None) -> tuple[str, str, str]:
    """(outcome, kind, clear) of an action that raised ``exc`` (None: returned)."""
    from sparkddl.errors import SparkDDLError
    if exc is None:
        return ("ok", "ok", "yes") if expected is OK else ("no error", "no error", "no")
    if isinstance(exc, CliExit):  # its own line, among any JVM log lines Spark printed
        ours = bool(exc.said) and "Traceback" not in exc.stderr
        kind = "sparkddl" if ours else "raw"
        outcome = f"exit {exc.code}"
    elif isinstance(exc, Finding):
        return "Finding", "finding", "no"
    else:
        outcome = type(exc).__name__
        kind = "sparkddl" if isinstance(exc, SparkDDLError) else "raw"
    if expected is OK:
        return outcome, kind, "no"
    text = (essence(str(exc)) if kind == "raw" else str(exc)).lower()
    text += " ".join(getattr(exc, "__notes__", ())).lower()  # e.g. the callback that raised
    clear = any(s.strip().lower() in text for s in expected.split("|"))
    return outcome, kind, "yes" if clear else "no"


def run_case(ctx: Ctx, c: Case) -> Row:
    """Build and run one case in a thread of its own, within CASE_LIMIT_S."""
    box: dict[str, Any] = {}
    ctx.notes = []

    def body() -> None:
        try:
            action, box["expected"] = c.make(ctx)
        except BaseException as exc:  # noqa: BLE001 - a broken setup is recorded too
            box["setup"] = exc
            return
        box["start"] = time.perf_counter()
        try:
            box["result"] = action()
        except BaseException as exc:  # noqa: BLE001 - everything is an outcome
            box["exc"] = exc
        box["end"] = time.perf_counter()

    thread = threading.Thread(target=body, name=f"case-{c.name}", daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(CASE_LIMIT_S)
    if thread.is_alive():  # never hang: cancel what it runs and move on
        if ctx.sc is not None:
            ctx.sc.cancelAllJobs()
        thread.join(30)
        return Row(c.area, c.name, "HANG", "HANG", CASE_LIMIT_S, "no",
                   f"still running after {CASE_LIMIT_S:g}s; its jobs were cancelled")
    if "setup" in box:
        exc = box["setup"]
        return Row(c.area, c.name, type(exc).__name__, "setup error",
                   time.perf_counter() - started, "no", _short(exc), exc=exc)
    exc = box.get("exc")
    outcome, kind, clear = classify(exc, box["expected"])
    note = "; ".join(ctx.notes)
    if isinstance(exc, CliExit) and exc.started_spark:
        noise = len(exc.stderr.splitlines()) - len(exc.said.splitlines())
        note = "; ".join(filter(None, [note, f"started Spark before failing ({noise} more "
                                             "stderr lines)"]))
    message = _short(exc, kind) if exc is not None else ""
    return Row(c.area, c.name, outcome, kind, box["end"] - box["start"], clear, message,
               note, exc)


def essence(text: str) -> str:
    """A Python worker's traceback as Spark relays it, cut to the exception it ends with
    (its file and code lines would match almost any expected substring)."""
    if "Traceback (most recent call last)" not in text:
        return text
    lines = text.rstrip().splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("  File "))
    tail = [line for line in lines[last + 1:] if line and not line.startswith(" ")]
    return "\n".join(tail) or text


def _short(exc: BaseException, kind: str = "") -> str:
    text = str(exc)
    if kind == "raw" and "Traceback (most recent call last)" in text:
        text = "[worker traceback] ... " + essence(text)
    text = " ".join(text.split())
    return text[:MESSAGE_CHARS].replace("|", "\\|")


def session_alive(ctx: Ctx) -> str:
    """'' if the session still runs a job, else what broke."""
    try:
        assert ctx.spark.range(7).count() == 7
        return ""
    except Exception as exc:  # noqa: BLE001
        return f"session broken: {type(exc).__name__}: {str(exc)[:200]}"


def run_all(cases: list[Case], tmp: Path, verbose: bool) -> tuple[list[Row], Any]:
    rows: list[Row] = []
    cli = [c for c in cases if c.area == "cli"]
    rest = [c for c in cases if c.area != "cli"]
    # the CLI first: some of its cases start a Spark of their own
    ctx = Ctx(None, tmp)
    for c in cli:
        rows.append(_report(run_case(ctx, c), verbose))
    spark = None
    if rest:
        spark = local_spark("local[2]")
        ctx = Ctx(spark, tmp)
        for c in rest:
            row = _report(run_case(ctx, c), verbose)
            broken = session_alive(ctx)
            if broken:  # record it, and go on in a new session
                row.note = "; ".join(filter(None, [row.note, broken]))
                print(f"    !! {broken}; starting a new session", flush=True)
                spark.stop()
                spark = local_spark("local[2]")
                ctx = Ctx(spark, tmp)
            rows.append(row)
    return rows, spark


def _report(row: Row, verbose: bool) -> Row:
    print(f"[{row.area:8s}] {row.case[:52]:52s} {row.outcome[:26]:26s} {row.kind:9s} "
          f"{row.seconds:7.2f}s clear={row.clear:3s} {row.message[:90]}", flush=True)
    if row.note:
        print(f"{'':11s}note: {row.note}", flush=True)
    if verbose and row.exc is not None:
        print(f"{'':11s}full message: {row.exc}", flush=True)
    return row


# ---- results ----

def problems(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows to look at, by reason."""
    return {
        "raw (non-sparkddl) errors": [r for r in rows if r.kind in ("raw", "setup error")],
        "no error where one was expected": [r for r in rows if r.kind == "no error"],
        "findings (a harness check failed)": [r for r in rows if r.kind == "finding"],
        "hangs": [r for r in rows if r.kind == "HANG"],
        "unclear messages (the culprit is not named)": [
            r for r in rows if r.clear == "no" and r.kind not in ("no error", "finding",
                                                                  "HANG")],
        f"slower than {CLEAR_WITHIN_S:g} s": [r for r in rows if r.seconds > CLEAR_WITHIN_S],
    }


def summary(rows: list[Row]) -> str:
    fast = sum(r.kind == "sparkddl" and r.seconds <= CLEAR_WITHIN_S for r in rows)
    clear_fast = sum(r.kind == "sparkddl" and r.seconds <= CLEAR_WITHIN_S and r.clear == "yes"
                     for r in rows)
    ok = sum(r.kind == "ok" for r in rows)
    lines = [f"cases: {len(rows)}; sparkddl errors within {CLEAR_WITHIN_S:g} s: {fast} "
             f"({clear_fast} of them naming the culprit); succeeded as they should: {ok}; "
             f"sparkddl errors slower than {CLEAR_WITHIN_S:g} s: "
             f"{sum(r.kind == 'sparkddl' and r.seconds > CLEAR_WITHIN_S for r in rows)}; "
             f"raw errors: {sum(r.kind in ('raw', 'setup error') for r in rows)}; "
             f"no error where one was expected: {sum(r.kind == 'no error' for r in rows)}; "
             f"findings: {sum(r.kind == 'finding' for r in rows)}; "
             f"hangs: {sum(r.kind == 'HANG' for r in rows)}"]
    return "\n".join(lines)


def details_md(rows: list[Row]) -> str:
    out = ["### Summary", "", summary(rows), ""]
    for title, found in problems(rows).items():
        out += [f"#### {title}: {len(found)}", ""]
        for area in AREAS:
            these = [r for r in found if r.area == area]
            if these:
                out.append(f"- **{area}**: " + "; ".join(
                    f"{r.case} ({r.outcome}, {r.seconds:.1f} s)" for r in these))
        out.append("")
    return "\n".join(out)


def plot(rows: list[Row]) -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt
        areas = [a for a in AREAS if any(r.area == a for r in rows)]
        colors = {"sparkddl": "C2", "ok": "C0", "raw": "C3", "setup error": "C3",
                  "no error": "C1", "finding": "C4", "HANG": "k"}
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2),
                                          gridspec_kw={"width_ratios": [3, 2]})
        rng = np.random.default_rng(0)
        for i, area in enumerate(areas):
            for r in (r for r in rows if r.area == area):
                left.scatter(max(r.seconds, 0.01), i + rng.uniform(-0.25, 0.25),
                             color=colors[r.kind], s=22 if r.clear == "yes" else 40,
                             marker="o" if r.clear == "yes" else "x", alpha=0.8)
        left.axvline(CLEAR_WITHIN_S, color="grey", ls="--", lw=1)
        left.set_xscale("log")
        left.set_yticks(range(len(areas)), areas)
        left.set_xlabel("seconds to the outcome, one mark per case (x: culprit not named; "
                        "< 10 ms drawn at 10 ms; dashed: 10 s)", fontsize=9)
        bottom = np.zeros(len(areas))
        for kind, color in colors.items():
            counts = np.array([sum(r.area == a and r.kind == kind for r in rows)
                               for a in areas])
            if counts.any():
                right.barh(areas, counts, left=bottom, color=color, label=kind)
                bottom += counts
        right.set_xlabel("cases by outcome")
        right.legend(fontsize=8, loc="lower right")
        right.invert_yaxis()
        left.invert_yaxis()
        fig.suptitle("sparkddl under adversarial inputs and faults (local[2])")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    return draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated areas: {', '.join(AREAS)}")
    parser.add_argument("--case", default="", help="only cases whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--write", action="store_true",
                        help="write results/adversarial.* for a subset too (always for all)")
    parser.add_argument("-v", "--verbose", action="store_true", help="full messages")
    args = parser.parse_args()
    only = [a for a in args.only.split(",") if a]
    unknown = set(only) - set(AREAS)
    if unknown:
        parser.error(f"unknown area(s) {', '.join(sorted(unknown))}; areas: {', '.join(AREAS)}")
    cases = [c for c in CASES if (not only or c.area in only) and args.case in c.name]
    cases.sort(key=lambda c: AREAS.index(c.area))
    if args.list:
        for c in cases:
            print(f"{c.area:8s} {c.name}")
        print(f"{len(cases)} cases")
        return
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparkddl-adv-") as tmp:
        rows, spark = run_all(cases, Path(tmp), args.verbose)
        if spark is not None:
            spark.stop()
    wall = time.perf_counter() - started
    print("\n" + summary(rows) + f"\nwall time: {wall:.0f} s")
    for title, found in problems(rows).items():
        if found:
            print(f"\n{title}: {len(found)}")
            for r in found:
                print(f"  [{r.area}] {r.case}: {r.outcome}, {r.seconds:.1f} s, "
                      f"clear={r.clear}: {r.message[:110]}")
    if args.write or (not only and not args.case):
        write_results(
            "adversarial", [r.as_dict() for r in rows],
            ["area", "case", "outcome", "kind", "seconds", "clear", "message", "note"],
            "sparkddl under adversarial inputs and faults (one local[2] session)",
            plot=plot(rows), more_md=details_md(rows),
            notes=f"{len(rows)} cases in {wall:.0f} s. kind: sparkddl = a SparkDDLError "
                  "subclass (CLI: one line 'sparkddl: error', no traceback), raw = any other "
                  "exception, finding = a harness check failed. clear: the message names the "
                  "culprit (the expected substring). seconds: from the call to its outcome.",
            extra={"summary": summary(rows), "wall_s": wall})


if __name__ == "__main__":
    main()
