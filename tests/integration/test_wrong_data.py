"""Never train on the wrong data without a word (issue 43): what decides which rows and values
a fit trains on errs toward a fresh read or an error. A UDF redefined between two fits is not
a cache hit; files of one table with different column types are refused naming the file;
folders whose names Spark %-encodes are read in place, with either reader."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sparkddl
from sparkddl.data import DataSpec, epoch_batches, prepare
from sparkddl.data.local import read_rows
from sparkddl.data.petastorm_check import unavailable_reason
from sparkddl.errors import DataError

SPEC = DataSpec.of("x", "label", extra="id")
ODD_NAME = "t a%20b #c é"  # a space, a literal %20, a '#' and a non-ASCII letter


def labels_of(prepared) -> dict[int, float]:
    rows = read_rows(prepared.train)
    return dict(zip(rows["id"].tolist(), rows["label"].tolist()))


@pytest.mark.timeout(240)
def test_a_udf_redefined_or_a_closure_changed_is_not_a_cache_hit(spark_local, tmp_path, caplog):
    from pyspark.sql import functions as F
    src = str(tmp_path / "src")
    spark_local.range(400).selectExpr("id", "cast(id as float) as x").write.parquet(src)
    store = str(tmp_path / "store")

    def fit_data(fn):
        label = F.udf(fn, "long")  # the same name in every cell of a notebook
        df = spark_local.read.parquet(src).withColumn("label", label("id"))
        return prepare(df, SPEC, num_workers=2, batch_size=8, store=store)

    first = fit_data(lambda i: i % 2)
    assert set(labels_of(first).values()) == {0, 1}
    again = fit_data(lambda i: i % 2)  # the same code: the cache serves it
    assert again.cache_hit and again.fingerprint == first.fingerprint
    second = fit_data(lambda i: i % 3)  # redefined in the next cell
    assert not second.cache_hit
    assert labels_of(second) == {i: i % 3 for i in range(400)}
    offset = 10

    def shifted(i):
        return i % 2 + offset

    third = fit_data(shifted)
    offset = 20  # a value the closure reads, changed
    fourth = fit_data(shifted)
    assert set(labels_of(third).values()) == {10, 11}
    assert not fourth.cache_hit and set(labels_of(fourth).values()) == {20, 21}


@pytest.mark.timeout(120)
def test_which_plans_are_keyed_by_their_files_and_which_by_content(spark_local, tmp_path):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    from sparkddl.data import fingerprint as fp
    src, other = str(tmp_path / "src"), str(tmp_path / "other")
    spark_local.range(100).selectExpr("id", "cast(id as float) as x").write.parquet(src)
    spark_local.range(50).write.parquet(other)
    base = spark_local.read.parquet(src)
    spark_local.read.parquet(other).createOrReplaceTempView("other_ids")
    base.createOrReplaceTempView("src_rows")
    plain = [base.where("id > 3").selectExpr("id", "cast(x * 2 as double) as x",
                                            "id % 3 as label"),
             base.groupBy((F.col("id") % 5).alias("k")).agg(F.sum("x").alias("x")),
             spark_local.sql("select * from src_rows where id in (select id from other_ids)"),
             spark_local.sql("select * from src_rows where exists (select 1 from other_ids "
                             "where other_ids.id = src_rows.id)")]
    for df in plain:  # Spark's own expressions over files: one pass, keyed by files
        assert fp.opaque_code(df) is None and fp.identified_by_files(df), df
    opaque = {"PythonUDF": base.withColumn("y", F.udf(lambda i: i, "long")("id")),
              "CurrentTimestamp": base.where(F.col("id") < F.unix_timestamp(
                  F.current_timestamp())),
              "Rand": base.withColumn("r", F.rand()),
              "ScalaUDF": VectorAssembler(inputCols=["x"], outputCol="v").transform(base),
              "MapInPandas": base.mapInPandas(lambda it: it, base.schema),
              "a subquery over LocalRelation": spark_local.sql(
                  "select * from src_rows where id in (select * from values (1), (2))")}
    for what, df in opaque.items():
        assert what in (fp.opaque_code(df) or "") and not fp.identified_by_files(df), what


def write_drifting_table(path, second_label: pa.DataType) -> None:
    """Two files of one table: the first with integral labels, the second's of another type."""
    os.makedirs(path)
    ids = np.arange(200)
    for i, label_type in enumerate([pa.int64(), second_label]):
        part = ids[i * 100:(i + 1) * 100]
        labels = pa.array(part % 4 + (0.5 if pa.types.is_floating(label_type) else 0),
                          label_type)
        pq.write_table(pa.table({"id": part, "x": part.astype(np.float32), "label": labels}),
                       os.path.join(path, f"part-{i}.parquet"))


@pytest.mark.timeout(180)
def test_files_of_one_table_with_integer_and_float_labels_are_refused(spark_local, tmp_path):
    table = str(tmp_path / "table")
    write_drifting_table(table, pa.float64())
    bad = os.path.join(table, "part-1.parquet")
    wanted = rf"'label' is double in .*{bad} but int64 in .*part-0\.parquet"
    with pytest.raises(DataError, match=wanted):  # the URL read in place
        prepare(table, SPEC, num_workers=2, batch_size=8)
    df = spark_local.read.parquet(table)  # Spark takes the first file's schema
    with pytest.raises(DataError, match=wanted):
        prepare(df, SPEC, num_workers=2, batch_size=8, store=str(tmp_path / "store"))


