"""TorchEstimator: train a PyTorch model on a DataFrame, as a Spark ML Estimator."""
from __future__ import annotations

from typing import Any

from sparkddl.config import TrainConfig
from sparkddl.errors import ConfigError
from sparkddl.fit.callbacks import Callbacks
from sparkddl.fit.supervisor import FitResult, fit
from sparkddl.ml import architecture, param_schema
from sparkddl.ml.generated_params import HasTorchModelParams, TorchEstimatorBase
from sparkddl.ml.model import TorchModel
from sparkddl.tracking import MlflowTracking, check_setting


class TorchEstimator(TorchEstimatorBase):
    """Fits a PyTorch model on a DataFrame with N ranks of one Spark barrier stage.

    Every argument is a keyword and sets the Param of that name; ``model``, ``optimizer`` and
    ``loss`` are required. Every Param is documented in ``explainParams()``; the training
    options are the fields of ``sparkddl.config.TrainConfig``, under their Param names.

    Examples:
        ```python
        est = TorchEstimator(model=net, optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                             loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                             labelCol="label", batchSize=64, epochs=10, numWorkers=2,
                             validation=0.2, store="file:///tmp/ddl")
        model = est.fit(train_df)          # a TorchModel
        model.transform(test_df)           # adds prediction (and probability) columns
        ```
    """

    def train_config(self) -> TrainConfig:
        """The training Params as the typed, validated ``TrainConfig`` a fit uses (a bad
        value raises ConfigError here, before any Spark job)."""
        return param_schema.train_config({p.name: self.getOrDefault(p.name)
                                    for p in param_schema.config_params()})

    def _fit(self, dataset: Any) -> TorchModel:
        with param_schema.in_param_words():
            return self._fit_in_config_words(dataset)

    def _fit_in_config_words(self, dataset: Any) -> TorchModel:
        for name in (p.name for p in param_schema.OBJECT_PARAMS if p.required):
            if not self.isDefined(name) or self.getOrDefault(name) is None:
                raise ConfigError(f"TorchEstimator needs {name}=...; see help(TorchEstimator)")
        callbacks = Callbacks(self.getOrDefault(self.callbacks))
        check_setting(self.getOrDefault(self.mlflow))
        config = self.train_config()  # a bad option fails here, before an MLflow run starts
        callbacks.fit_start(self)
        tracking = MlflowTracking.begin(self.getOrDefault(self.mlflow),
                                        {p.name: v for p, v in self.extractParamMap().items()})
        try:
            result = fit(dataset.sparkSession, dataset, self.getOrDefault(self.model),
                         self.getOrDefault(self.optimizer), self.getOrDefault(self.loss),
                         config, callbacks=Callbacks(callbacks.items + [tracking])
                         if tracking else callbacks)
            model = self._model_from(result)
        except BaseException as exc:
            if tracking:
                tracking.finish(error=exc)
            raise
        if tracking:
            model.mlflow_model_uri = tracking.finish(model, dataset)
        callbacks.fit_end(model)
        return model

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
        model.task, model.output_width = result.problem.kind, result.problem.output_width
        model.input_specs = result.problem.inputs
        model._transform_fn = self.getOrDefault(self.transformFn)
        model._input_columns = {c.name: c.to_json() for c in result.data.train.columns
                                if c.role == "feature"}
        model.trained_on_gpu = bool(self.getOrDefault(self.useGpu))
        model.epochs_done, model.stopped_early = result.epochs_done, result.stopped_early
        model.steps_per_rank, model.fit_time_s = result.steps_per_rank, result.fit_time_s
        model.phases = dict(result.phases)
        model.restarts = [dict(vars(r), recovery_s=r.recovery_s) for r in result.restarts]
        return model
