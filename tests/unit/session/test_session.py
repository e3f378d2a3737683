"""sparkddl.session: the one place that tells classic and Connect sessions apart, and what a
master's name and an executor's error text tell without asking the cluster. No Spark."""
from __future__ import annotations

import os

import pytest

from sparkddl.session import ConnectContext, is_connect
from sparkddl.session.masters import (
    local_cluster,
    master_slots,
    missing_module,
    missing_module_reason,
)


class _Conf:
    def get(self, key, default=None):
        return {"spark.master": "local[3]"}.get(key, default)


class _ConnectSession:
    """Stands where pyspark.sql.connect's SparkSession stands: its module is what counts."""
    conf = _Conf()


_ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_connect_sessions_and_their_contexts_are_connect_and_nothing_else_is():
    session = _ConnectSession()
    assert is_connect(session)
    context = ConnectContext(session)
    assert is_connect(context) and context.defaultParallelism == 3

    class Classic:  # a SparkContext has no is_connect; a method of that name is not a yes
        def is_connect(self):
            return True
    assert not is_connect(Classic()) and not is_connect(object())


@pytest.mark.parametrize("master, slots", [
    ("local", 1), ("local[2]", 2), ("local[4, 3]", 4), ("local-cluster[2, 1, 1024]", 2),
    ("local-cluster[3,2,512]", 6), ("local[*]", os.cpu_count() or 1),
    ("spark://10.0.0.1:7077", None), ("yarn", None)])
def test_local_masters_tell_their_slots_by_name(master, slots):
    assert master_slots(master) == slots


def test_local_cluster_shape_and_the_missing_module_named_from_spark_text():
    assert local_cluster("local-cluster[2, 1, 1024]") == (2, 1)
    assert local_cluster("local[2]") is None
    text = "PythonException: ... ModuleNotFoundError: No module named 'sparkddl.task'"
    assert missing_module(text) == "sparkddl.task"
    assert missing_module("ValueError: boom") is None
    assert "PYSPARK_PYTHON" in missing_module_reason("torch")


def test_a_conf_read_in_one_call_is_split_back_into_its_entries():
    from sparkddl.session.cluster import ConfSnapshot
    text = ("spark.app.name=a=b\nspark.driver.extraJavaOptions=-Da=1\n-Db=2 x=y\n"
            "spark.master=local[2]\nzeta.custom=1")
    conf = ConfSnapshot.parse(text)
    assert conf.getAll() == [("spark.app.name", "a=b"),
                             ("spark.driver.extraJavaOptions", "-Da=1\n-Db=2 x=y"),
                             ("spark.master", "local[2]"), ("zeta.custom", "1")]
    assert conf.get("spark.master") == "local[2]" and conf.get("nope", "d") == "d"
    assert conf.contains("zeta.custom") and ConfSnapshot.parse("").getAll() == []
