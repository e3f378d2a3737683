"""sparkddl: train PyTorch models on Apache Spark with barrier-mode allreduce."""
from sparkddl.errors import (CheckpointError, ClusterError, ConfigError, DataError, SparkDDLError,
                             StoreError, TrainingFailedError)
from sparkddl.launch.runner import run
from sparkddl.task.dist import device, init_process_group

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "ClusterError", "ConfigError", "DataError", "SparkDDLError", "StoreError",
    "TrainingFailedError", "device", "init_process_group", "run", "__version__",
]
