"""Horovod's Spark estimator API (``horovod.spark``) over sparkddl: see
:mod:`sparkddl.horovod.spark.torch` for what each Horovod keyword becomes."""
from sparkddl.horovod.spark.common.store import DBFSLocalStore, HDFSStore, LocalStore, Store
from sparkddl.horovod.spark.torch import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "Store", "LocalStore", "HDFSStore", "DBFSLocalStore"]
