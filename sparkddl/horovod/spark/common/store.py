"""Horovod-style Store objects (``horovod.spark.common.store``) for code ported to sparkddl.

They only name where a fit keeps its data and runs: ``prefix_path``. sparkddl's own
:class:`sparkddl.store.Store` does the reading and writing, under its own layout, and the
estimator's ``store`` Param takes any object with a ``prefix_path`` (these, or Horovod's
own). Horovod's options that move parts of the layout elsewhere (``train_path``,
``runs_path``, ...) or log in to HDFS (``user``, ``kerb_ticket``) are refused, naming what
to do instead, rather than dropped.
"""
from __future__ import annotations

from typing import Any

from sparkddl.errors import ConfigError


class Store:
    """Where a fit keeps its prepared data, checkpoints and runs: ``prefix_path``."""

    def __init__(self, prefix_path: str, **options: Any):
        if not isinstance(prefix_path, str) or not prefix_path:
            raise ConfigError(f"{type(self).__name__} needs prefix_path, a path or URL, got "
                              f"{prefix_path!r}")
        if options:
            raise ConfigError(
                f"{type(self).__name__}({', '.join(f'{k}=' for k in options)}) is not "
                "supported: sparkddl keeps the data, checkpoints and runs under prefix_path "
                "in its own layout, and reaches HDFS/S3/DBFS with the cluster's Hadoop and "
                "fsspec settings; give only prefix_path")
        self.prefix_path = prefix_path

    @staticmethod
    def create(prefix_path: str, **options: Any) -> "Store":
        """The Store for ``prefix_path``'s scheme: HDFSStore for hdfs://, DBFSLocalStore
        for dbfs:/ and /dbfs/, else LocalStore (a local path, file://, or another
        filesystem sparkddl reaches through fsspec, e.g. s3://)."""
        if prefix_path.startswith("hdfs://"):
            return HDFSStore(prefix_path, **options)
        if prefix_path.startswith(("dbfs:/", "/dbfs/")):
            return DBFSLocalStore(prefix_path, **options)
        return LocalStore(prefix_path, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.prefix_path!r})"

    def __fspath__(self) -> str:
        return self.prefix_path


class LocalStore(Store):
    """A local (or shared, mounted) directory, as a path or a file:// URL."""


class HDFSStore(Store):
    """An HDFS directory. ``host``/``port`` complete a prefix_path without a scheme."""

    def __init__(self, prefix_path: str, host: str | None = None, port: int | None = None,
                 **options: Any):
        if host is not None and not prefix_path.startswith("hdfs://"):
            prefix_path = f"hdfs://{host}{f':{port}' if port else ''}/{prefix_path.lstrip('/')}"
        super().__init__(prefix_path, **options)


class DBFSLocalStore(Store):
    """A DBFS directory through the /dbfs FUSE mount (dbfs:/x is taken as /dbfs/x)."""

    def __init__(self, prefix_path: str, **options: Any):
        if prefix_path.startswith("dbfs:/"):
            prefix_path = "/dbfs/" + prefix_path[len("dbfs:/"):].lstrip("/")
        super().__init__(prefix_path, **options)
