"""The jobs and the ``sparkddl`` CLI: the embedded default end to end, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkddl.cli import main
from sparkddl.errors import SparkDDLError
from sparkddl.ml import TorchModel

ROOT = Path(__file__).resolve().parents[2]
PRESET = str(ROOT / "conf" / "digits.toml")


SECRET = "s3cr3t-do-not-print"


def outputs(tmp_path: Path) -> list[str]:
    return ["--set", f"output.dir={tmp_path / 'out'}", "--set", f"train.store={tmp_path / 'st'}",
            "--set", "train.progress=false",
            "--set", f"spark.conf.spark.hadoop.fs.s3a.secret.key={SECRET}"]


@pytest.mark.timeout(300)
def test_digits_preset_trains_evaluates_and_saves(spark_local, tmp_path, capsys):
    assert main(["train", PRESET, *outputs(tmp_path)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert SECRET not in printed + captured.err
    run_id = (tmp_path / "out" / "LATEST").read_text().strip()
    run = tmp_path / "out" / run_id
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["accuracy"] >= 0.95 and metrics["rows"] > 300
    assert f"held-out accuracy           {metrics['accuracy']:.4f}" in printed
    assert f"run {run_id}: model file://{run}/model" in printed
    history = json.loads((run / "history.json").read_text())
    assert [r["epoch"] for r in history] == list(range(1, 21))
    png = (run / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert (run / "model" / "weights.pt").is_file()
    config = (run / "config.json").read_text()
    assert SECRET not in config and '"spark.hadoop.fs.s3a.secret.key": "***"' in config
    # evaluate reloads the latest run's model (built-in MLP: rebuilt by import, not unpickled)
    assert main(["evaluate", PRESET, *outputs(tmp_path)]) == 0
    assert f"held-out accuracy           {metrics['accuracy']:.4f}" in capsys.readouterr().out
    # prepare finds the data the train step materialized
    assert main(["prepare", PRESET, *outputs(tmp_path)]) == 0
    assert "reused (cache hit)" in capsys.readouterr().out


FACTORY_PRESET = """\
[model]
name = "tests.integration.user_models:small_mlp"
kwargs = { in_features = 64, num_classes = 10 }

[optimizer]
name = "adam"
lr = 0.01

[train]
epochs = 2
metrics = ["accuracy"]
"""


@pytest.mark.timeout(300)
def test_evaluate_a_model_built_by_a_factory_function_without_trust(spark_local, tmp_path,
                                                                    capsys):
    preset = tmp_path / "factory.toml"
    preset.write_text(FACTORY_PRESET)
    assert main(["train", str(preset), *outputs(tmp_path)]) == 0
    run = tmp_path / "out" / (tmp_path / "out" / "LATEST").read_text().strip()
    trained = json.loads((run / "metrics.json").read_text())
    # the saved file names a function: a plain load runs the saved torch.export program
    # instead, and without the program an untrusted load from the file alone refuses
    assert TorchModel.load(str(run / "model")).input_specs[0].shape == (64,)
    (run / "model" / "program.json").unlink()
    with pytest.raises(SparkDDLError, match=r"trusted=True"):
        TorchModel.load(str(run / "model"))
    capsys.readouterr()
    # evaluate loads the weights into the preset's model instead: no trust needed
    assert main(["evaluate", str(preset), *outputs(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"held-out accuracy           {trained['accuracy']:.4f}" in printed
    assert trained["accuracy"] > 0.5 and trained["rows"] > 300
    # a preset whose model does not fit the saved weights is a one-line error
    assert main(["evaluate", str(preset), "--set", "model.kwargs.num_classes=12",
                 *outputs(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not fit the preset's model 'tests.integration.user_models:small_mlp'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["train", "conf/nope.toml"], "error: preset 'conf/nope.toml' not found"),
    (["train", PRESET, "--set", "train.epoch=3"], "error: unknown key 'train.epoch'; keys of "
                                                  "[train]: epochs, batch_size"),
    (["train", PRESET, "--set", "train.epochs=three"], "error: 'train.epochs' must be an integer"),
    (["train", PRESET, "--set", "model.name=no_such_pkg.nets:make"],
     "error: cannot import module 'no_such_pkg.nets' for model 'no_such_pkg.nets:make'"),
    (["train", PRESET, "--set", "model.name=sparkddl.models:Nope"],
     "error: module 'sparkddl.models' has no attribute 'Nope'"),
    (["train", PRESET, "--set", "data.source=parquet:/no/such/data"],
     "error: data path '/no/such/data' cannot be read"),
    (["evaluate", PRESET, "--set", "output.dir=/no/runs/here"],
     "error: no trained model under file:///no/runs/here"),
])
def test_bad_input_is_one_line_and_exit_2(spark_local, tmp_path, capsys, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "output.dir" not in " ".join(args):
        args += ["--set", f"output.dir={tmp_path / 'out'}", "--set", f"train.store={tmp_path}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unwritable_output_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert main(["train", PRESET, "--set", f"output.dir={tmp_path / 'a-file' / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["train", PRESET, "--set", "train.epoch=3", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_plan_calibrates_and_predicts_every_strategy(spark_local, tmp_path, capsys):
    assert main(["plan", PRESET, "--workers", "1,2,8", *outputs(tmp_path)]) == 0
    printed, mem_printed = capsys.readouterr().out.split("Peak memory per rank")

    def table_rows(text):
        return [ln.split("|")[1:-1] for ln in text.splitlines()
                if ln.startswith("| ") and "strategy" not in ln]

    rows = table_rows(printed)
    strategies = {r[0].strip() for r in rows}
    from sparkddl.strategies.ssp_wire import store_queue_problem
    # ssp where this torch's TCPStore has queues (torch 2.6's has none: refused by name)
    assert {"allreduce", "powersgd", "local_sgd", "gossip"} <= strategies
    assert ("ssp" in strategies) == (store_queue_problem() is None)
    assert len(rows) == 3 * len(strategies)
    assert all(r[-1].strip() in ("compute", "communication", "input") for r in rows)
    from sparkddl.strategies.fsdp import fsdp_problem
    assert ("fsdp" in strategies) == (fsdp_problem("cpu") is None)  # timed where it runs
    # every strategy, fsdp and ssp too (their memory is told where they are not timed), for
    # 1, 2 and 8 workers
    mem = table_rows(mem_printed)
    assert {r[0].strip() for r in mem} == strategies | {"fsdp", "ssp"}
    assert len(mem) == 3 * len(strategies | {"fsdp", "ssp"})
    number = lambda cell: float(cell.replace(",", ""))  # noqa: E731
    for r in mem:  # peak = the parts; a digits MLP fits a rank of this machine
        runtime, model, acts, temps, extra, reader, epoch_end = map(number, r[3:10])
        assert number(r[2]) == pytest.approx(
            runtime + model + extra + reader + max(acts + temps, epoch_end), abs=3)
        assert runtime > 100 and r[-1].strip() == "yes"
    [plan_dir] = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("plan-")]
    assert (plan_dir / "speedup.png").read_bytes().startswith(b"\x89PNG")
    saved = json.loads((plan_dir / "plan.json").read_text())
    assert saved["predictions"] and len(saved["memory"]) == len(mem)
    measured = saved["calibration"]["memory"]
    assert measured["param_bytes"] == measured["grad_bytes"] > 0
    assert measured["optimizer_bytes"] > 0 and measured["activation_bytes"] > 0


def test_plan_rejects_bad_worker_counts(capsys):
    assert main(["plan", PRESET, "--workers", "1,0"]) == 2
    assert "--workers must be positive integers" in capsys.readouterr().err
