"""Petastorm reads Parquet that Spark wrote, in this environment."""
from __future__ import annotations

import pytest

from tests.stacks import needs_petastorm


@needs_petastorm
@pytest.mark.timeout(120)
def test_petastorm_reads_spark_parquet(spark_local, tmp_path):
    from petastorm import make_batch_reader

    df = spark_local.range(1000).selectExpr("id", "cast(id * 2 as float) as x",
                                            "array(cast(id as double), 1.0D) as v")
    df.repartition(3).write.parquet(str(tmp_path / "t"))
    ids, total_x = [], 0.0
    with make_batch_reader(f"file://{tmp_path / 't'}", num_epochs=1, workers_count=2) as reader:
        for batch in reader:
            ids.extend(batch.id.tolist())
            total_x += float(batch.x.sum())
            assert batch.v.shape[1:] == (2,) or len(batch.v[0]) == 2
    assert sorted(ids) == list(range(1000))
    assert total_x == pytest.approx(2 * sum(range(1000)))
