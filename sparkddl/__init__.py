"""sparkddl: train PyTorch models on Apache Spark with barrier-mode allreduce.

Names are imported on first use: the ranks import only what they run (sparkddl.task,
sparkddl.train, ...), not pyspark.ml and pandas, which saves about half a second on every
fresh Python worker.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "UntrustedArtifactError": "sparkddl.errors", "read_delta": "sparkddl.tables.delta",
    "read_iceberg": "sparkddl.tables.iceberg",
    "UnsyncedTrainingWarning": "sparkddl.task.frameworks",
}

# computed, so type checkers read the names from the TYPE_CHECKING imports below
__all__ = sorted(_EXPORTS) + ["__version__"]  # pyright: ignore[reportUnsupportedDunderAll]

if TYPE_CHECKING:  # the same names for type checkers and the API reference; never run
    from sparkddl.distributor import TorchDistributor
    from sparkddl.errors import (
        CheckpointError,
        ClusterError,
        ConfigError,
        DataError,
        JobCancelledError,
        NonFiniteLossError,
        SparkDDLError,
        StoreError,
        TrainingFailedError,
        TransformError,
        UntrustedArtifactError,
    )
    from sparkddl.launch.runner import run
    from sparkddl.ml import TorchEstimator, TorchModel, trusted_loading
    from sparkddl.store import Store
    from sparkddl.tables.delta import read_delta
    from sparkddl.tables.iceberg import read_iceberg
    from sparkddl.task.dist import device, init_process_group
    from sparkddl.task.frameworks import UnsyncedTrainingWarning


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