@pytest.mark.timeout(120)
def test_files_of_one_kind_in_other_widths_are_read_as_one(spark_local, tmp_path):
    """int32 beside int64 loses nothing: both decode to the planned dtype (int64)."""
    table = str(tmp_path / "table")
    write_drifting_table(table, pa.int32())
    prepared = prepare(table, SPEC, num_workers=2, batch_size=8)
    assert labels_of(prepared) == {i: i % 4 for i in range(200)}


@pytest.mark.timeout(120)
def test_a_file_without_a_column_is_named(spark_local, tmp_path):
    table = str(tmp_path / "table")
    write_drifting_table(table, pa.int64())
    pq.write_table(pa.table({"id": np.arange(5), "x": np.ones(5, np.float32)}),
                   os.path.join(table, "part-2.parquet"))
    with pytest.raises(DataError, match=r"'label' is missing from .*part-2\.parquet"):
        prepare(table, SPEC, num_workers=2, batch_size=8)


def count_rows(plan, world: int) -> list[int]:
    import torch
    import torch.distributed as dist
    sparkddl.init_process_group()
    mine = torch.cat([b["id"] for b in epoch_batches(plan, dist.get_rank(), 0)]).tolist()
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return sorted(i for ids in everyone for i in ids)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", ["arrow", "petastorm"])
def test_tables_and_stores_in_folders_with_odd_names(spark_local, tmp_path, reader):
    if reader == "petastorm" and unavailable_reason():
        pytest.skip(f"Petastorm is not on this stack: {unavailable_reason()}")
    table = str(tmp_path / ODD_NAME / "table")
    (spark_local.range(1000).repartition(2)
     .selectExpr("id", "cast(id as float) as x", "id % 3 as label")
     .write.parquet(table))
    store = str(tmp_path / ODD_NAME / "store")
    df = spark_local.read.parquet(table)
    prepared = prepare(df, SPEC, num_workers=2, batch_size=10, store=store, reader=reader)
    assert prepared.in_place and prepared.train.url.endswith(f"{ODD_NAME}/table")
    assert not os.path.exists(os.path.join(store, "data"))  # nothing copied
    plan = prepared.train.plan(2, 10, reader=reader)
    ids = sparkddl.run(count_rows, plan, 2, num_workers=2, spark=spark_local, timeout=120)
    assert ids == list(range(1000))
    # a DataFrame that must be materialized goes to a store under the same odd folder
    copied = prepare(df.selectExpr("id", "x * 2 as x", "label"), SPEC, num_workers=2,
                     batch_size=10, store=store, reader=reader)
    assert not copied.in_place and ODD_NAME in copied.train.url
    assert sorted(read_rows(copied.train)["id"].tolist()) == list(range(1000))


@pytest.mark.timeout(180)
def test_overlapping_read_paths_train_the_rows_the_dataframe_holds(spark_local, tmp_path):
    table = str(tmp_path / "table")
    (spark_local.range(1000).repartition(2)
     .selectExpr("id", "cast(id as float) as x", "id % 3 as label").write.parquet(table))
    one = sorted(f for f in os.listdir(table) if f.endswith(".parquet"))[0]
    for paths in ([table, os.path.join(table, one)], [table, table]):
        df = spark_local.read.parquet(*paths)
        prepared = prepare(df, SPEC, num_workers=2, batch_size=10,
                           store=str(tmp_path / "store"))
        assert prepared.train.rows == df.count()
        assert sorted(read_rows(prepared.train)["id"].tolist()) == \
            sorted(r.id for r in df.select("id").collect())


def fit_digits(df, tmp_path, **params):
    from tests.integration.test_adversarial_errors import estimator
    return estimator(tmp_path, **params).fit(df)


@pytest.mark.timeout(180)
def test_dataframes_spark_would_refuse_later_are_named_before_any_job(spark_local, tmp_path):
    from tests.integration.digits import digits_df
    digits = digits_df(spark_local)
    table = str(tmp_path / "digits")
    digits.write.parquet(table)
    stream = spark_local.readStream.schema(digits.schema).parquet(table)
    with pytest.raises(DataError, match=r"the DataFrame is a stream .*toTable"):
        fit_digits(stream, tmp_path)
    joined = digits.join(digits.select("label", "features"), "label")
    with pytest.raises(DataError, match=r"more than one of them named 'features'.*\.alias\(\)"):
        fit_digits(joined, tmp_path)
    # a folder deleted under a filtered DataFrame (materialized, not read in place)
    filtered = spark_local.read.parquet(table).where("label < 5")
    for name in os.listdir(table):
        os.remove(os.path.join(table, name))
    with pytest.raises(DataError, match=r"a file the DataFrame reads is gone .*define the "
                                        r"DataFrame again"):
        fit_digits(filtered, tmp_path)
