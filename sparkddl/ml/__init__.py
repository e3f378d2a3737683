"""The DataFrame API: TorchEstimator -> TorchModel (pyspark.ml), usable in Pipelines."""
from sparkddl.ml.architecture import trusted_loading
from sparkddl.ml.estimator import TorchEstimator
from sparkddl.ml.model import TorchModel

__all__ = ["TorchEstimator", "TorchModel", "trusted_loading"]
