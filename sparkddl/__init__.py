"""sparkddl: train PyTorch models on Apache Spark with barrier-mode allreduce."""
from sparkddl.errors import (CheckpointError, ClusterError, ConfigError, DataError, SparkDDLError,
                             StoreError, TrainingFailedError)
from sparkddl.launch.runner import run
from sparkddl.ml import TorchEstimator, TorchModel, trusted_loading
from sparkddl.store import Store
from sparkddl.task.dist import device, init_process_group

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "ClusterError", "ConfigError", "DataError", "SparkDDLError", "Store",
    "StoreError", "TorchEstimator", "TorchModel", "TrainingFailedError", "device",
    "init_process_group", "run", "trusted_loading", "__version__",
]
