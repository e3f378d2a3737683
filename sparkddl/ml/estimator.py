"""TorchEstimator: train a PyTorch model on a DataFrame, as a Spark ML Estimator."""
from __future__ import annotations

from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator

from sparkddl.config import StrategyConfig, TrainConfig
from sparkddl.errors import ConfigError
from sparkddl.launch.fit import FitResult, fit
from sparkddl.ml import architecture
from sparkddl.ml.model import TorchModel
from sparkddl.ml.params import HasTorchEstimatorParams, HasTorchModelParams


def _accessors(cls: type) -> type:
    """Spark-style setX/getX for every Param of the class."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = getattr(cls, name)
        if type(attr).__name__ != "Param":
            continue
        cap = name[0].upper() + name[1:]
        if not hasattr(cls, f"set{cap}"):
            setattr(cls, f"set{cap}", lambda self, value, _n=name: self._set(**{_n: value}))
        if not hasattr(cls, f"get{cap}"):
            setattr(cls, f"get{cap}", lambda self, _n=name: self.getOrDefault(_n))
    return cls


def _metrics(metrics: Any) -> Any:
    """One name or callable, several, or a name -> callable dict."""
    if metrics is None or isinstance(metrics, dict):
        return metrics
    if isinstance(metrics, str) or callable(metrics):
        return (metrics,)
    return tuple(metrics)


@_accessors
class TorchEstimator(Estimator, HasTorchEstimatorParams):
    """Fits a PyTorch model on a DataFrame with N ranks of one Spark barrier stage.

    >>> est = TorchEstimator(model=net, optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
    ...                      loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
    ...                      labelCol="label", batchSize=64, epochs=10, numWorkers=2,
    ...                      validation=0.2, store="file:///tmp/ddl")
    >>> model = est.fit(train_df)          # a TorchModel
    >>> model.transform(test_df)           # adds prediction (and probability) columns

    Every Param is documented in ``explainParams()``.
    """

    @keyword_only
    def __init__(self, *, model: Any = None, optimizer: Any = None, loss: Any = None,
                 metrics: Any = None, featuresCol: Any = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", batchSize: int = 32, epochs: int = 10,
                 numWorkers: int = 2, validation: Any = None,
                 store: str = "file:///tmp/sparkddl", strategy: str = "allreduce",
                 strategyOptions: Any = None, snapshotEvery: int = 1, bestBy: Any = None,
                 bestByMode: str = "auto",
                 earlyStoppingPatience: int = 0, finalWeights: str = "best",
                 learningRate: Any = None, seed: int = 0, shuffleBufferSize: int = 10_000,
                 readerWorkers: int = 2, readerPool: str = "thread", reader: str = "auto",
                 useGpu: bool = False,
                 timeout: Any = None,
                 progress: bool = True, inferenceBatchSize: int = 1024,
                 featureShapes: Any = None, checkpointEvery: int = 1,
                 checkpointEverySteps: int = 0, keepCheckpoints: int = 3, maxRestarts: int = 2,
                 runId: Any = None, watchdogTimeout: Any = 900.0):
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "TorchEstimator":
        return self._set(**self._input_kwargs)

    def train_config(self) -> TrainConfig:
        """The Params as the typed config everything below works with."""
        g = self.getOrDefault
        return TrainConfig(
            features=self.feature_columns(), label=g(self.labelCol), epochs=g(self.epochs),
            batch_size=g(self.batchSize), num_workers=g(self.numWorkers),
            validation=g(self.validation), store=g(self.store), seed=g(self.seed),
            snapshot_every=g(self.snapshotEvery), best_by=g(self.bestBy),
            best_mode=g(self.bestByMode),
            early_stopping_patience=g(self.earlyStoppingPatience),
            final_weights=g(self.finalWeights), learning_rate=g(self.learningRate),
            metrics=_metrics(g(self.metrics)),
            feature_shapes={k: tuple(v) for k, v in (g(self.featureShapes) or {}).items()},
            shuffle_buffer=g(self.shuffleBufferSize), reader_workers=g(self.readerWorkers),
            reader_pool=g(self.readerPool), reader=g(self.reader),
            use_gpu=g(self.useGpu), timeout_s=g(self.timeout),
            strategy=StrategyConfig(g(self.strategy), dict(g(self.strategyOptions) or {})),
            progress=g(self.progress), checkpoint_every=g(self.checkpointEvery),
            checkpoint_every_steps=g(self.checkpointEverySteps),
            keep_checkpoints=g(self.keepCheckpoints), max_restarts=g(self.maxRestarts),
            run_id=g(self.runId), watchdog_s=g(self.watchdogTimeout))

    def _fit(self, dataset: Any) -> TorchModel:
        for name in ("model", "optimizer", "loss"):
            if not self.isDefined(name) or self.getOrDefault(name) is None:
                raise ConfigError(f"TorchEstimator needs {name}=...; see help(TorchEstimator)")
        result = fit(dataset.sparkSession, dataset, self.getOrDefault(self.model),
                     self.getOrDefault(self.optimizer), self.getOrDefault(self.loss),
                     self.train_config())
        return self._model_from(result)

    def _model_from(self, result: FitResult) -> TorchModel:
        model = TorchModel()
        for param in HasTorchModelParams().params:
            if self.isSet(param.name):
                model._set(**{param.name: self.getOrDefault(param.name)})
        model._factory = result.model_factory
        model._arch = architecture.describe(result.model_factory)
        model._state = result.state
        model.history = result.history
        model.run_id, model.chosen_epoch, model.best_by = (result.run_id, result.chosen_epoch,
                                                           result.best_by)
        model.task, model.output_width = result.task.kind, result.task.output_width
        model.epochs_done, model.stopped_early = result.epochs_done, result.stopped_early
        model.steps_per_rank, model.fit_time_s = result.steps_per_rank, result.fit_time_s
        model.restarts = [dict(vars(r), recovery_s=r.recovery_s) for r in result.restarts]
        return model
