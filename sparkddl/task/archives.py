"""Spark's own archives on a Python worker's path, read once per worker instead of at every
task's start.

Spark starts its Python workers with ``pyspark.zip``, py4j's zip and its core jar on
``sys.path``, and pyspark's worker calls ``importlib.invalidate_caches()`` as each task
begins. Before Python 3.13 that makes every zip importer read its archive's directory again:
one importer per package imported from ``pyspark.zip`` (a dozen and more) and the core jar's
5,000 entries (which hold no Python) cost 0.07-0.1 s of every task's start (measured on
Python 3.11 and 3.12; Python 3.13 reads them again only when asked). Those archives are
Spark's installation, which does not change while the application runs, so the workers
sparkddl runs in (the executors' check, the ranks, the scoring UDFs) keep what their
importers read. Other archives (a user's ``--py-files``) are refreshed as before.
"""
from __future__ import annotations

import os
import re
import sys

_SPARKS = re.compile(r"pyspark\.zip|py4j-[^/]*\.zip|spark-core_[^/]*\.jar")


def keep_spark_archives() -> int:
    """Make this process's importers of Spark's own archives keep their directory when
    caches are invalidated; how many were changed (0 on Python 3.13 and later)."""
    if sys.version_info >= (3, 13):
        return 0
    import zipimport
    changed = 0
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter) and \
                "invalidate_caches" not in vars(finder) and \
                _SPARKS.fullmatch(os.path.basename(finder.archive)):
            finder.invalidate_caches = _kept  # type: ignore[method-assign]
            changed += 1
    return changed


def _kept() -> None:
    """An importer of Spark's archives: what it read stays true while the app runs."""
