"""Where a run keeps its data, checkpoints, snapshots and history.

Layout under a store root::

    data/<fingerprint>/{train,val}/part-*.parquet   materialized training data (reused)
    data/<fingerprint>/meta.json                    written last: marks the data complete
    runs/<run_id>/run.json                          what the run trains on (checked on resume)
    runs/<run_id>/history.json                      the history, written when the fit ends or fails
    runs/<run_id>/checkpoints/ snapshots/           checkpoints; snapshots too large for the channel

Rank logs are forwarded to the driver's log as they happen; they are not kept in the Store.

Filesystems: ``file`` (plain paths too, Unity Catalog Volumes' ``/Volumes/...`` included),
``hdfs`` and ``s3`` through pyarrow's own; every other scheme fsspec knows (``gs``,
``abfss``, ``az``, ``memory``, ...) through fsspec, wrapped as a pyarrow filesystem, so the
readers have one code path; ``dbfs:/`` through the ``/dbfs`` FUSE mount where there is one,
else through fsspec's Databricks filesystem (the DBFS REST API, with ``DATABRICKS_HOST`` and
``DATABRICKS_TOKEN``), as on Databricks' standard (shared) compute, which has no mount.
"""
from __future__ import annotations

import functools
import logging
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from sparkddl.errors import StoreError
from sparkddl.store import faults

log = logging.getLogger(__name__)

