"""An epoch is every row once, on any table layout and any number of ranks, read in place.

Tables written by Spark itself in the layouts writers leave (one full row group and a
remainder per file, one row group per file, fewer files than ranks, skewed files,
partition folders, a single file), fitted at 1-4 ranks: nothing is copied, every rank reads
the same number of rows (±1) and takes the same steps, and the row ids the ranks read in an
epoch are every row once but the fewer than ``world × batch`` left over (every row once,
with ``drop_last=False``, for evaluation)."""
from __future__ import annotations

import os

import pytest
import torch

import sparkddl
from sparkddl import TorchEstimator
from sparkddl.data import DataSpec, epoch_batches, prepare
from tests.conftest import spark_session
from tests.integration.test_data import ids_per_epoch

ROWS, BATCH = 3000, 16
SPEC = DataSpec.of("x", "y", extra="id")


def _frame(spark, rows: int = ROWS):
    return spark.range(rows).selectExpr(
        "id", "array(cast(id as float), cast(id % 7 as float)) as x", "cast(id % 3 as int) as y",
        "cast(id % 4 as int) as part", "if(id < 2400, 0, id % 5) as skew")


# name -> how Spark writes the table
LAYOUTS = {
    # parquet.block.size below the file's size: one full row group and a remainder per file
    "full+remainder": lambda df, path: df.repartition(3).write.option(
        "parquet.block.size", 24 << 10).parquet(path),
    "one group per file": lambda df, path: df.repartition(8).write.parquet(path),
    "fewer files than ranks": lambda df, path: df.repartition(2).write.parquet(path),
    "skewed files": lambda df, path: df.repartition(4, "skew").write.parquet(path),
    "partition folders": lambda df, path: df.repartition(2).write.partitionBy("part")
    .parquet(path),
    "single file": lambda df, path: df.coalesce(1).write.parquet(path),
}


@pytest.fixture
def tables(spark_local, tmp_path_factory):
    return _tables(spark_local, tmp_path_factory)


@pytest.fixture
def spark_local4():
    """local[4], for 3 ranks (2 cores here): ordered before the local[2] tests (conftest's
    order), so that it costs one session start."""
    return spark_session("local[4]")


_written: dict = {}


def _tables(spark, tmp_path_factory) -> dict[str, str]:
    """Each layout written once per test run (the local[2] tests and the local[4] ones
    share them)."""
    if _written:
        return _written
    root = tmp_path_factory.mktemp("layouts")
    for name, write in LAYOUTS.items():
        path = str(root / name.replace(" ", "_").replace("+", "_"))
        write(_frame(spark), path)
        _written[name] = path
    return _written


def _groups(prepared) -> list[int]:
    return list(prepared.train.row_groups)


def _epoch_ids(plan, world: int, epoch: int) -> list[list[int]]:
    return [torch.cat([b["id"] for b in epoch_batches(plan, rank, epoch)]).tolist()
            for rank in range(world)]


@pytest.mark.timeout(300)
def test_every_layout_at_every_world_size_is_read_in_place_every_row_once(spark_local, tables,
                                                                         tmp_path):
    spark = spark_local
    seen_layouts = {}
    for name, path in tables.items():
        df = spark.read.parquet(path)
        for world in (1, 2, 3, 4):
            prepared = prepare(df.select("x", "y", "id"), SPEC, num_workers=world,
                               batch_size=BATCH, store=str(tmp_path / "store"))
            assert prepared.in_place, (name, world)  # no copy because of the layout
            plan = prepared.train.plan(world, BATCH, seed=world, reader_workers=2)
            assert sum(plan.rows_per_rank) == ROWS
            assert max(plan.rows_per_rank) - min(plan.rows_per_rank) <= 1
            assert plan.steps_per_epoch == ROWS // world // BATCH
            assert plan.rows_skipped == ROWS % (world * BATCH) < world * BATCH
            for epoch in (0, 1):
                by_rank = _epoch_ids(plan, world, epoch)
                assert [len(ids) for ids in by_rank] == [plan.steps_per_epoch * BATCH] * world
                everyone = [i for ids in by_rank for i in ids]
                assert len(everyone) == len(set(everyone)) == ROWS - plan.rows_skipped
                assert set(everyone) <= set(range(ROWS))
            seen_layouts[name] = _groups(prepared)
    assert not os.path.exists(tmp_path / "store" / "data")  # nothing was materialized
    # the layouts are what they are named for
    full = seen_layouts["full+remainder"]  # [762, 238] * 3 with parquet-mr 1.13
    assert len(full) > 3 and len(set(full)) > 1
    assert len(seen_layouts["fewer files than ranks"]) == 2
    skewed = sorted(seen_layouts["skewed files"])
    assert skewed[-1] > 3 * skewed[0] and len(seen_layouts["single file"]) == 1
    assert len(seen_layouts["partition folders"]) >= 4


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", ["auto", "arrow"])
def test_three_ranks_share_two_files_exactly_in_a_real_run(spark_local4, tmp_path_factory,
                                                          tmp_path, reader):
    """Real ranks (3 of them on local[4]), through Petastorm where it loads and through the
    Arrow reader: the ids gathered from all ranks are every row once but the few left over,
    and a second epoch reads the same rows in another order."""
    spark = spark_local4
    df = spark.read.parquet(_tables(spark, tmp_path_factory)["fewer files than ranks"]).select(
        "x", "y", "id")
    prepared = prepare(df, SPEC, num_workers=3, batch_size=BATCH, store=str(tmp_path / "s"))
    assert prepared.in_place and len(prepared.train.row_groups) == 2
    plan = prepared.train.plan(3, BATCH, seed=5, reader=reader)
    epochs = sparkddl.run(ids_per_epoch, plan, 2, num_workers=3, spark=spark, timeout=120)
    for ids in epochs:
        assert len(ids) == len(set(ids)) == ROWS - plan.rows_skipped == 2976
    assert epochs[0] != epochs[1]


