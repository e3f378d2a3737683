"""Petastorm reads Parquet that Spark wrote, in this environment.

Read through the Reader/worker sparkddl uses (``petastorm_source._open_reader`` over its
``InlinePool``), not ``make_batch_reader``'s default ThreadPool: that pool's
``get_results`` checks "all workers done" and "ventilator completed" one after the other,
so when the ventilator thread queues every row group between the two checks the read ends
with no batches at all (seen here: this test once got ``[]`` from a 3-file table in the
full suite). The read is repeated so that an early end would show."""
from __future__ import annotations

import pytest

from tests.stacks import needs_petastorm


@needs_petastorm
@pytest.mark.timeout(120)
def test_petastorm_reads_spark_parquet(spark_local, tmp_path):
    from petastorm.workers_pool import EmptyResultError
    from pyarrow import fs as pafs

    from sparkddl.data.petastorm_source import InlinePool, _open_reader
    from sparkddl.data.plan import Piece
    from sparkddl.tables.parquet import list_row_groups

    df = spark_local.range(1000).selectExpr("id", "cast(id * 2 as float) as x",
                                            "array(cast(id as double), 1.0D) as v")
    df.repartition(3).write.parquet(str(tmp_path / "t"))
    groups = list_row_groups(pafs.LocalFileSystem(), str(tmp_path / "t"))
    every = [Piece(i, 0, g.rows) for i, g in enumerate(groups) if g.rows]  # the whole table
    for attempt in range(20):
        pool = InlinePool()
        reader = _open_reader(f"file://{tmp_path / 't'}", ["id", "x", "v"], pool, every,
                              seed=attempt + 1, shuffle_row_groups=True, shuffle_rows=True)
        ids, total_x = [], 0.0
        try:
            while True:
                try:
                    batch = pool.get_results()
                except EmptyResultError:
                    break
                ids.extend(batch.column("id").to_pylist())
                total_x += sum(batch.column("x").to_pylist())
                assert all(len(v) == 2 for v in batch.column("v").to_pylist())
        finally:
            reader.stop()
            reader.join()
        assert sorted(ids) == list(range(1000)), f"read {attempt}: {len(ids)} rows"
        assert total_x == pytest.approx(2 * sum(range(1000)))
