"""Content fingerprints of DataFrames, so materialized Parquet is reused only when the data
has not changed.

When every leaf of the analyzed plan reads files (or is a range), the fingerprint is the
canonicalized plan plus each input file's path, size and modification time: no data is
scanned. Other leaves (local data, RDDs, JDBC, cached relations) carry data the plan text
does not show, so their fingerprint includes a content hash computed by Spark.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

# leaf plan nodes whose content is fully identified by the plan text plus input file identity.
# Not HiveTableRelation (a Hive table Spark does not convert to a file relation): its
# inputFiles() is the table's folder, whose size and mtime miss rewrites of files inside.
_IDENTIFIED_LEAVES = {"Range", "OneRowRelation"}
FORMAT_VERSION = 1  # bump when the materialized layout changes


def plan_text(df: Any) -> str:
    """The canonicalized analyzed plan: stable across sessions (expression ids normalized)."""
    return str(df._jdf.queryExecution().analyzed().canonicalized().toString())


def leaf_kinds(df: Any) -> list[str]:
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    kinds = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        kind = str(leaf.getClass().getSimpleName())
        if kind == "LogicalRelation":
            relation = str(leaf.relation().getClass().getSimpleName())
            kind = "FileRelation" if relation == "HadoopFsRelation" else f"LogicalRelation:{relation}"
        kinds.append(kind)
    return kinds


def identified_by_files(df: Any) -> bool:
    """False for a Spark Connect DataFrame: its analyzed plan is the server's, so its
    content is hashed instead."""
    if getattr(df, "_jdf", None) is None:
        return False
    return all(k in _IDENTIFIED_LEAVES or k == "FileRelation" for k in leaf_kinds(df))


def input_file_identity(spark: Any, df: Any) -> list[tuple[str, int, int]]:
    """(path, size, modification time) of every input file, through Hadoop's filesystem API
    so that any scheme Spark reads (file, hdfs, s3a, dbfs, ...) works."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out = []
    for path in sorted(df.inputFiles()):
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        status = jpath.getFileSystem(conf).getFileStatus(jpath)
        out.append((path, int(status.getLen()), int(status.getModificationTime())))
    return out


def fingerprint(parts: dict[str, Any]) -> str:
    raw = json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]
