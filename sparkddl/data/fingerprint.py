"""Content fingerprints of DataFrames, so materialized Parquet is reused only when the data
has not changed.

When every leaf of the analyzed plan reads files (or is a range) and every expression in it
is Spark's own and deterministic, the fingerprint is the canonicalized plan plus each input
file's path, size and modification time: no data is scanned. Other leaves (local data, RDDs,
JDBC, cached relations) carry data the plan text does not show, and so does user code: a
Python, pandas or Scala UDF (or a typed map over objects) is named in the plan text, but its
code and closure are not, so a UDF redefined under the same name in the next notebook cell
would hit the old data. Such plans, and non-deterministic ones, are fingerprinted by a
content hash computed by Spark.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

# leaf plan nodes whose content is fully identified by the plan text plus input file identity.
# Not HiveTableRelation (a Hive table Spark does not convert to a file relation): its
# inputFiles() is the table's folder, whose size and mtime miss rewrites of files inside.
_IDENTIFIED_LEAVES = {"Range", "OneRowRelation"}
# plan nodes and expressions that run user code: Python/pandas/Arrow UDFs and maps, Scala/Java
# UDFs and aggregators, typed Dataset maps over objects, R, piped scripts
_OPAQUE = re.compile(r"UDF|UDAF|UDTF|Udf|Aggregator|InPandas|InArrow|InR$|MapElements|"
                     r"MapPartitions|MapGroups|CoGroup|AppendColumns|ScriptTransformation|"
                     r"Python")
# deterministic to Spark, but not from one day (or user, or database) to the next: a plan that
# filters on current_timestamp() reads other rows tomorrow from the same files
_CLOCK = {"CurrentTimestamp", "Now", "CurrentDate", "LocalTimestamp", "CurrentTimeZone",
          "CurrentUser", "CurrentDatabase", "CurrentCatalog", "CurrentBatchTimestamp"}
FORMAT_VERSION = 1  # bump when the materialized layout changes


def plan_text(df: Any) -> str:
    """The canonicalized analyzed plan: stable across sessions (expression ids normalized)."""
    return str(df._jdf.queryExecution().analyzed().canonicalized().toString())


def leaf_kinds(df: Any) -> list[str]:
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    return [_leaf_kind(leaves.apply(i)) for i in range(leaves.size())]


def _leaf_kind(leaf: Any) -> str:
    kind = str(leaf.getClass().getSimpleName())
    if kind == "LogicalRelation":
        relation = str(leaf.relation().getClass().getSimpleName())
        kind = "FileRelation" if relation == "HadoopFsRelation" else f"LogicalRelation:{relation}"
    return kind


def _identified(kind: str) -> bool:
    return kind in _IDENTIFIED_LEAVES or kind == "FileRelation"


def root_paths(df: Any) -> list[list[str]]:
    """The paths each file scan of the plan was given, as given: the plan text leaves them
    out, and inputFiles() names each file once, but Spark reads a file once per root path
    that holds it (``read.parquet(t, t)`` has every row twice)."""
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    out = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if str(leaf.getClass().getSimpleName()) == "LogicalRelation" and \
                str(leaf.relation().getClass().getSimpleName()) == "HadoopFsRelation":
            paths = leaf.relation().location().rootPaths()
            out.append([str(paths.apply(j).toString()) for j in range(paths.size())])
    return out


def identified_by_files(df: Any) -> bool:
    """False for a Spark Connect DataFrame: its analyzed plan is the server's, so its
    content is hashed instead; False where the plan runs code it does not show
    (:func:`opaque_code`)."""
    if getattr(df, "_jdf", None) is None:
        return False
    if not all(_identified(k) for k in leaf_kinds(df)):
        return False
    opaque = opaque_code(df)
    if opaque:
        log.info("data: the DataFrame's plan runs %s, whose code the plan text does not "
                 "identify: its cache key is a hash of its content", opaque)
        return False
    return True


def opaque_code(df: Any) -> str | None:
    """What in the analyzed plan of ``df`` (a classic DataFrame) makes its text a poor key:
    user code (UDFs, pandas/Arrow maps, typed Dataset maps), whose body and closure the text
    does not show, a non-deterministic or clock-dependent expression, or a subquery over data
    other than files; None where there is none."""
    pending = [df._jdf.queryExecution().analyzed()]
    while pending:  # plan nodes, the plans of subqueries in their expressions included
        node = pending.pop()
        name = str(node.getClass().getSimpleName())
        if _OPAQUE.search(name):
            return f"{name} (user code)"
        exprs = node.expressions()
        for i in range(exprs.size()):
            found = _opaque_expression(exprs.apply(i))
            if found:
                return found
        children, subqueries = node.children(), node.subqueries()
        if not children.size() and not _identified(_leaf_kind(node)):
            return f"a subquery over {_leaf_kind(node)}"
        pending.extend(children.apply(i) for i in range(children.size()))
        pending.extend(subqueries.apply(i) for i in range(subqueries.size()))
    return None


def _opaque_expression(root: Any) -> str | None:
    pending = [root]
    while pending:
        expr = pending.pop()
        name = str(expr.getClass().getSimpleName())
        if _OPAQUE.search(name):
            return f"{name} {str(expr.prettyName())!r} (user code)"
        if name in _CLOCK:
            return f"{name}, whose value changes with the clock or the session"
        children = expr.children()
        kids = [children.apply(i) for i in range(children.size())]
        if not expr.deterministic():
            random = [k for k in kids if not k.deterministic()]
            if not random:  # the source of it, not the aliases and calls around it
                return f"the non-deterministic expression {name}"
            kids = random
        pending.extend(kids)
    return None


def input_file_identity(spark: Any, df: Any) -> list[tuple[str, int, int]]:
    """(path, size, modification time) of every input file, through Hadoop's filesystem API
    so that any scheme Spark reads (file, hdfs, s3a, dbfs, ...) works."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out = []
    for path in sorted(df.inputFiles()):
        status = _status(jvm, conf, path)
        out.append((path, int(status.getLen()), int(status.getModificationTime())))
    return out


def _status(jvm: Any, conf: Any, path: str) -> Any:
    """The Hadoop file status of ``path`` as inputFiles() names it: a %-encoded URI from
    Spark's own file index, the path as it is from Delta Lake's (which Hadoop's Path(String)
    takes; a URI cannot hold a space)."""
    from py4j.protocol import Py4JJavaError
    try:
        jpath = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(path))
        return jpath.getFileSystem(conf).getFileStatus(jpath)
    except Py4JJavaError:  # not a URI, or not the file it names once decoded
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        return jpath.getFileSystem(conf).getFileStatus(jpath)


def fingerprint(parts: dict[str, Any]) -> str:
    raw = json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]
