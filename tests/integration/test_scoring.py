"""TorchModel.transform on a table in Parquet: the scoring workers read the features where
they lie (Spark's scan then reads no feature column), with the same outputs as when Spark hands
the features over, through filters, renames and partitions; what is not a column of the files
is handed over as before; bad rows and files are named."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from pyspark.sql import functions as F

from sparkddl.ml.inplace import sources, spark_xxhash64

WIDTH, EXTRA, CLASSES = 4, 2, 3


def bilinear_model(features=("features", "extra")):
    """A fitted TorchModel of two feature columns (as TorchEstimator builds one)."""
    from sparkddl.ml import TorchModel
    from sparkddl.ml.architecture import describe
    from sparkddl.problems import Problem
    from sparkddl.train.components import model_factory

    torch.manual_seed(0)
    net = torch.nn.Bilinear(WIDTH, EXTRA, CLASSES)  # takes the two columns as two inputs
    model = TorchModel()
    model._factory = model_factory(net)
    model._arch, model._state = describe(model._factory), net.state_dict()
    model.task, model.output_width = Problem.MULTICLASS, CLASSES
    model._input_columns = {features[0]: {"shape": [WIDTH]}, features[1]: {"shape": [EXTRA]}}
    return model.setFeaturesCol(list(features))


def write_table(spark, path: str) -> str:
    """3 files a partition, several row groups each; features as doubles (the model takes
    floats), partitioned by ``part``."""
    (spark.range(3000).repartition(3, "id")
     .selectExpr("id", "cast(id % 2 as int) as part",
                 f"transform(sequence(1, {WIDTH}), i -> sin(id * i)) as feat_in_file",
                 f"transform(sequence(1, {EXTRA}), i -> cast(cos(id + i) as float)) as extra")
     .write.partitionBy("part").option("parquet.block.size", 4 << 10).parquet(path))
    return path


def scored(model, df, *columns):
    rows = model.transform(df).select("id", *columns).collect()
    return {r.id: tuple(np.asarray(r[c]).tolist() if c != "prediction" else r[c]
                        for c in columns) for r in rows}


def read_schema(df) -> str:
    plan = str(df._jdf.queryExecution().executedPlan().toString())
    return plan[plan.index("ReadSchema:"):].split("\n")[0]


@pytest.mark.timeout(240)
def test_a_parquet_table_is_scored_where_it_lies_as_spark_would_hand_it_over(spark_local,
                                                                           tmp_path,
                                                                           monkeypatch):
    spark = spark_local
    table = spark.read.parquet(write_table(spark, str(tmp_path / "scores table")))
    model = bilinear_model()
    # the features under the model's name, a filter, a partition column kept
    df = table.where("id % 7 != 3").select("id", "part", F.col("feat_in_file").alias(
        "features"), "extra")
    found = sources(df, ["features", "extra"])
    assert found.files is not None and found.files.columns == {"features": "feat_in_file",
                                                               "extra": "extra"}, found.why
    # the same rows with the features computed: Spark hands them over
    computed = df.withColumn("features", F.slice("features", 1, WIDTH))
    assert "computed on top of the scan" in sources(computed, ["features", "extra"]).why
    outputs = ("prediction", "probability", "rawPrediction")
    where_they_lie, handed = scored(model, df, *outputs), scored(model, computed, *outputs)
    assert len(where_they_lie) == 3000 - len([i for i in range(3000) if i % 7 == 3])
    assert where_they_lie.keys() == handed.keys()
    for key, (prediction, probability, raw) in handed.items():
        got = where_they_lie[key]
        assert got[0] == prediction
        assert np.allclose(got[1], probability) and np.allclose(got[2], raw)
    # a file's row groups split between tasks (Python workers) score the same
    spark.conf.set("spark.sql.files.maxPartitionBytes", 8 << 10)
    try:
        split = model.transform(df).select("id", "prediction")
        assert split.rdd.getNumPartitions() > 6  # more tasks than files
        assert {r.id: r.prediction for r in split.collect()} == \
            {key: got[0] for key, got in handed.items()}
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    # a table of more files than the driver names by number: each row's path travels
    from sparkddl.ml import inplace
    monkeypatch.setattr(inplace, "KNOWN_FILES", 2)
    assert sources(df, ["features", "extra"]).files.known == {}
    assert {r.id: r.prediction for r in model.transform(df).select("id", "prediction")
            .collect()} == {key: got[0] for key, got in handed.items()}
    monkeypatch.undo()
    # and both what the module gives for the rows as the files hold them
    rows = table.where("id < 50").orderBy("id").collect()
    with torch.no_grad():
        want = model.module()(torch.tensor([r.feat_in_file for r in rows]).float(),
                              torch.tensor([r.extra for r in rows])).argmax(-1)
    assert [where_they_lie[r.id][0] for r in rows if r.id % 7 != 3] == \
        [float(w) for r, w in zip(rows, want) if r.id % 7 != 3]
    # Spark's scan reads no feature column for it: only what the query selects besides
    assert "feat_in_file" not in read_schema(model.transform(df).select("id", "prediction"))
    assert "feat_in_file" in read_schema(model.transform(computed).select("id", "prediction"))
    # Spark names the files by the number the driver computes for them
    some = table.select(F.col("_metadata.file_path").alias("p"),
                        F.xxhash64("_metadata.file_path").alias("n")).limit(3).collect()
    assert all(spark_xxhash64(r.p) == r.n for r in some)


@pytest.mark.timeout(240)
def test_bad_rows_and_a_file_gone_are_named_when_read_where_they_lie(spark_local, tmp_path):
    from pyspark.errors import PythonException

    from sparkddl.errors import DataError
    spark = spark_local
    model = bilinear_model(("feat_in_file", "extra"))
    path = write_table(spark, str(tmp_path / "t"))
    narrow = spark.range(5).selectExpr("id", "array(1d, 2d, 3d) as feat_in_file",
                                       "array(1f, 2f) as extra")
    narrow.write.parquet(os.path.join(path, "part=9"))
    df = spark.read.parquet(path)
    assert sources(df, ["feat_in_file", "extra"]).files is not None
    with pytest.raises(PythonException, match="feature column 'feat_in_file' has 3 value.s. "
                                              "per row; the model takes 4"):
        model.transform(df.where("part = 9")).collect()
    # a table whose every row is of another width is refused by transform itself
    with pytest.raises(DataError, match=r"^feature column 'feat_in_file' holds \d+ values in "
                                        r"\d+ rows of .*part=9.*\(3 a row\); the model takes 4"):
        model.transform(spark.read.parquet(os.path.join(path, "part=9")))
    scoring = model.transform(df.where("part = 1"))
    for name in os.listdir(os.path.join(path, "part=1")):
        os.remove(os.path.join(path, "part=1", name))
    with pytest.raises(Exception, match="is gone|FileNotFound|does not exist"):
        scoring.collect()


@pytest.mark.timeout(240)
def test_every_output_of_every_kind_of_model_is_what_the_module_gives(spark_local):
    """Each kind's columns as pyspark.ml gives them (Vectors for a classifier's probability
    and raw prediction), equal to the module's own outputs: multiclass narrow and wider than
    the outputs a pandas UDF packs into a struct, binary, and regression of one and two
    values."""
    from pyspark.ml.linalg import DenseVector

    from sparkddl.export.portable import outputs
    from sparkddl.ml import TorchModel
    from sparkddl.ml.architecture import describe
    from sparkddl.ml.scoring import PACKED_MAX
    from sparkddl.problems import Problem
    from sparkddl.train.components import model_factory

    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, WIDTH)).astype(np.float32)
    df = spark_local.createDataFrame([(i, row.tolist()) for i, row in enumerate(x)],
                                     "id long, features array<float>")
    cases = [(Problem.MULTICLASS, CLASSES), (Problem.MULTICLASS, PACKED_MAX + 1),
             (Problem.BINARY, 1), (Problem.REGRESSION, 1), (Problem.REGRESSION, 2),
             (Problem.REGRESSION, (2, 3))]  # an output of rows of 2 x 3: 6 values a row
    for kind, width in cases:
        torch.manual_seed(7)
        net = torch.nn.Linear(WIDTH, width) if isinstance(width, int) else \
            torch.nn.Sequential(torch.nn.Linear(WIDTH, 6), torch.nn.Unflatten(1, width))
        width = width if isinstance(width, int) else width[-1]  # as a fit records it
        model = TorchModel()
        model._factory = model_factory(net)
        model._arch, model._state = describe(model._factory), net.state_dict()
        model.task, model.output_width = kind, width
        model._input_columns = {"features": {"shape": [WIDTH]}}
        model.setFeaturesCol("features")
        with torch.no_grad():
            want = outputs(kind, net(torch.from_numpy(x)))
        out = model.transform(df)
        names = {"prediction": "prediction", "probability": "probability", "raw": "rawPrediction"}
        rows = out.orderBy("id").collect()
        for field, values in want.items():
            got = [r[names[field]] for r in rows]
            if field != "prediction":
                assert all(isinstance(v, DenseVector) for v in got), (kind, width, field)
            got = np.array([np.asarray(v, dtype=np.float64) for v in got])
            values = np.stack(values) if isinstance(values, list) else np.asarray(values)
            assert np.allclose(got, values.reshape(got.shape), atol=1e-6), (kind, width, field)
        if kind == Problem.MULTICLASS:  # the three columns: one Python evaluation, one pass
            plan = out._jdf.queryExecution().executedPlan().toString()
            assert plan.count("EvalPython") == 1, plan
