"""Spark's own archives on a worker's path keep their directory when pyspark invalidates the
import caches at each task's start (before Python 3.13 every zip importer read its archive
again: ~0.1 s a task); other archives are read again as before."""
from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport

import pytest

from sparkddl.task.archives import keep_spark_archives


def archive(path, package):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{package}/sub/__init__.py", "")
    return str(path)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="Python 3.13's zip importers read "
                    "again only when asked: nothing to keep (tested: returns 0)")
def test_only_sparks_archives_keep_their_directory(tmp_path, monkeypatch):
    spark_zip = archive(tmp_path / "pyspark.zip", "sparkddl_fake_pyspark")
    user_zip = archive(tmp_path / "deps.zip", "sparkddl_fake_user")
    monkeypatch.setattr(sys, "path", [spark_zip, user_zip, *sys.path])
    for name in ("sparkddl_fake_pyspark.sub", "sparkddl_fake_user.sub"):
        importlib.import_module(name)
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.delitem(sys.modules, name.split(".")[0])
    reads = []
    real = zipimport._read_directory  # pyright: ignore[reportAttributeAccessIssue]

    def counted(path):
        reads.append(path)
        return real(path)
    monkeypatch.setattr(zipimport, "_read_directory", counted)
    try:
        assert keep_spark_archives() == 2  # pyspark.zip and its package's directory in it
        assert keep_spark_archives() == 0  # once
        importlib.invalidate_caches()
        assert spark_zip not in reads and user_zip in reads
    finally:
        for path in (spark_zip, user_zip):
            for key in [k for k in sys.path_importer_cache if k.startswith(path)]:
                del sys.path_importer_cache[key]


@pytest.mark.skipif(sys.version_info < (3, 13), reason="Python 3.13 and later only")
def test_nothing_to_keep_on_python_313():
    assert keep_spark_archives() == 0
