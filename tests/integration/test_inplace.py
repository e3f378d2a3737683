"""Parquet tables read where they lie: a DataFrame that is a plain scan of Parquet is neither
rewritten nor copied, its validation split is made inside its row groups, and what cannot be
read in place is materialized as before."""
from __future__ import annotations

import logging
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sparkddl
from sparkddl.data import DataSpec, epoch_batches, prepare
from sparkddl.data.local import read_rows
from sparkddl.data.petastorm_check import unavailable_reason
from sparkddl.errors import ConfigError, DataError
from tests.integration.test_data import ids_per_epoch

SPEC = DataSpec.of("x", "y", extra="id")


def write_table(spark, path, rows: int = 4000, files: int = 4) -> str:
    """A Parquet table written by Spark: array<float> features, an integer label, an id,
    several row groups per file (small block size)."""
    (spark.range(rows).repartition(files, "id")
     .selectExpr("id", "array(cast(id as float), cast(-id as float)) as x",
                 "cast(id % 3 as int) as y", "id % 5 = 0 as is_val", "cast(id as double) as d")
     .write.option("parquet.block.size", 8 << 10).mode("overwrite").parquet(str(path)))
    return str(path)


def fixed_file_names(path: str) -> None:
    """Spark names each part file with a UUID drawn per write, and a split by row groups
    draws per file path: fixed names give a test the same split (and held-out accuracy) on
    every run. Their stale .crc files go too."""
    from pathlib import Path
    for crc in Path(path).glob(".part-*.crc"):
        crc.unlink()
    for i, part in enumerate(sorted(Path(path).glob("part-*.parquet"))):
        part.rename(part.with_name(f"part-{i:05d}.parquet"))


def stored_data(store) -> list[str]:
    data = os.path.join(store, "data")
    return sorted(os.listdir(data)) if os.path.isdir(data) else []


@pytest.mark.timeout(240)
def test_a_parquet_table_is_read_in_place_and_split_inside_row_groups(spark_local, tmp_path,
                                                                      caplog, monkeypatch):
    # the per-row split of tables with few row groups (this one has 16: split by groups)
    monkeypatch.setattr("sparkddl.data.source.GROUP_SPLIT_MIN", 10**6)
    path = write_table(spark_local, tmp_path / "table")
    df = spark_local.read.parquet(path).select("x", "y", "id")
    store = str(tmp_path / "store")
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, SPEC, num_workers=2, batch_size=16, store=store, validation=0.25,
                           seed=3)
    assert prepared.in_place and stored_data(store) == []
    assert "reading file://" in caplog.text and "in place (a plain Parquet scan" in caplog.text
    train = read_rows(prepared.train)["id"].tolist()
    val = read_rows(prepared.val)["id"].tolist()
    # a split of every row: disjoint, complete, close to the fraction, counted exactly
    assert sorted(train + val) == list(range(4000)) and not set(train) & set(val)
    assert 850 < len(val) < 1150
    assert (prepared.train.rows, prepared.val.rows) == (len(train), len(val))
    again = prepare(df, SPEC, num_workers=2, batch_size=16, store=store, validation=0.25, seed=3)
    assert read_rows(again.val)["id"].tolist() == val and again.fingerprint == prepared.fingerprint
    other_seed = prepare(df, SPEC, num_workers=2, batch_size=16, store=store, validation=0.25,
                         seed=4)
    assert read_rows(other_seed.val)["id"].tolist() != val
    assert prepared.label_range("y") == (0, 2)  # from the footers' statistics
    # the two ranks read every training row exactly once per epoch (the Arrow reader)
    plan = prepared.train.plan(2, 16, seed=1)
    assert plan.selection is not None
    epochs = sparkddl.run(ids_per_epoch, plan, 2, num_workers=2, spark=spark_local, timeout=120)
    used = plan.steps_per_epoch * 16 * 2
    for ids in epochs:
        assert len(ids) == len(set(ids)) == used and set(ids) <= set(train)
    assert epochs[0] != epochs[1]


