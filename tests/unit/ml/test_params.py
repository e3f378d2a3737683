"""TorchEstimator's Params as pyspark.ml users meet them (no Spark session needed)."""
from __future__ import annotations

import pytest
import torch

from sparkddl import ConfigError, TorchEstimator


def _estimator(**params):
    return TorchEstimator(model=torch.nn.Linear(4, 2), optimizer="adam",
                          loss=torch.nn.CrossEntropyLoss(), **params)


def test_explain_params_documents_every_param_with_its_default():
    est = _estimator(epochs=3)
    text = est.explainParams()
    for param in est.params:
        assert param.doc.strip() and f"{param.name}: {param.doc}" in text
    assert "current: 3" in text.split("epochs:")[1].splitlines()[0]
    assert "default: 2" in text.split("numWorkers:")[1].splitlines()[0]


def test_copy_with_extra_params_leaves_the_original_alone():
    est = _estimator(epochs=3, readerPool="dummy")
    other = est.copy({est.epochs: 7, est.learningRate: 0.5})
    assert other.uid == est.uid and other is not est
    assert other.getOrDefault("epochs") == 7 and est.getOrDefault("epochs") == 3
    assert other.train_config().learning_rate == 0.5 and est.train_config().learning_rate is None
    assert other.getOrDefault("model") is est.getOrDefault("model")  # the same module object
    assert other.train_config().reader_pool == "dummy"


def test_every_param_reaches_the_training_config():
    """A Param that exists is honoured: changing any one changes the config fit() uses."""
    base = _estimator().train_config()
    changed = {"batchSize": 7, "epochs": 5, "numWorkers": 3, "validation": 0.3,
               "store": "file:///tmp/elsewhere", "strategy": "local_sgd",
               "strategyOptions": {"period": 2}, "snapshotEvery": 2, "bestBy": "val_loss",
               "bestByMode": "min", "earlyStoppingPatience": 4, "finalWeights": "last",
               "learningRate": 0.1, "seed": 9, "shuffleBufferSize": 5, "readerWorkers": 4,
               "readerPool": "dummy", "reader": "arrow", "epochCacheMB": 64, "useGpu": True,
               "timeout": 60,
               "progress": False, "checkpointEvery": 2, "checkpointEverySteps": 10,
               "keepCheckpoints": 5, "maxRestarts": 0, "runId": "r1", "watchdogTimeout": 30.0,
               "featuresCol": "f", "labelCol": "y", "metrics": ["mse"],
               "featureShapes": {"f": [2, 2]}, "sampleWeightCol": "w",
               "lrScheduler": "cosine", "lrSchedulerOptions": {"eta_min": 0.01},
               "lrSchedulerInterval": "step", "precision": "bf16-mixed",
               "backwardPassesPerStep": 2, "gradientClipNorm": 1.0, "gradientClipValue": 0.5,
               "trainStep": len, "onNonFiniteLoss": "skip_batch", "transformFn": dict,
               "minWorkers": 1, "slotWaitTimeout": 30.0, "evaluation": "ranks",
               "trainStepsPerEpoch": 3}
    # the rest are passed to fit() directly (model, optimizer, loss, callbacks) or used by
    # the TorchModel
    elsewhere = {"model", "optimizer", "loss", "callbacks", "predictionCol", "probabilityCol",
                 "rawPredictionCol", "inferenceBatchSize", "inferenceDevice", "mlflow"}
    assert set(changed) | elsewhere == {p.name for p in _estimator().params}
    needs = {"lrSchedulerOptions": {"lrScheduler": "cosine"}}  # a config is valid when made
    for name, value in changed.items():
        config = _estimator(**{name: value}, **needs.get(name, {})).train_config()
        without = _estimator(**needs[name]).train_config() if name in needs else base
        assert config != without, f"{name} is accepted but does not reach the config"


def test_time_limits_must_be_positive_seconds_or_unset():
    for name, value in (("timeout", 0), ("timeout", True), ("watchdogTimeout", -1.0),
                        ("timeout", "60")):
        with pytest.raises(ConfigError, match=r"must be positive seconds or unset \(None\), "
                                              rf"got {value!r}"):
            _estimator(**{name: value}).train_config().validate()
    _estimator(timeout=None, watchdogTimeout=2.5).train_config().validate()


