"""Tables read in place as lakehouses hold them: partitioned tables whose partition columns are
features or labels, several root folders, explicit file lists, and Delta Lake tables (written
here by the deltalake package, no Spark jar) read at their current version."""
from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pytest

import sparkddl
from sparkddl.data import DataSpec, epoch_batches, prepare
from sparkddl.data.local import read_rows
from sparkddl.errors import ConfigError, DataError
from sparkddl.tables.handed import handed
from tests.integration.test_inplace import stored_data

PARTED = DataSpec.of("a", "part", extra="id")


def write_parted(spark, path, rows: int = 4000) -> str:
    (spark.range(rows).selectExpr("id", "cast(id as float) as a", "cast(id % 3 as int) as part")
     .repartition(4).write.option("parquet.block.size", 4 << 10).partitionBy("part")
     .parquet(str(path)))
    return str(path)


def pairs_per_epoch(plan, epochs: int) -> list[list[tuple[int, int]]]:
    """Every rank reads its shard; rank 0 returns every rank's (id, part) pairs per epoch."""
    import torch.distributed as dist
    sparkddl.init_process_group()
    out = []
    for epoch in range(epochs):
        mine = [(int(i), int(p)) for b in epoch_batches(plan, dist.get_rank(), epoch)
                for i, p in zip(b["id"].tolist(), b["part"].tolist())]
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        out.append([pair for got in everyone for pair in got])
    return out


def check_pairs(rows) -> None:
    assert rows["id"].size and (rows["part"] == rows["id"] % 3).all()


@pytest.mark.timeout(240)
def test_partition_columns_are_read_in_place_as_features_or_labels(spark_local, tmp_path,
                                                                   caplog):
    path = write_parted(spark_local, tmp_path / "parted")
    df = spark_local.read.parquet(path)
    store = str(tmp_path / "store")
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, PARTED, num_workers=2, batch_size=16, store=store,
                           validation=0.25, seed=2)
    assert prepared.in_place and stored_data(store) == []
    assert "partition column(s) part" in caplog.text
    assert prepared.train.table.columns == ("part",)
    assert prepared.train.table.types == ("int32",)  # as Spark typed the folders
    train, val = read_rows(prepared.train), read_rows(prepared.val)
    check_pairs(train)
    check_pairs(val)
    ids = sorted(train["id"].tolist() + val["id"].tolist())
    assert ids == list(range(4000)) and 800 < val["id"].size < 1200
    assert train["part"].dtype == np.int64  # an integral label, as from the files
    # the ranks get the table's files in the plan and add the column on the executors
    plan = prepared.train.plan(2, 16, seed=1)
    assert plan.table.listed and plan.table.columns == ("part",)
    for pairs in sparkddl.run(pairs_per_epoch, plan, 2, num_workers=2, spark=spark_local,
                              timeout=120):
        assert len(pairs) == len(set(pairs)) == plan.steps_per_epoch * 16 * 2
        assert all(p == i % 3 for i, p in pairs) and {i for i, _ in pairs} <= set(train["id"])
    # a partition column is a feature as well (PARTED has it as the label)
    as_feature = prepare(df, DataSpec.of(["a", "part"], extra="id"), num_workers=2,
                         batch_size=16, store=store)
    assert as_feature.in_place
    check_pairs(read_rows(as_feature.train))


