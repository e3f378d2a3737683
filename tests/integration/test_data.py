"""The data plane on real Spark, real Parquet and real Petastorm."""
from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import sparkddl
from sparkddl.data import DataSpec, epoch_batches, prepare
from sparkddl.errors import DataError


def ids_per_epoch(plan, epochs: int) -> list[list[int]]:
    """Every rank reads its shard; rank 0 returns all ranks' ids for each epoch."""
    import torch.distributed as dist
    sparkddl.init_process_group()
    rank = dist.get_rank()
    out = []
    for epoch in range(epochs):
        batches = list(epoch_batches(plan, rank, epoch))
        assert len(batches) == plan.steps_per_epoch
        assert all(len(b["id"]) == plan.batch_size for b in batches)
        mine = torch.cat([b["id"] for b in batches]).tolist()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        out.append([i for ids in everyone for i in ids])
    return out


def train_briefly(plan, epochs: int) -> dict:
    """A tiny DDP model over the shard: proves an uneven layout cannot deadlock allreduce."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    sparkddl.init_process_group()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(epochs):
        for b in epoch_batches(plan, dist.get_rank(), epoch):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()
            opt.step()
            steps += 1
    return {"steps": steps}


@pytest.mark.timeout(180)
def test_two_ranks_see_training_set_exactly_once_per_epoch(spark, tmp_path):
    df = spark.range(1024).selectExpr("id", "cast(id as double) as x")
    prepared = prepare(df, DataSpec.of("x", extra="id"), num_workers=2, batch_size=16,
                       store=tmp_path / "store")
    plan = prepared.train.plan(2, 16, seed=7)
    assert plan.rows_per_epoch == 1024
    epochs = sparkddl.run(ids_per_epoch, plan, 2, num_workers=2, spark=spark, timeout=120)
    for ids in epochs:
        assert len(ids) == 1024 and sorted(ids) == list(range(1024))
        assert sum(ids) == 1024 * 1023 // 2
    assert epochs[0] != epochs[1]  # reshuffled every epoch


def _parquet(path, row_groups: int, rows_per_group: int = 400) -> str:
    n = row_groups * rows_per_group
    x = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32)
    table = pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())),
                      "y": np.arange(n, dtype=np.float64)})
    path.mkdir()
    pq.write_table(table, path / "part-0.parquet", row_group_size=rows_per_group)
    assert pq.ParquetFile(path / "part-0.parquet").num_row_groups == row_groups
    return f"file://{path}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row_groups", [1, 3])
def test_few_row_groups_train_on_two_ranks(spark, tmp_path, row_groups):
    url = _parquet(tmp_path / "ds", row_groups)
    prepared = prepare(url, DataSpec.of("x", "y"), num_workers=2, batch_size=32)
    plan = prepared.train.plan(2, 32)
    out = sparkddl.run(train_briefly, plan, 2, num_workers=2, spark=spark, timeout=120)
    assert out["steps"] == 2 * plan.steps_per_epoch > 0


def read_first_batch(plan) -> dict:
    return next(iter(epoch_batches(plan, int(os.environ.get("RANK", 0)), 0)))


@pytest.mark.timeout(180)
def test_vector_array_and_scalar_columns_arrive_as_tensors(spark, tmp_path):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        IntegerType,
        LongType,
        StructField,
        StructType,
    )
    rows = [(i, Vectors.dense([i, 2.0 * i, 3.0 * i]) if i % 2 else Vectors.sparse(3, [0], [i]),
             [float(i), 1.0], [i, i + 1], float(i) / 2, i % 3) for i in range(256)]
    schema = StructType([StructField("id", LongType()), StructField("vec", VectorUDT()),
                         StructField("arr", ArrayType(DoubleType())),
                         StructField("iarr", ArrayType(IntegerType())),
                         StructField("s", DoubleType()), StructField("label", IntegerType())])
    df = spark.createDataFrame(rows, schema)
    spec = DataSpec.of(["vec", "arr", "iarr", "s"], "label", "id", shapes={"arr": (1, 2)})
    prepared = prepare(df, spec, num_workers=2, batch_size=8, store=tmp_path / "store")
    plan = prepared.train.plan(2, 8)
    batch = sparkddl.run(read_first_batch, plan, num_workers=2, spark=spark)
    assert batch["vec"].dtype == torch.float32 and batch["vec"].shape == (8, 3)
    assert batch["arr"].dtype == torch.float32 and batch["arr"].shape == (8, 1, 2)
    assert batch["iarr"].dtype == torch.float32 and batch["iarr"].shape == (8, 2)
    assert batch["s"].dtype == torch.float32 and batch["s"].shape == (8,)
    assert batch["label"].dtype == torch.int64 and batch["id"].dtype == torch.int64
    for k, i in enumerate(batch["id"].tolist()):
        want_vec = [i, 2.0 * i, 3.0 * i] if i % 2 else [i, 0, 0]
        assert batch["vec"][k].tolist() == want_vec
        assert batch["arr"][k].tolist() == [[float(i), 1.0]]
        assert batch["iarr"][k].tolist() == [i, i + 1]
        assert batch["s"][k].item() == i / 2 and batch["label"][k].item() == i % 3


@pytest.mark.timeout(180)
def test_tiny_data_for_many_workers_still_gives_every_rank_several_row_groups(spark_local,
                                                                             tmp_path):
    from sparkddl.data.materialize import MIN_GROUPS_PER_RANK, min_row_groups
    df = spark_local.range(64).selectExpr("cast(id as float) as x").coalesce(1)
    prepared = prepare(df, DataSpec.of("x"), num_workers=8, batch_size=2, store=tmp_path)
    groups = prepared.train.row_groups
    assert len(groups) >= min_row_groups(8) >= 8 * MIN_GROUPS_PER_RANK
    assert min(groups) >= 1 and sum(groups) == 64
    plan = prepared.train.plan(8, 2)
    assert plan.steps_per_epoch >= 3  # every rank reads its own pieces


@pytest.mark.timeout(180)
def test_second_materialization_is_a_cache_hit(spark_local, tmp_path, caplog):
    src = tmp_path / "src"
    spark_local.range(500).selectExpr("id", "cast(id as float) as x").write.parquet(str(src))
    spec = DataSpec.of("x", extra="id")
    store = tmp_path / "store"

    def fit_data(df):  # an expression: not read in place, materialized (and cached)
        return prepare(df.selectExpr("id", "x * 2 as x"), spec, num_workers=2, batch_size=8,
                       store=store, validation=0.2)

    first = fit_data(spark_local.read.parquet(str(src)))
    with caplog.at_level(logging.INFO, logger="sparkddl"):
        second = fit_data(spark_local.read.parquet(str(src)))  # a new DataFrame, same data
    assert not first.cache_hit and second.cache_hit
    assert second.fingerprint == first.fingerprint and second.train == first.train
    assert "data cache hit" in caplog.text
    # changed settings or changed data: a new fingerprint
    other_split = prepare(spark_local.read.parquet(str(src)).selectExpr("id", "x * 2 as x"),
                          spec, num_workers=2, batch_size=8, store=store, validation=0.3)
    assert not other_split.cache_hit and other_split.fingerprint != first.fingerprint
    spark_local.range(500, 510).selectExpr("id", "cast(id as float) as x") \
        .write.mode("append").parquet(str(src))
    changed = fit_data(spark_local.read.parquet(str(src)))
    assert not changed.cache_hit and changed.fingerprint != first.fingerprint
    assert changed.train.rows + changed.val.rows == 510


@pytest.mark.timeout(120)
def test_in_memory_data_is_fingerprinted_by_content(spark_local, tmp_path):
    spec = DataSpec.of("x")
    store = tmp_path / "store"

    def prep(values):
        df = spark_local.createDataFrame([(float(v),) for v in values], "x double")
        return prepare(df, spec, num_workers=2, batch_size=4, store=store)

    a = prep(range(64))
    assert prep(range(64)).cache_hit
    b = prep([v + 0.5 for v in range(64)])  # same schema and plan text, other values
    assert not b.cache_hit and b.fingerprint != a.fingerprint


@pytest.mark.timeout(120)
def test_validation_split_by_fraction_and_by_column(spark_local, tmp_path):
    df = spark_local.range(2000).selectExpr("id", "cast(id as float) as x", "id % 4 = 0 as is_val")
    spec = DataSpec.of("x", extra="id")
    by_frac = prepare(df, spec, num_workers=2, batch_size=8, store=tmp_path / "s",
                      validation=0.25, seed=3)
    again = prepare(df, spec, num_workers=2, batch_size=8, store=tmp_path / "s2",
                    validation=0.25, seed=3)
    assert by_frac.val.rows == again.val.rows and 350 < by_frac.val.rows < 650  # reproducible
    by_col = prepare(df, spec, num_workers=2, batch_size=8, store=tmp_path / "s",
                     validation="is_val")
    assert (by_col.train.rows, by_col.val.rows) == (1500, 500)
    val_ids = pq.read_table(by_col.val.url.replace("file://", "")).column("id").to_pylist()
    assert sorted(val_ids) == list(range(0, 2000, 4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sql,spec,match", [
    ("select id, cast(id as float) as x from range(0)", DataSpec.of("x"), "is empty"),
    ("select id, if(id = 3, null, cast(id as float)) as x from range(100)", DataSpec.of("x"),
     r"null values in 'x' \(1 rows\)"),
    ("select id, if(id = 3, array(1.0D), array(1.0D, 2.0D)) as v from range(100)",
     DataSpec.of("v"), r"'v' holds arrays of unequal length \(from 1 to 2 values\)"),
    ("select id, cast(id as string) as s from range(100)", DataSpec.of("s"),
     r"'s' \(string\) hold bytes or text, which become tensors only through a transformFn"),
    ("select id, map('a', id) as m from range(100)", DataSpec.of("m"),
     r"'m' \(map<string,bigint>\) have unsupported types"),
    ("select id, cast(id as float) as x from range(100)", DataSpec.of("nope"),
     r"'nope' not found; the data has id \(bigint\), x \(float\)"),
    ("select id, cast(id as float) as x from range(30)", DataSpec.of("x"),
     r"30 training rows are fewer than num_workers × batch_size = 2 × 16"),
])
def test_bad_data_is_refused_on_the_driver(spark_local, tmp_path, sql, spec, match):
    with pytest.raises(DataError, match=match):
        prepare(spark_local.sql(sql), spec, num_workers=2, batch_size=16, store=tmp_path)
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_missing_parquet_url_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no Parquet"):
        prepare(f"file://{tmp_path}/nothing", DataSpec.of("x"), num_workers=2, batch_size=4)