@pytest.mark.timeout(180)
def test_a_table_of_many_row_groups_is_split_by_whole_groups(spark_local, tmp_path, caplog):
    path = write_table(spark_local, tmp_path / "table")
    df = spark_local.read.parquet(path).select("x", "y", "id")
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, SPEC, num_workers=2, batch_size=16, store=tmp_path / "store",
                           validation=0.25, seed=3)
    assert prepared.in_place and prepared.val.selection.groups
    assert "split by whole row groups" in caplog.text
    train = read_rows(prepared.train)["id"].tolist()
    val = read_rows(prepared.val)["id"].tolist()
    assert sorted(train + val) == list(range(4000)) and not set(train) & set(val)
    whole = [t + v for t, v in zip(prepared.train.row_groups, prepared.val.row_groups)]
    assert all(v in (0, w) for v, w in zip(prepared.val.row_groups, whole))  # whole groups
    assert sum(prepared.val.row_groups) == len(val) > 0
    plan = prepared.train.plan(2, 16, seed=1)
    epochs = sparkddl.run(ids_per_epoch, plan, 2, num_workers=2, spark=spark_local, timeout=120)
    for ids in epochs:  # the ranks read training groups only, every row at most once
        assert len(ids) == len(set(ids)) == plan.steps_per_epoch * 32 and set(ids) <= set(train)


@pytest.mark.timeout(120)
def test_a_split_column_of_the_table_splits_in_place(spark_local, tmp_path):
    path = write_table(spark_local, tmp_path / "table")
    prepared = prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                       store=tmp_path / "store", validation="is_val")
    assert prepared.in_place and (prepared.train.rows, prepared.val.rows) == (3200, 800)
    assert sorted(read_rows(prepared.val)["id"].tolist()) == list(range(0, 4000, 5))
    assert set(read_rows(prepared.train)) == {"x", "y", "id"}  # the split column is not read


@pytest.mark.timeout(180)
@pytest.mark.parametrize("query,reason", [
    (lambda df: df.where("id > 10"), "its plan is not a plain file scan (it has Filter)"),
    (lambda df: df.selectExpr("x", "cast(y as long) as y", "id"), "it computes columns"),
])
def test_what_cannot_be_read_in_place_is_materialized_and_says_why(spark_local, tmp_path,
                                                                   caplog, query, reason):
    path = write_table(spark_local, tmp_path / "table")
    df = query(spark_local.read.parquet(path))
    store = str(tmp_path / "store")
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(df, SPEC, num_workers=2, batch_size=16, store=store)
    assert not prepared.in_place and stored_data(store)
    assert f"materializing the DataFrame into the store because {reason}" in caplog.text
    assert read_rows(prepared.train)["id"].size == df.count()


@pytest.mark.timeout(120)
def test_vectors_are_materialized_and_partition_columns_read_in_place(spark_local, tmp_path,
                                                                     caplog):
    from pyspark.ml.feature import VectorAssembler
    path = str(tmp_path / "parted")
    (spark_local.range(2000).selectExpr("id", "cast(id as float) as a", "cast(id % 3 as int) as y",
                                        "id % 2 as part")
     .write.partitionBy("part").parquet(path))
    table = spark_local.read.parquet(path)
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        by_part = prepare(table, DataSpec.of("a", "part"), num_workers=2, batch_size=8,
                          store=tmp_path / "s1")
        plain = prepare(table, DataSpec.of("a", "y"), num_workers=2, batch_size=8,
                        store=tmp_path / "s2")
        vec = VectorAssembler(inputCols=["a"], outputCol="v").transform(table)
        by_vec = prepare(vec, DataSpec.of("v", "y"), num_workers=2, batch_size=8,
                         store=tmp_path / "s3")
    # a partition column is read from the folder names (test_lakehouse.py tests more)
    assert by_part.in_place and by_part.train.table.columns == ("part",)
    assert (read_rows(by_part.train)["part"] == read_rows(by_part.train)["a"] % 2).all()
    assert plain.in_place and plain.train.rows == 2000  # partitioned folders read in place
    assert not by_vec.in_place


@pytest.mark.timeout(120)
def test_petastorm_asked_for_with_a_split_materializes(spark_local, tmp_path, caplog):
    path = write_table(spark_local, tmp_path / "table")
    with caplog.at_level(logging.INFO, logger="sparkddl.data"):
        prepared = prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                           store=tmp_path / "store", validation=0.2, reader="petastorm")
    assert not prepared.in_place and "reader='petastorm' reads whole row groups" in caplog.text
    unsplit = prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                      store=tmp_path / "store")
    with pytest.raises(ConfigError, match="cannot read a table split in place"):
        prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                store=tmp_path / "store", validation=0.2).train.plan(2, 16, reader="petastorm")
    assert unsplit.in_place
    if unavailable_reason() is None:  # whole tables read in place go through Petastorm too
        assert unsplit.train.plan(2, 16, reader="petastorm").selection is None


