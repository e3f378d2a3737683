"""sparkddl.run and TorchDistributor on a Spark Connect session: a real local Connect server
(``SparkSession.builder.remote("local[2]")``), whose client has no SparkContext."""
from __future__ import annotations

import time

import pytest
import torch

import sparkddl
from sparkddl import (
    ClusterError,
    ConfigError,
    TorchDistributor,
    TorchEstimator,
    TrainingFailedError,
)
from tests.integration.digits import _arrays, mlp


def allreduce_sum(value: float) -> float:
    import torch.distributed as dist
    sparkddl.init_process_group()
    t = torch.tensor([value * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} reduced {t.item()}")
    return float(t.item())


def fails_on_rank_1(failing: int = 1) -> None:
    import torch.distributed as dist
    sparkddl.init_process_group()
    if dist.get_rank() == failing:
        raise ValueError(f"rank {failing} cannot go on")
    dist.barrier()  # the other waits for a peer that is gone: the stage must be cancelled


@pytest.fixture
def setting(spark_connect):
    """Set session conf keys for one test (the session is shared)."""
    keys = []

    def set_(key, value):
        keys.append(key)
        spark_connect.conf.set(key, value)

    yield set_
    for key in keys:
        spark_connect.conf.unset(key)


@pytest.mark.timeout(300)
def test_run_on_connect_returns_rank_0_and_relays_output(spark_connect, capfd):
    assert not hasattr(spark_connect, "_jsc")  # really a client without a SparkContext
    assert sparkddl.run(allreduce_sum, 2.0, num_workers=2, spark=spark_connect) == 6.0
    out = capfd.readouterr().out
    assert "[rank 1] rank 1 reduced 6.0" in out and "[rank 0] rank 0 reduced 6.0" in out


@pytest.mark.timeout(300)
def test_a_failing_rank_on_connect_surfaces_at_once_and_the_stage_is_cancelled(spark_connect):
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        sparkddl.run(fails_on_rank_1, num_workers=2, spark=spark_connect)
    assert info.value.failures[0].rank == 1
    assert "ValueError: rank 1 cannot go on" in str(info.value)
    assert time.monotonic() - started < 60
    # rank 0's task was interrupted through the job tag: both slots are free again
    assert sparkddl.run(allreduce_sum, 1.0, num_workers=2, spark=spark_connect,
                        timeout=120) == 3.0


@pytest.mark.timeout(300)
def test_torch_distributor_runs_functions_and_scripts_on_connect(spark_connect, tmp_path):
    assert TorchDistributor(2, False, False, spark=spark_connect).run(allreduce_sum, 1.5) == 4.5
    script = tmp_path / "train.py"
    script.write_text("import sys, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "open(sys.argv[1] + f'/rank{dist.get_rank()}', 'w').write('ok')\n")
    assert TorchDistributor(2, False, False, spark=spark_connect).run(
        str(script), str(tmp_path)) is None
    assert (tmp_path / "rank0").read_text() == (tmp_path / "rank1").read_text() == "ok"


MISSING = """
import sys
sys.path.insert(0, {root!r})
from pyspark.sql import SparkSession
import sparkddl
# a Connect server beside the suite's (another port), and a client of it
server = (SparkSession.builder.master("local[2]")
          .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
          .config("spark.connect.grpc.binding.port", "15012").getOrCreate())
spark = SparkSession.builder.remote("sc://localhost:15012").create()
try:
    sparkddl.run(len, [1], num_workers=2, spark=spark, timeout=120)
except sparkddl.ClusterError as exc:
    print("CLUSTER ERROR:", exc)
spark.stop()
server.stop()
"""


@pytest.fixture(scope="module")
def server_without_sparkddl(tmp_path_factory):
    """A Connect server whose executors run a Python that has pyspark, pyarrow and torch but
    not sparkddl, and a client's sparkddl.run against it: a subprocess (another Spark driver),
    started when first requested and left running. The offline test requests it to start it,
    so that its start-up (a JVM, the executors' first Python worker) overlaps that test's
    probes, which wait on a socket; the test after it waits for the outcome.
    Yields (the executors' Python, a function returning (returncode, stdout, stderr))."""
    import os
    import subprocess
    import sys
    import sysconfig
    import venv
    from pathlib import Path

    pytest.importorskip("grpc", reason="the Spark Connect client packages (extra 'connect') "
                                       "are not installed")
    tmp_path = tmp_path_factory.mktemp("without-sparkddl")
    venv.create(tmp_path / "other", with_pip=False)
    other = tmp_path / "other" / "bin" / "python"
    purelib = subprocess.run([str(other), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the suite's packages, without processing their .pth files: sparkddl's editable
    # install is one of those, so sparkddl alone is missing there
    Path(purelib, "stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYSPARK_PYTHON": str(other)}
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE",
                "PYTHONPATH"):
        env.pop(key, None)  # set in this process by the suite (PYTHONPATH: the checkout)
    out, err = tmp_path / "stdout", tmp_path / "stderr"  # files: a full pipe would block it
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", MISSING.format(root=root)], env=env,
                                stdout=stdout, stderr=stderr, cwd=tmp_path)

    def finished() -> tuple:
        proc.wait(timeout=240)
        return proc.returncode, out.read_text(), err.read_text()

    try:
        yield other, finished
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(300)
def test_executors_that_cannot_reach_the_client_run_offline(spark_connect, setting, capfd,
                                                            caplog, tmp_path,
                                                            server_without_sparkddl):
    """The channel's address is unreachable (TEST-NET): the probe finds out, the ranks
    rendezvous through Spark's allGather and everything they said arrives at the end."""
    setting("spark.sparkddl.channel.host", "192.0.2.1")  # nobody answers there
    with caplog.at_level("WARNING", logger="sparkddl.launch.stage"):
        assert sparkddl.run(allreduce_sum, 1.0, num_workers=2, spark=spark_connect) == 3.0
        assert sparkddl.run(allreduce_sum, 2.0, num_workers=2, spark=spark_connect) == 6.0
    said = [r.message for r in caplog.records if "run offline" in r.message]
    assert len(said) == 1 and "192.0.2.1" in said[0]  # said once per session
    out = capfd.readouterr().out
    assert "[rank 1] rank 1 reduced 3.0" in out and "[rank 0] rank 0 reduced 6.0" in out
    # forced: no probe at all (where nothing answers, each probe above waits out its 5 s
    # connect timeout); the stages are offline as after a probe: the failures take that path
    setting("spark.sparkddl.channel.reachable", "false")
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:  # Spark's own error names the rank
        sparkddl.run(fails_on_rank_1, num_workers=2, spark=spark_connect)
    assert "ValueError: rank 1 cannot go on" in str(info.value)
    assert time.monotonic() - started < 60
    with pytest.raises(TrainingFailedError, match="ValueError: rank 0 cannot go on"):
        sparkddl.run(fails_on_rank_1, 0, num_workers=2, spark=spark_connect)  # the store host
    assert sparkddl.run(allreduce_sum, 1.5, num_workers=2, spark=spark_connect) == 4.5
    x, y = _arrays()
    df = spark_connect.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x, y)],
                                       "features array<float>, label int")
    model = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                           loss=torch.nn.CrossEntropyLoss(), epochs=4, numWorkers=2,
                           validation=0.2, store=str(tmp_path / "store"),
                           progress=False).fit(df)
    # epoch rows and snapshots (through the Store) arrived when the stage ended
    assert [r["epoch"] for r in model.history] == [1, 2, 3, 4]
    assert all("val_loss" in r and "train_loss" in r for r in model.history)
    assert model.history[-1]["val_accuracy"] > 0.8


