"""Spark ML Params of TorchEstimator and TorchModel (camelCase, with defaults and docs)."""
from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters


def _param(name: str, doc: str, conv: Any = TypeConverters.identity) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


def _features(value: Any) -> Any:
    if isinstance(value, str):
        return value
    return TypeConverters.toListString(value)


class HasTorchModelParams(Params):
    """Params shared by the estimator and the model it produces."""

    featuresCol = _param("featuresCol", "feature column, or a list of them; each a Vector, a "
                         "fixed-length numeric array or a numeric column (several columns are "
                         "passed to the model as several inputs)", _features)
    predictionCol = _param("predictionCol", "prediction column name", TypeConverters.toString)
    probabilityCol = _param("probabilityCol", "class probabilities column (classifiers)",
                            TypeConverters.toString)
    rawPredictionCol = _param("rawPredictionCol", "raw model output column (classifiers)",
                              TypeConverters.toString)
    inferenceBatchSize = _param("inferenceBatchSize", "rows per forward pass in transform",
                                TypeConverters.toInt)
    featureShapes = _param("featureShapes", "optional per-feature-column shape, e.g. "
                           "{'features': [1, 8, 8]}")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features", predictionCol="prediction",
                         probabilityCol="probability", rawPredictionCol="rawPrediction",
                         inferenceBatchSize=1024, featureShapes={})

    def feature_columns(self) -> tuple[str, ...]:
        cols = self.getOrDefault(self.featuresCol)
        return (cols,) if isinstance(cols, str) else tuple(cols)


class HasTorchEstimatorParams(HasTorchModelParams):
    model = _param("model", "torch.nn.Module, zero-argument factory returning one, or a name "
                   "(mlp, cnn, package.module:factory)")
    optimizer = _param("optimizer", "factory taking the model's parameters, a torch optimizer "
                       "instance (rebuilt on the workers with all its settings) or a name")
    loss = _param("loss", "loss module, callable (output, label) -> scalar, or a name "
                  "(cross_entropy, mse, bce_with_logits, ...)")
    metrics = _param("metrics", "metric names (accuracy, mse, mae) or callables; default: "
                     "accuracy for classifiers")
    labelCol = _param("labelCol", "label column name", TypeConverters.toString)
    batchSize = _param("batchSize", "rows per step on each worker (global batch = batchSize x "
                       "numWorkers)", TypeConverters.toInt)
    epochs = _param("epochs", "passes over the training data", TypeConverters.toInt)
    numWorkers = _param("numWorkers", "ranks (barrier tasks) to train with", TypeConverters.toInt)
    validation = _param("validation", "fraction of rows held out for validation, or the name of "
                        "a boolean/0-1 column marking them; None: no validation")
    store = _param("store", "where data and run artifacts go (path, file://, hdfs://, s3://, "
                   "dbfs:/)", TypeConverters.toString)
    strategy = _param("strategy", "training strategy name", TypeConverters.toString)
    strategyOptions = _param("strategyOptions", "options of the strategy (dict)")
    snapshotEvery = _param("snapshotEvery", "hand a model snapshot to the driver every N epochs",
                           TypeConverters.toInt)
    bestBy = _param("bestBy", "metric choosing the best snapshot (val_loss, val_accuracy, "
                    "train_loss, ...); default val_loss, or train_loss without validation")
    bestByMode = _param("bestByMode", "min or max: whether a lower or a higher bestBy is better; "
                        "auto: min for losses and errors, max otherwise", TypeConverters.toString)
    earlyStoppingPatience = _param("earlyStoppingPatience", "stop after this many evaluated "
                                   "snapshots without improvement of bestBy; 0 = never",
                                   TypeConverters.toInt)
    finalWeights = _param("finalWeights", "weights of the returned model: best or last",
                          TypeConverters.toString)
    learningRate = _param("learningRate", "if set, overrides the optimizer's learning rate")
    seed = _param("seed", "seed for initialization, data order and the validation split",
                  TypeConverters.toInt)
    shuffleBufferSize = _param("shuffleBufferSize", "rows in each worker's shuffle buffer",
                               TypeConverters.toInt)
    readerWorkers = _param("readerWorkers", "threads reading Parquet ahead on each worker",
                           TypeConverters.toInt)
    readerPool = _param("readerPool", "how each worker reads ahead: thread (readerWorkers "
                        "threads) or dummy (inline, no threads)", TypeConverters.toString)
    reader = _param("reader", "Parquet reader: auto (Petastorm where it loads, else Arrow), "
                    "petastorm or arrow", TypeConverters.toString)
    useGpu = _param("useGpu", "train on the GPUs Spark assigns to the tasks",
                    TypeConverters.toBoolean)
    timeout = _param("timeout", "wall-clock limit of the whole fit in seconds, all attempts "
                     "together (None: no limit)")
    progress = _param("progress", "show progress on the driver", TypeConverters.toBoolean)
    checkpointEvery = _param("checkpointEvery", "write a checkpoint every N epochs (0: never)",
                             TypeConverters.toInt)
    checkpointEverySteps = _param("checkpointEverySteps", "also every N steps inside epochs "
                                  "(0: never)", TypeConverters.toInt)
    keepCheckpoints = _param("keepCheckpoints", "checkpoints kept per run (the newest)",
                             TypeConverters.toInt)
    maxRestarts = _param("maxRestarts", "relaunches of the barrier stage after a failure, each "
                         "resuming from the last good checkpoint", TypeConverters.toInt)
    runId = _param("runId", "resume this earlier run from its last good checkpoint (None: a "
                   "new run)")
    watchdogTimeout = _param("watchdogTimeout", "seconds without progress on a rank before the "
                             "attempt is failed (None: no watchdog)")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(metrics=None, labelCol="label", batchSize=32, epochs=10, numWorkers=2,
                         validation=None, store="file:///tmp/sparkddl", strategy="allreduce",
                         strategyOptions={}, snapshotEvery=1, bestBy=None, bestByMode="auto",
                         earlyStoppingPatience=0, finalWeights="best", learningRate=None,
                         seed=0, shuffleBufferSize=10_000, readerWorkers=2, readerPool="thread",
                         reader="auto", useGpu=False,
                         timeout=None, progress=True, checkpointEvery=1, checkpointEverySteps=0,
                         keepCheckpoints=3, maxRestarts=2, runId=None, watchdogTimeout=900.0)
