"""sparkddl: train PyTorch models on Apache Spark with barrier-mode allreduce.

Names are imported on first use: the ranks import only what they run (sparkddl.task,
sparkddl.train, ...), not pyspark.ml and pandas, which saves about half a second on every
fresh Python worker.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointError": "sparkddl.errors", "ClusterError": "sparkddl.errors",
    "ConfigError": "sparkddl.errors", "DataError": "sparkddl.errors",
    "SparkDDLError": "sparkddl.errors", "StoreError": "sparkddl.errors",
    "TrainingFailedError": "sparkddl.errors", "Store": "sparkddl.store",
    "TorchEstimator": "sparkddl.ml", "TorchModel": "sparkddl.ml",
    "trusted_loading": "sparkddl.ml", "run": "sparkddl.launch.runner",
    "device": "sparkddl.task.dist", "init_process_group": "sparkddl.task.dist",
    "TorchDistributor": "sparkddl.distributor", "NonFiniteLossError": "sparkddl.errors",
    "TransformError": "sparkddl.errors", "JobCancelledError": "sparkddl.errors",
    "UntrustedArtifactError": "sparkddl.errors", "read_delta": "sparkddl.data.delta",
    "read_iceberg": "sparkddl.data.iceberg",
    "UnsyncedTrainingWarning": "sparkddl.task.frameworks",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    """The public names of ``__all__``, imported on first use. Submodules are reached the
    usual way (``import sparkddl.models``), not handed out here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sparkddl' has no attribute {name!r}; its public names "
                             f"are {', '.join(__all__)}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