def full_and_every_batch(plan) -> tuple[list, list[float]]:
    """On every rank: epoch 0 read as training reads it and with drop_last=False; rank 0
    returns every rank's batches of both, and the rows and id sums allreduced once at the
    end (the ranks' batch counts may differ, so no collective per batch)."""
    import torch.distributed as dist
    sparkddl.init_process_group()
    rank = dist.get_rank()
    full = [b["id"].tolist() for b in epoch_batches(plan, rank, 0)]
    every = [b["id"].tolist() for b in epoch_batches(plan, rank, 0, drop_last=False)]
    sums = torch.tensor([float(sum(map(len, every))), float(sum(map(sum, every)))],
                        dtype=torch.float64)
    dist.all_reduce(sums)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (full, every))
    return everyone, sums.tolist()


@pytest.mark.timeout(300)
def test_evaluation_reads_every_row_once_at_three_ranks_in_a_real_run(spark_local4,
                                                                     tmp_path_factory,
                                                                     tmp_path):
    """drop_last=False: 3000 rows at 3 ranks and batch 16 (1000 a rank, 62 batches and 8
    rows): across the ranks every id once, each rank's last batch partial; the default
    epoch of the same run is unchanged (62 full batches a rank, the first 62 of them)."""
    spark = spark_local4
    df = spark.read.parquet(_tables(spark, tmp_path_factory)["full+remainder"]
                            ).select("x", "y", "id")
    prepared = prepare(df, SPEC, num_workers=3, batch_size=BATCH, store=str(tmp_path / "s"))
    plan = prepared.train.plan(3, BATCH, seed=3)
    assert prepared.in_place and plan.steps_per_epoch == 62 and plan.rows_skipped == 24
    ranks, sums = sparkddl.run(full_and_every_batch, plan, num_workers=3, spark=spark,
                               timeout=120)
    for full, every in ranks:
        assert [len(b) for b in full] == [BATCH] * 62
        assert [len(b) for b in every] == [BATCH] * 62 + [8] and every[:62] == full
    ids = [i for _, every in ranks for b in every for i in b]
    assert sorted(ids) == list(range(ROWS)) and sums == [ROWS, sum(range(ROWS))]


@pytest.mark.timeout(300)
def test_a_fit_on_skewed_files_at_three_ranks_trains_every_row_and_says_so(spark_local4,
                                                                          tmp_path_factory,
                                                                          tmp_path):
    """The layout that was copied and trained 87.7 % of its rows per epoch: read in place,
    every epoch's history says how many rows it trained and left out."""
    spark = spark_local4
    df = spark.read.parquet(_tables(spark, tmp_path_factory)["skewed files"]).select("x", "y")
    store = tmp_path / "store"
    model = TorchEstimator(model=torch.nn.Linear(2, 3), optimizer="adam",
                           loss="cross_entropy", featuresCol="x", labelCol="y",
                           batchSize=BATCH, epochs=2, numWorkers=3, store=str(store),
                           progress=False).fit(df)
    assert not os.path.exists(store / "data")
    assert [(r["rows_trained"], r["rows_skipped"]) for r in model.history] == \
        [(ROWS - ROWS % (3 * BATCH), ROWS % (3 * BATCH))] * 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["full+remainder", "skewed files"])
def test_deletion_vectors_on_files_spark_wrote_at_three_ranks(spark_local4, tmp_path_factory,
                                                              tmp_path, layout):
    """Spark's own files (one full row group and a remainder per file, or skewed files)
    made a Delta table by a log written after the protocol, rows deleted from every file by
    deletion vectors: at 3 ranks each rank trains as many rows (±1) and every row that is
    not deleted once an epoch, but the fewer than 3 × 16 left over, and no deleted one."""
    import shutil

    import pyarrow.parquet as pq

    from tests.delta_build import DeltaBuilder
    table = tmp_path / "delta"
    shutil.copytree(_tables(spark_local4, tmp_path_factory)[layout], table)
    t = DeltaBuilder(table)
    files = [t.add_existing(p.name) for p in sorted(table.glob("*.parquet"))]
    deleted, kept = set(), []
    for f in files:
        ids = pq.read_table(table / f, columns=["id"]).column("id").to_pylist()
        gone = [i for i, v in enumerate(ids) if v % 11 == 0 or v % 97 < 3]
        t.delete({f: gone})
        deleted |= {ids[i] for i in gone}
        kept += [v for v in ids if v not in deleted]
    prepared = prepare(str(table), SPEC, num_workers=3, batch_size=BATCH)
    assert prepared.train.rows == len(kept) == ROWS - len(deleted)
    plan = prepared.train.plan(3, BATCH, seed=2)
    assert max(plan.rows_per_rank) - min(plan.rows_per_rank) <= 1
    epochs = sparkddl.run(ids_per_epoch, plan, 2, num_workers=3, spark=spark_local4,
                          timeout=180)
    for ids in epochs:
        assert len(ids) == len(set(ids)) == plan.rows_per_epoch
        assert set(ids) <= set(kept) and len(kept) - len(ids) < 3 * BATCH
    # evaluation (drop_last=False, read here rank by rank): every row not deleted, once
    every = [i for rank in range(3) for b in epoch_batches(plan, rank, 0, drop_last=False)
             for i in b["id"].tolist()]
    assert sorted(every) == sorted(kept)