@pytest.mark.timeout(180)
def test_several_roots_and_file_lists_are_read_in_place(spark_local, tmp_path, caplog):
    parted = write_parted(spark_local, tmp_path / "parted", rows=3000)
    # partition folders chosen one by one (basePath keeps their column)
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        some = prepare(spark_local.read.option("basePath", parted)
                       .parquet(f"{parted}/part=0", f"{parted}/part=2"), PARTED,
                       num_workers=2, batch_size=16, store=tmp_path / "store")
    assert some.in_place and "2 root path(s) and partition column(s) part" in caplog.text
    rows = read_rows(some.train)
    check_pairs(rows)
    assert sorted(rows["id"].tolist()) == [i for i in range(3000) if i % 3 != 1]
    # plain folders side by side
    first, second = str(tmp_path / "one"), str(tmp_path / "two")
    spark_local.range(1000).selectExpr("id", "cast(id as float) as a").repartition(2) \
        .write.parquet(first)
    spark_local.range(1000, 1600).selectExpr("id", "cast(id as float) as a").repartition(2) \
        .write.parquet(second)
    spec = DataSpec.of("a", extra="id")
    both = prepare(spark_local.read.parquet(first, second), spec, num_workers=2,
                   batch_size=16, store=tmp_path / "store")
    assert both.in_place and both.train.table.columns == ()
    assert sorted(read_rows(both.train)["id"].tolist()) == list(range(1600))
    files = sorted(os.path.join(second, f) for f in os.listdir(second) if f.endswith(".parquet"))
    one_file = prepare(spark_local.read.parquet(files[0]), spec, num_workers=1, batch_size=16,
                       store=tmp_path / "store")
    expected = spark_local.read.parquet(files[0]).select("id").toPandas()["id"].tolist()
    assert one_file.in_place and sorted(read_rows(one_file.train)["id"].tolist()) == \
        sorted(expected)
    assert stored_data(str(tmp_path / "store")) == []


@pytest.mark.timeout(120)
def test_a_listed_table_with_petastorm_asked_for_is_materialized_or_refused(spark_local,
                                                                          tmp_path, caplog):
    path = write_parted(spark_local, tmp_path / "parted", rows=600)
    df = spark_local.read.parquet(path)
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, PARTED, num_workers=2, batch_size=16, store=tmp_path / "store",
                           reader="petastorm")
    assert not prepared.in_place
    assert "reader='petastorm' reads one folder, and the scan has 1 root path(s) and " \
        "partition column(s) part" in caplog.text
    check_pairs(read_rows(prepared.train))
    listed = prepare(df, PARTED, num_workers=2, batch_size=16, store=tmp_path / "store")
    with pytest.raises(ConfigError, match="reader='petastorm' reads one folder"):
        listed.train.plan(2, 16, reader="petastorm")


@pytest.mark.timeout(120)
def test_a_partitioned_folder_given_by_url_has_its_partition_columns(tmp_path):
    import pyarrow.parquet as pq
    for part in (0, 1, 2):
        folder = tmp_path / "t" / f"part={part}"
        folder.mkdir(parents=True)
        ids = np.arange(part, 900, 3)
        pq.write_table(pa.table({"id": ids, "a": ids.astype(np.float32)}), folder / "f.parquet")
    prepared = prepare(str(tmp_path / "t"), PARTED, num_workers=2, batch_size=16)
    assert prepared.train.table.types == ("int64",)  # inferred, as Spark infers it
    rows = read_rows(prepared.train)
    check_pairs(rows)
    assert sorted(rows["id"].tolist()) == list(range(900))
    with pytest.raises(DataError, match="'nope'"):
        prepare(str(tmp_path / "t"), DataSpec.of("a", "nope"), num_workers=2, batch_size=16)


def write_delta(path, versions: int = 3):
    """A partitioned Delta table of several versions: its folder keeps the files of the old
    ones (nothing is vacuumed), so reading the folder as plain Parquet would read them too."""
    from deltalake import DeltaTable, write_deltalake
    for version in range(versions):
        ids = np.arange(1000 * version, 1000 * version + 1200)
        table = pa.table({"id": ids, "a": ids.astype(np.float32), "part": ids % 3})
        write_deltalake(str(path), table, mode="overwrite" if version else "error",
                        partition_by=["part"])
    DeltaTable(str(path)).delete("id >= 3100")  # rewrites files: more tombstones
    return list(range(2000, 3100))