@pytest.mark.timeout(120)
def test_bad_tables_are_refused_on_the_driver_naming_the_file(spark_local, tmp_path):
    ragged = tmp_path / "ragged"
    ragged.mkdir()
    pq.write_table(pa.table({"x": pa.array([[1.0, 2.0]] * 50, pa.list_(pa.float32())),
                             "y": list(range(50))}), ragged / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([[1.0, 2.0]] * 49 + [[1.0]], pa.list_(pa.float32())),
                             "y": list(range(50))}), ragged / "b.parquet")
    with pytest.raises(DataError, match=r"column 'x' of .*b\.parquet \(row group 0\) holds "
                                        r"arrays of varying length"):
        prepare(spark_local.read.parquet(str(ragged)), DataSpec.of("x", "y"), num_workers=2,
                batch_size=8, store=tmp_path / "store")
    holes = tmp_path / "holes"
    holes.mkdir()
    pq.write_table(pa.table({"x": pa.array([[1.0, None]] + [[1.0, 2.0]] * 49,
                                           pa.list_(pa.float32())),
                             "y": list(range(50))}), holes / "a.parquet")
    with pytest.raises(DataError, match=r"column 'x' of .*a\.parquet \(row group 0\) holds 1 "
                                        "null or missing array elements"):
        prepare(spark_local.read.parquet(str(holes)), DataSpec.of("x", "y"), num_workers=2,
                batch_size=8, store=tmp_path / "store")
    assert not (tmp_path / "store" / "data").exists()


@pytest.mark.timeout(120)
def test_a_table_changed_after_planning_is_an_error_naming_the_file(spark_local, tmp_path):
    path = write_table(spark_local, tmp_path / "table")
    prepared = prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                       store=tmp_path / "store")
    plan = prepared.train.plan(2, 16)
    assert len(list(epoch_batches(plan, 0, 0))) == plan.steps_per_epoch
    victim = sorted(f for f in os.listdir(path) if f.endswith(".parquet"))[0]
    table = pq.read_table(os.path.join(path, victim))
    time.sleep(0.01)
    pq.write_table(table.slice(0, 10), os.path.join(path, victim))
    os.remove(os.path.join(path, f".{victim}.crc"))  # Hadoop's checksum of the old file
    with pytest.raises(DataError, match=rf"changed after the fit planned it \(rewritten: "
                                        rf".*{victim}"):
        next(epoch_batches(plan, 0, 1))
    fresh = prepare(spark_local.read.parquet(path), SPEC, num_workers=2, batch_size=16,
                    store=tmp_path / "store")
    assert fresh.fingerprint != prepared.fingerprint  # a resumed run would be refused


@pytest.mark.timeout(300)
def test_a_fit_on_a_table_read_in_place_streams_its_validation_split(spark_local, tmp_path):
    import torch

    from sparkddl.config import TrainConfig
    from sparkddl.fit.supervisor import fit
    from tests.integration.digits import digits_df, mlp

    path = str(tmp_path / "digits")
    digits_df(spark_local).write.option("parquet.block.size", 16 << 10).parquet(path)
    fixed_file_names(path)
    config = TrainConfig(features=("features",), label="label", epochs=8, batch_size=32,
                         learning_rate=3e-3, num_workers=2, validation=0.2,
                         store=str(tmp_path / "store"), progress=False, seed=5)
    result = fit(spark_local, spark_local.read.parquet(path), mlp(), "adam", "cross_entropy",
                 config)
    assert result.data.in_place and stored_data(str(tmp_path / "store")) == []
    assert result.history[-1]["val_accuracy"] >= 0.9, result.history
    # the driver streamed the split in batches: the same sums as all validation rows at once
    val = read_rows(result.data.val)
    model = mlp()
    model.load_state_dict(result.state)
    with torch.no_grad():
        out = model(torch.from_numpy(val["features"]))
        loss = float(torch.nn.functional.cross_entropy(out, torch.from_numpy(val["label"])))
    chosen = next(r for r in result.history if r["epoch"] == result.chosen_epoch)
    assert chosen["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert len(val["label"]) == result.data.val.rows and 250 < result.data.val.rows < 470