@pytest.mark.timeout(300)
def test_executors_without_sparkddl_are_a_clear_error(spark_connect, server_without_sparkddl):
    """A Connect server whose executors run a Python that has pyspark, pyarrow and torch
    but not sparkddl (a cluster where only the client installed it): the one-task check
    before training names the missing package, the executors' Python and the fix."""
    other, finished = server_without_sparkddl
    returncode, stdout, stderr = finished()
    out = stdout[-2000:] + stderr[-2000:]
    assert returncode == 0, out
    assert f"CLUSTER ERROR: the executors' Python ({other}, Python" in stdout, out
    assert "cannot import sparkddl (ModuleNotFoundError" in stdout, out
    assert "PYSPARK_PYTHON" in stdout and "Connect server" in stdout, out


def test_bad_input_on_connect_fails_on_the_client(spark_connect, tmp_path):
    with pytest.raises(ClusterError, match=r"num_workers=3 but the cluster has 2 task slots"):
        sparkddl.run(allreduce_sum, 1.0, num_workers=3, spark=spark_connect)
    with pytest.raises(ConfigError, match=r"script '.*missing.py' not found"):
        sparkddl.run(str(tmp_path / "missing.py"), num_workers=2, spark=spark_connect)
    df = spark_connect.createDataFrame([([0.0, 1.0], i % 2) for i in range(100)],
                                       "features array<float>, label int")
    with pytest.raises(ConfigError, match=r"the model failed on a sample.*input size"):
        TorchEstimator(model=torch.nn.Linear(3, 2), optimizer="adam", loss="cross_entropy",
                       store=str(tmp_path)).fit(df)