@pytest.mark.timeout(240)
def test_a_delta_table_is_read_at_its_current_version(spark_local, tmp_path):
    expected = write_delta(tmp_path / "delta")
    on_disk = [f for _, _, fs in os.walk(tmp_path / "delta") for f in fs if f.endswith(".parquet")]
    prepared = prepare(str(tmp_path / "delta"), PARTED, num_workers=2, batch_size=16)
    assert len(on_disk) > len(prepared.train.table.paths)  # old versions' files are there
    rows = read_rows(prepared.train)
    check_pairs(rows)
    assert sorted(rows["id"].tolist()) == expected
    plan = prepared.train.plan(2, 16, seed=3)
    for pairs in sparkddl.run(pairs_per_epoch, plan, 1, num_workers=2, spark=spark_local,
                              timeout=120):
        assert len(pairs) == len(set(pairs)) == plan.steps_per_epoch * 16 * 2
        assert {i for i, _ in pairs} <= set(expected) and all(p == i % 3 for i, p in pairs)


@pytest.mark.timeout(180)
def test_read_delta_gives_the_estimator_the_current_version_read_in_place(spark_local,
                                                                         tmp_path, caplog):
    expected = write_delta(tmp_path / "delta")
    df = sparkddl.read_delta(spark_local, str(tmp_path / "delta"))
    assert sorted(r.id for r in df.select("id").collect()) == expected  # Spark agrees
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        # one file per partition: 3 row groups, which 1 rank reads whole
        prepared = prepare(df, PARTED, num_workers=1, batch_size=16, store=tmp_path / "store")
    assert prepared.in_place and prepared.train.table.columns == ("part",)
    rows = read_rows(prepared.train)
    check_pairs(rows)
    assert sorted(rows["id"].tolist()) == expected
    # the folder read as plain Parquet: every version's rows, as Spark reads them, and a warning
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        stale = prepare(spark_local.read.parquet(str(tmp_path / "delta")), PARTED,
                        num_workers=1, batch_size=16, store=tmp_path / "store")
    assert "is a Delta Lake table read as plain Parquet" in caplog.text
    assert read_rows(stale.train)["id"].size > len(expected)
    with pytest.raises(DataError, match="is not a Delta table"):
        sparkddl.read_delta(spark_local, str(tmp_path))


@pytest.mark.timeout(120)
def test_delta_tables_with_a_reader_feature_not_applied_are_refused_saying_what_to_do(
        tmp_path):
    from deltalake import write_deltalake

    from tests.delta_build import DeltaBuilder
    ids = np.arange(100)
    # column mapping and deletion vectors enabled as deltalake writes them: read in place
    write_deltalake(str(tmp_path / "d"), pa.table({"id": ids, "a": ids.astype(np.float32),
                                                   "part": ids % 3}),
                    configuration={"delta.columnMapping.mode": "name",
                                   "delta.enableDeletionVectors": "true"})
    rows = read_rows(prepare(str(tmp_path / "d"), PARTED, num_workers=2, batch_size=16).train)
    assert sorted(rows["id"].tolist()) == list(range(100))
    DeltaBuilder(tmp_path / "tw", features=("typeWidening",)).add_file(
        pa.table({"id": ids, "a": ids.astype(np.float32), "part": ids % 3}))
    with pytest.raises(DataError, match=r"reader feature\(s\) typeWidening.*"
                                        r"spark.read.format\('delta'\).load"):
        prepare(str(tmp_path / "tw"), PARTED, num_workers=2, batch_size=16)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mapping", [None, "name"])