def test_options_of_the_wrong_kind_are_config_errors_naming_what_was_given():
    with pytest.raises(ConfigError, match=r"strategyOptions must be a dict .*got list \['a'\]"):
        _estimator(strategyOptions=["a"]).train_config()
    with pytest.raises(ConfigError, match=r"metrics must be a metric name.*got int 42"):
        _estimator(metrics=42).train_config()


def test_the_generated_params_module_is_current():
    """sparkddl/ml/generated_params.py is written from TrainConfig; an option added there
    without regenerating (`python -m sparkddl.ml.param_schema`) fails here."""
    from sparkddl.ml import param_schema
    assert param_schema.GENERATED.read_text(encoding="utf-8") == param_schema.generate()


def test_params_and_config_fields_and_defaults_are_one_table():
    from sparkddl.config import TrainConfig
    from sparkddl.ml import param_schema
    est, config = _estimator(), TrainConfig()
    # defaults agree: a fresh estimator's config is the schema's default config
    assert est.train_config() == config
    # every config field with a Param round-trips through Param values
    changed = config.replace(features=("a", "b"), feature_shapes={"a": (2, 2)}, epochs=4,
                             metrics=("mse",), strategy_options={"period": 2})
    assert param_schema.train_config(param_schema.param_values(changed)) == changed
    # explicit accessors on both classes, with the Param's doc
    from sparkddl import TorchModel
    assert est.setBatchSize(7).getBatchSize() == 7
    assert TorchModel().setPredictionCol("p").getPredictionCol() == "p"
    assert "rows per step" in TorchEstimator.getBatchSize.__doc__


def test_the_generated_params_are_typed_like_pyspark_s_own():
    """Param[T] attributes, typed getters and setters and a typed constructor; Any only for
    the objects (model, optimizer, loss, callbacks, mlflow, functions, metrics)."""
    import inspect

    from sparkddl.ml import generated_params, param_schema
    text = param_schema.GENERATED.read_text(encoding="utf-8")
    assert "    epochs: Param[int] = Param(" in text
    assert "    featuresCol: Param[str | list[str]] = Param(" in text
    assert "def getMinWorkers(self) -> int | None:" in text
    assert "def setSlotWaitTimeout(self, value: float) -> Self:" in text
    untyped = sorted(p.name for p in param_schema.all_params()
                     if param_schema.value_type(p) == "Any")
    assert untyped == ["callbacks", "loss", "lrScheduler", "metrics", "mlflow", "model",
                       "optimizer", "trainStep", "transformFn"]
    signature = inspect.signature(generated_params.TorchEstimatorBase.__init__)
    assert signature.parameters["numWorkers"].annotation == "int"  # a string (PEP 563)


def test_pyspark_s_own_params_come_from_its_mixins():
    """predictionCol, probabilityCol, rawPredictionCol and seed are pyspark's shared Params,
    so pyspark's tooling recognizes them; the defaults stay sparkddl's."""
    from pyspark.ml.param.shared import (
        HasPredictionCol,
        HasProbabilityCol,
        HasRawPredictionCol,
        HasSeed,
    )

    from sparkddl import TorchModel
    est, model = _estimator(), TorchModel()
    for obj in (est, model):
        assert isinstance(obj, (HasPredictionCol, HasProbabilityCol, HasRawPredictionCol))
        assert obj.getPredictionCol() == "prediction"
        assert obj.getRawPredictionCol() == "rawPrediction"
        assert obj.getProbabilityCol() == "probability"
    assert isinstance(est, HasSeed) and not isinstance(model, HasSeed)
    assert est.getSeed() == 0 and est.setSeed(5).getSeed() == 5
    assert est.train_config().seed == 5


def test_an_estimator_users_errors_name_the_params_not_the_config_fields():
    """fit's checks speak of numWorkers, minWorkers, batchSize (the Params the user set),
    not of the config's num_workers: the same error, its type kept."""
    with pytest.raises(ConfigError, match=r"minWorkers=3 is more than numWorkers=2") as info:
        _estimator(numWorkers=2, minWorkers=3).fit(None)  # refused before the data is read
    assert "num_workers" not in str(info.value) and "min_workers" not in str(info.value)