NATIVE = ("file", "hdfs", "s3", "dbfs")  # pyarrow's own filesystems (dbfs: the mount)
_ALIASES = {"s3a": "s3", "s3n": "s3"}
DBFS_MOUNT = "/dbfs"
VOLUMES = "/Volumes/"  # Unity Catalog Volumes: a local path in Python, dbfs:/Volumes in Spark
OBJECT_STORES = ("s3", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss")


# schemes whose fsspec package registers them only once installed: the package to name
PACKAGES = {"abfs": "adlfs", "abfss": "adlfs", "az": "adlfs", "gs": "gcsfs", "gcs": "gcsfs"}


def fsspec_schemes() -> set[str]:
    """Schemes fsspec can open (its registry: installed or known, with the package named)."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return set(PACKAGES)
    return set(known_implementations) | set(registry) | set(PACKAGES)


@dataclass(frozen=True)
class Store:
    """A root location on a filesystem pyarrow can reach.

    ``root`` is the canonical URI (``file:///abs``, ``hdfs://nn:8020/p``, ``s3://bucket/p``,
    ``dbfs:/p``). Python readers use ``url()`` (``dbfs:/`` becomes ``file:///dbfs/...``, the
    FUSE mount Databricks provides); Spark writers use ``spark_url()`` (``s3a://`` for S3).
    """

    root: str

    @classmethod
    def from_uri(cls, uri: "str | os.PathLike[str] | Store") -> "Store":
        if isinstance(uri, Store):
            return uri
        return cls(normalize_uri(os.fspath(uri)))

    @property
    def scheme(self) -> str:
        return self.root.split(":", 1)[0]

    # ---- layout ----
    def url(self, *parts: str) -> str:
        """Canonical URI for pyarrow / Petastorm readers."""
        joined = _join(self.root, *parts)
        if self.scheme == "dbfs" and _dbfs_mounted():
            return "file://" + DBFS_MOUNT + _path_of(joined)
        return joined

    def spark_url(self, *parts: str) -> str:
        """URI for Spark's readers and writers."""
        joined = _join(self.root, *parts)
        if self.scheme == "s3":
            return "s3a" + joined[len("s3"):]
        if self.scheme == "file" and _path_of(joined).startswith(VOLUMES):
            return "dbfs:" + _path_of(joined)  # what Databricks' Spark reads Volumes as
        return joined

    def data_url(self, fingerprint: str, *parts: str) -> str:
        return self.url("data", fingerprint, *parts)

    def run_url(self, run_id: str, *parts: str) -> str:
        return self.url("runs", run_id, *parts)

    # ---- filesystem ----
    @functools.cached_property
    def _filesystem(self) -> Any:
        return _make_filesystem(self)

    def filesystem(self) -> Any:
        """The pyarrow filesystem for this store (created on first use)."""
        return self._filesystem

    def fs_path(self, url: str) -> str:
        """Path of ``url`` (from :meth:`url`) inside :meth:`filesystem`."""
        scheme, netloc, path = split_uri(url)
        if scheme == "s3":
            return netloc + path
        if scheme == "dbfs":  # the DBFS API takes absolute paths
            return path or "/"
        if scheme not in ("file", "hdfs"):  # fsspec's own path for its filesystem
            return _fsspec_filesystem(self.root)._strip_protocol(url)
        return path

    def exists(self, url: str) -> bool:
        from pyarrow import fs as pafs
        return self.filesystem().get_file_info(self.fs_path(url)).type != pafs.FileType.NotFound

    def read_bytes(self, url: str) -> bytes:
        with self.filesystem().open_input_stream(self.fs_path(url)) as f:
            return f.read()

    def write_bytes(self, url: str, data: bytes) -> None:
        """Write atomically: readers see the old file or the whole new one, never a part,
        and a failed write leaves nothing behind. A full disk, a quota, a read-only mount or
        a missing permission raises a StoreError naming ``url`` and the space left."""
        fs, path = self.filesystem(), self.fs_path(url)
        with faults.explained(url, len(data)):
            fs.create_dir(posixpath.dirname(path), recursive=True)
            if self.scheme in OBJECT_STORES or self.scheme == "memory":  # one PUT is atomic
                with fs.open_output_stream(path) as f:
                    f.write(data)
                return
            tmp = f"{url}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with fs.open_output_stream(self.fs_path(tmp)) as f:
                    f.write(data)
                fs.move(self.fs_path(tmp), path)
            except BaseException:
                # a part written to a full disk holds the space the next write needs (and
                # this happens before the error is explained, so it reports the space freed)
                self.discard(tmp)
                raise

    def delete(self, url: str) -> None:
        from pyarrow import fs as pafs
        fs, path = self.filesystem(), self.fs_path(url)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(path)

    def discard(self, url: str) -> None:
        """Delete what a failed write left at ``url``; a failure to do so is logged, never
        raised over the error that made the write fail."""
        try:
            self.delete(url)
        except Exception as exc:  # noqa: BLE001 - e.g. a read-only mount: nothing was written
            log.warning("could not remove %s, left by a failed write: %s; delete it to free "
                        "its space", url, exc)

    def listdir(self, url: str) -> list[str]:
        """Base names directly under ``url`` (empty if it does not exist)."""
        from pyarrow import fs as pafs
        selector = pafs.FileSelector(self.fs_path(url), allow_not_found=True)
        return sorted(posixpath.basename(i.path) for i in self.filesystem().get_file_info(selector))

    def check_shared(self) -> None:
        """Fail early if the executors cannot reach this store (an in-memory filesystem lives
        in one process)."""
        if self.scheme == "memory":
            raise StoreError(f"store {self.root} is in this process's memory, which Spark's "
                             "executors cannot reach; give a path or a shared filesystem "
                             "(file:// on one machine, s3://, gs://, abfss://, dbfs:/, ...)")

    def check_writable(self) -> None:
        """Fail early, with the location in the message, if the store cannot be written."""
        probe = self.url(f".write-probe-{uuid.uuid4().hex[:8]}")
        try:
            self.write_bytes(probe, b"ok")
            self.delete(probe)
        except StoreError:
            raise  # a storage fault, already explained with the path and what to do
        except Exception as exc:
            raise StoreError(f"store {self.root} is not writable ({exc}); choose a location "
                             "this user and the executors can write") from exc


# scheme, then //authority where there is one, then the path: a store's URIs name paths as
# they are (never %-encoded), so '?' and '#' are part of the path, not a query or fragment
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(?://([^/]*))?(.*)", re.S)


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme in lower case, authority, path) of a store URI or a plain path (scheme '')."""
    match = _URI.fullmatch(uri)
    if match is None:
        return "", "", uri
    return match.group(1).lower(), match.group(2) or "", match.group(3)


def decode_hadoop_uri(uri: str) -> str:
    """A file or folder named by Spark (``inputFiles()``, a relation's root paths,
    ``Path.toUri()``: %-encoded URIs) as a store URI, which names the path as it is: a
    folder called ``a b`` arrives as ``a%20b``. Decoded here, once, where Spark hands it
    over."""
    return unquote(uri)


def normalize_uri(uri: str) -> str:
    """Canonical URI of a store root; plain paths become ``file://`` absolute URIs."""
    if not uri:
        raise StoreError("store location is empty; give a path or a URI such as file:///tmp/ddl")
    given, netloc, path = split_uri(uri)
    scheme = _ALIASES.get(given, given)
    if scheme in ("", "file"):
        return "file://" + os.path.abspath(os.path.expanduser(path)).rstrip("/")
    if scheme not in NATIVE and scheme not in fsspec_schemes():
        raise StoreError(f"unsupported store URI {uri!r}: scheme {given!r}; use one of "
                         "file:// (or a plain path, /Volumes/... included), hdfs://, s3:// "
                         "(s3a://), dbfs:/, or a scheme fsspec knows (gs://, abfss://, ...)")
    if scheme == "dbfs":  # dbfs:/a, dbfs:///a and dbfs://a all name /a on DBFS
        path = posixpath.normpath("/" + (netloc + path).lstrip("/"))
        return "dbfs:" + (path.rstrip("/") or "/")
    if scheme == "s3" and not netloc:
        raise StoreError(f"S3 store URI {uri!r} has no bucket; use s3://bucket/prefix")
    path = posixpath.normpath(path).rstrip("/") if path not in ("", "/") else ""
    return f"{scheme}://{netloc}{path}"


def _join(root: str, *parts: str) -> str:
    clean = [p.strip("/") for p in parts if p and p.strip("/")]
    if not clean:
        return root
    return root.rstrip("/") + "/" + "/".join(clean)


def _path_of(uri: str) -> str:
    return split_uri(uri)[2] or "/"


def _dbfs_mounted() -> bool:
    return os.path.isdir(DBFS_MOUNT)


def _make_filesystem(store: Store) -> Any:
    from pyarrow import fs as pafs
    if store.scheme == "file" or (store.scheme == "dbfs" and _dbfs_mounted()):
        return pafs.LocalFileSystem()
    if store.scheme == "dbfs" and not (os.environ.get("DATABRICKS_HOST") and
                                       os.environ.get("DATABRICKS_TOKEN")):
        raise StoreError(f"store {store.root} needs the {DBFS_MOUNT} FUSE mount (Databricks "
                         "clusters with it) or DATABRICKS_HOST and DATABRICKS_TOKEN for the "
                         "DBFS API (standard compute without the mount); elsewhere use a "
                         "file://, s3:// or /Volumes/... store")
    if store.scheme in ("hdfs", "s3"):
        try:
            fs, _ = pafs.FileSystem.from_uri(store.url())
        except Exception as exc:
            raise StoreError(f"cannot open store {store.root}: {exc}") from exc
        return fs
    return pafs.PyFileSystem(pafs.FSSpecHandler(_fsspec_filesystem(store.root)))


@functools.cache
def _fsspec_filesystem(root: str) -> Any:
    """The fsspec filesystem of a store root; a StoreError names the package a scheme needs."""
    import fsspec
    from fsspec.registry import known_implementations, registry
    scheme = root.split(":", 1)[0]
    known = scheme in registry or scheme in known_implementations
    try:
        if scheme == "dbfs":
            return fsspec.filesystem("dbfs", instance=urlparse(
                os.environ["DATABRICKS_HOST"]).netloc or os.environ["DATABRICKS_HOST"],
                token=os.environ["DATABRICKS_TOKEN"])
        # the URL's own options too (an abfss:// URL names its storage account)
        return fsspec.core.url_to_fs(root)[0]
    except ImportError as exc:
        hint = f"pip install {PACKAGES[scheme]}" if scheme in PACKAGES else str(exc)
        raise StoreError(f"store {root}: the {scheme}:// filesystem's package is not installed "
                         f"({hint}); install it on the driver and the executors") from exc
    except Exception as exc:
        if not known and scheme in PACKAGES:  # registered only once its package is installed
            raise StoreError(f"store {root}: the {scheme}:// filesystem's package is not "
                             f"installed (pip install {PACKAGES[scheme]}); install it on the "
                             "driver and the executors") from exc
        raise StoreError(f"cannot open store {root}: {type(exc).__name__}: {exc}") from exc