def test_read_delta_of_a_table_with_deletion_vectors_trains_on_the_rows_not_deleted(
        spark_local, tmp_path, caplog, mapping):
    """The DataFrame read_delta gives is right in Spark (the deleted rows anti-joined away),
    read in place as it is (each rank applies its files' deletion vectors), materialized
    right once transformed; deleted rows carry the label -1, which nothing may read. With
    column mapping, the files' physical columns are the table's by name in Spark too."""
    from tests.unit.tables.test_masks import build
    _, expected = build(tmp_path / "d", partitioned=True, mapping=mapping)
    df = sparkddl.read_delta(spark_local, str(tmp_path / "d"))
    rows = df.collect()  # Spark agrees: the rows not deleted, the table's column names
    assert sorted(r.x for r in rows) == expected and set(df.columns) == {"x", "label", "part"}
    assert all(r.label >= 0 and r.part == (r.x // 1000) % 2 for r in rows)
    spec = DataSpec.of(["x", "part"], ["label"])
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, spec, num_workers=2, batch_size=4, store=tmp_path / "store")
    assert prepared.in_place and "with a deletion vector the ranks apply" in caplog.text
    assert prepared.label_range("label") == (0, 9)
    plan = prepared.train.plan(2, 4, seed=3)
    assert plan.rows == len(expected)
    trained = sparkddl.run(ids_per_epoch, plan, 2, num_workers=2, spark=spark_local, timeout=120)
    for ids in trained:  # every row not deleted once, but the last partial batches
        assert len(ids) == len(set(ids)) == plan.rows_per_epoch
        assert set(ids) <= set(expected)
    copied = prepare(df.where("x >= 0"), spec, num_workers=2, batch_size=4,
                     store=tmp_path / "store")
    assert not copied.in_place
    assert sorted(read_rows(copied.train)["x"].tolist()) == expected


def ids_per_epoch(plan, epochs: int) -> list[list[float]]:
    """Every rank's x values of each epoch, gathered: what the ranks trained on."""
    import torch.distributed as dist
    sparkddl.init_process_group()
    out = []
    for epoch in range(epochs):
        mine = []
        for batch in epoch_batches(plan, dist.get_rank(), epoch):
            assert (batch["label"] >= 0).all(), "a deleted row was read"
            mine += batch["x"].flatten().tolist()
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        out.append([x for part in every for x in part])
    return out


@pytest.mark.timeout(180)
def test_read_iceberg_gives_spark_and_the_fit_the_current_snapshot(spark_local, tmp_path,
                                                                   caplog):
    """An Iceberg table of several appends and a copy-on-write delete (pyiceberg's own scan
    is the oracle): Spark reads its current snapshot's files, and a fit reads them in place."""
    pytest.importorskip("pyiceberg")
    from tests.unit.tables.test_iceberg import build, oracle
    table = build(tmp_path / "ice")
    expected = oracle(table)
    df = sparkddl.read_iceberg(spark_local, table)
    assert sorted((r.id, r.a, r.part) for r in df.select("id", "a", "part").collect()) == \
        expected
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, PARTED, num_workers=2, batch_size=4, store=tmp_path / "store")
    assert prepared.in_place and stored_data(str(tmp_path / "store")) == []
    assert prepared.train.table.columns == ("part", "tag")
    assert "Delta or Iceberg table's version, its" in caplog.text
    rows = read_rows(prepared.train)
    assert sorted(zip(rows["id"].tolist(), rows["a"].tolist(), rows["part"].tolist())) == \
        expected
    # by its identifier in a catalog, the same files
    again = sparkddl.read_iceberg(spark_local, "ns.t", catalog=table.catalog)
    assert handed(again)[1] == handed(df)[1]
    assert not [k for k in vars(df) if "sparkddl" in k]  # nothing hung on pyspark's object


@pytest.mark.timeout(180)
def test_read_iceberg_of_a_table_with_positional_deletes_trains_on_the_rows_left(spark_local,
                                                                                tmp_path):
    """Positional delete files (pyiceberg's scan is the oracle): Spark's DataFrame leaves the
    deleted rows out (an anti join on the row index), a fit reads the files in place with the
    ranks applying the deletes; deleted rows carry the label -1."""
    pytest.importorskip("pyiceberg")
    from tests.unit.tables.test_iceberg import labeled, with_positional_deletes
    table, _ = with_positional_deletes(tmp_path)
    expected = labeled(table)
    df = sparkddl.read_iceberg(spark_local, table)
    got = sorted((r.id, r.a, r.label) for r in df.select("id", "a", "label").collect())
    assert got == expected and all(label >= 0 for *_, label in got)
    spec = DataSpec.of(["a"], ["label"], ["id"])
    prepared = prepare(df, spec, num_workers=2, batch_size=4, store=tmp_path / "store")
    assert prepared.in_place and prepared.train.table.masks
    rows = read_rows(prepared.train)
    assert sorted(rows["id"].tolist()) == [i for i, *_ in expected]
    assert (rows["label"] >= 0).all()
