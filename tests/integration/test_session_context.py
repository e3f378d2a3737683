"""The classic context's answers read in one JVM call where pyspark makes many: they must be
pyspark's own answers."""
from __future__ import annotations

import pytest

from sparkddl.session import cluster_context


@pytest.mark.timeout(60)
def test_the_conf_and_job_tags_read_in_one_call_are_pysparks_own(spark_local):
    sc = spark_local.sparkContext
    assert dict(cluster_context(spark_local).getConf().getAll()) == dict(sc.getConf().getAll())
    sc.addJobTag("sparkddl-a")
    sc.addJobTag("sparkddl-b")
    try:
        assert cluster_context(spark_local).getJobTags() == set(sc.getJobTags()) == {
            "sparkddl-a", "sparkddl-b"}
    finally:
        sc.clearJobTags()
    assert cluster_context(spark_local).getJobTags() == set()