@pytest.mark.timeout(300)
def test_torch_estimator_fits_and_transforms_on_connect(spark_connect, tmp_path, mlflow_store):
    """The DataFrame is materialized through the DataFrame API (content-hashed: a Connect
    plan cannot be inspected), snapshots are evaluated on the client as they arrive; the
    second fit logs to MLflow from the client (its input example read through Connect)."""
    x, y = _arrays()
    rows = [(r.tolist(), int(v), i % 5) for i, (r, v) in enumerate(zip(x, y))]
    df = spark_connect.createDataFrame(rows, "features array<float>, label int, split int")
    train, test = df.filter("split != 0"), df.filter("split = 0")
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                         loss=torch.nn.CrossEntropyLoss(), batchSize=32, epochs=8,
                         numWorkers=2, validation=0.2, store=str(tmp_path / "store"),
                         progress=False)
    model = est.fit(train)
    assert [r["epoch"] for r in model.history] == list(range(1, 9))
    assert all("val_loss" in r for r in model.history)
    assert model.steps_per_rank[0] == model.steps_per_rank[1] > 0
    pred = model.transform(test).select("label", "prediction").collect()
    assert sum(r["label"] == r["prediction"] for r in pred) / len(pred) >= 0.9
    again = est.copy({est.mlflow: True}).fit(train)  # the materialized copy is reused
    assert again.history and len(list((tmp_path / "store" / "data").iterdir())) == 1
    import mlflow
    info = mlflow.models.get_model_info(again.mlflow_model_uri)
    assert info.saved_input_example_info is not None and "python_function" in info.flavors
    [run] = mlflow.search_runs(output_format="list")
    assert len(mlflow_store.get_metric_history(run.info.run_id, "val_loss")) == 8


def _stuck(label):
    time.sleep(600)  # a task that never ends
    return label


@pytest.mark.timeout(240)
def test_a_data_job_that_never_ends_is_cancelled_through_its_tag(spark_connect, tmp_path):
    from pyspark.sql import functions as F

    x, y = _arrays()
    rows = [(r.tolist(), int(v)) for r, v in zip(x[:200], y[:200])]
    df = spark_connect.createDataFrame(rows, "features array<float>, label int")
    df = df.withColumn("label", F.udf(_stuck, "int")(F.col("label")))
    est = TorchEstimator(model=mlp(), optimizer="adam", loss="cross_entropy", epochs=1,
                         numWorkers=2, store=str(tmp_path / "store"), progress=False, timeout=8)
    started = time.monotonic()
    with pytest.raises(TrainingFailedError, match=r"timed out after 8s while preparing the data"):
        est.fit(df)
    assert time.monotonic() - started < 60
    assert spark_connect.getTags() == set()  # the tag is gone again
    assert spark_connect.range(5).count() == 5


@pytest.mark.timeout(300)
def test_a_fitted_model_transforms_a_connect_dataframe(spark_connect):
    """Weights travel inside the pandas UDF (Connect has no broadcasts)."""
    from sparkddl.ml import TorchModel
    from sparkddl.ml.architecture import describe
    from sparkddl.models import MLP
    from sparkddl.problems import Problem
    from sparkddl.train.components import model_factory

    torch.manual_seed(0)
    net = MLP(2, [4], 3)
    model = TorchModel()  # as TorchEstimator._model_from builds it
    model._factory = model_factory(net)
    model._arch, model._state = describe(model._factory), net.state_dict()
    model.task, model.output_width = Problem.MULTICLASS, 3
    rows = [([float(i), float(-i)],) for i in range(10)]
    df = spark_connect.createDataFrame(rows, "features array<float>")
    got = [r["prediction"] for r in model.transform(df).orderBy("features").collect()]
    with torch.no_grad():
        inputs = torch.tensor([r[0] for r in sorted(rows)])
        want = net(inputs).argmax(-1).tolist()
    assert got == [float(w) for w in want]


@pytest.mark.timeout(300)
def test_the_jobs_train_and_evaluate_on_connect(spark_connect, tmp_path, capsys, monkeypatch):
    """SPARK_REMOTE makes the jobs' session a Connect one (here: this suite's server)."""
    import json

    from sparkddl.cli import main
    from tests.integration.test_cli import PRESET, outputs

    monkeypatch.setenv("SPARK_REMOTE", "local[2]")
    assert main(["train", PRESET, *outputs(tmp_path), "--set", "train.epochs=4"]) == 0
    printed = capsys.readouterr().out
    assert "spark connect session" in printed
    run = tmp_path / "out" / (tmp_path / "out" / "LATEST").read_text().strip()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["accuracy"] >= 0.85 and (run / "model" / "weights.pt").is_file()
    assert main(["evaluate", PRESET, *outputs(tmp_path)]) == 0  # TorchModel.load on Connect
    assert f"held-out accuracy           {metrics['accuracy']:.4f}" in capsys.readouterr().out
