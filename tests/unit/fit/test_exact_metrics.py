"""Exact validation metrics (torchmetrics) over the whole validation set, against
scikit-learn on the same rows; per-batch means of the same metrics would differ."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

pytest.importorskip("torchmetrics")  # pinned in all three tested stacks

from sklearn import metrics as sk

from sparkddl.channel import messages as m
from sparkddl.data import DataSpec
from sparkddl.data.source import open_parquet
from sparkddl.errors import ConfigError
from sparkddl.fit import evaluation
from sparkddl.fit.evaluation import SnapshotEvaluator
from sparkddl.fit.inputs import resolve_best_by
from sparkddl.store import Store
from sparkddl.train.metrics import ExactMetric, resolve_metrics
from sparkddl.train.steps import LossFn

ROWS, CLASSES = 600, 3


def _data(tmp_path, y):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 4)).astype(np.float32)
    folder = tmp_path / "val"
    folder.mkdir()
    pq.write_table(pa.table({"x": pa.array(x.tolist(), pa.list_(pa.float32())), "y": y}),
                   folder / "part-0.parquet", row_group_size=100)
    return x, open_parquet(str(folder), DataSpec.of("x", "y"))


def _evaluate(tmp_path, monkeypatch, y, out_features, loss, names, kind):
    monkeypatch.setattr(evaluation, "EVAL_BATCH", 64)  # many batches: means would be off
    x, val = _data(tmp_path, y)
    def make():  # one output per row: [B] (as the labels), else [B, C]
        layers = [torch.nn.Linear(4, out_features)]
        return torch.nn.Sequential(*layers, *([torch.nn.Flatten(0)] if out_features == 1
                                              else []))
    torch.manual_seed(0)
    net = make()
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    metrics = resolve_metrics(names, kind, out_features)
    ev = SnapshotEvaluator(make,
                           LossFn(("x",), ("y",), (loss,)), metrics, val, "val_loss", "min", 0,
                           Store.from_uri(tmp_path), "run1")
    ev.submit(m.Snapshot(1), buf.getvalue(), lambda header: None)
    result = ev.close()
    assert result.errors == []
    with torch.no_grad():
        out = net(torch.from_numpy(x))
    return result.history[0], out, metrics


def test_classifier_metrics_are_exact_over_the_whole_set(tmp_path, monkeypatch):
    y = np.random.default_rng(1).integers(0, CLASSES, ROWS)
    row, out, metrics = _evaluate(tmp_path, monkeypatch, y, CLASSES,
                                  torch.nn.CrossEntropyLoss(),
                                  ["accuracy", "f1", "auroc", "precision_weighted", "mcc"],
                                  "multiclass")
    pred, prob = out.argmax(1).numpy(), torch.softmax(out, 1).numpy()
    assert row["val_accuracy"] == pytest.approx(sk.accuracy_score(y, pred), abs=1e-6)
    assert row["val_f1"] == pytest.approx(sk.f1_score(y, pred, average="macro"), abs=1e-5)
    assert row["val_auroc"] == pytest.approx(
        sk.roc_auc_score(y, prob, multi_class="ovr", average="macro"), abs=1e-5)
    assert row["val_precision_weighted"] == pytest.approx(
        sk.precision_score(y, pred, average="weighted"), abs=1e-5)
    assert row["val_mcc"] == pytest.approx(sk.matthews_corrcoef(y, pred), abs=1e-5)
    # the mean of per-batch F1 values (what a mean metric would report) is not the same
    batch_f1 = np.mean([sk.f1_score(y[i:i + 64], pred[i:i + 64], average="macro")
                        for i in range(0, ROWS, 64)])
    assert abs(batch_f1 - row["val_f1"]) > 1e-3
    # exact metrics have no train_ column; they can still choose the best snapshot
    assert "train_f1" not in resolve_best_by_choices(metrics)
    assert resolve_best_by("val_auroc", metrics, has_val=True) == "val_auroc"


def resolve_best_by_choices(metrics):
    with pytest.raises(ConfigError) as err:
        resolve_best_by("nope", metrics, has_val=True)
    return str(err.value)


def test_binary_and_regression_metrics(tmp_path, monkeypatch):
    y = np.random.default_rng(2).integers(0, 2, ROWS).astype(np.float32)
    row, out, _ = _evaluate(tmp_path, monkeypatch, y, 1, torch.nn.BCEWithLogitsLoss(),
                            ["auroc", "f1", "recall"], "binary")
    z = out.reshape(-1).numpy()
    assert row["val_auroc"] == pytest.approx(sk.roc_auc_score(y, z), abs=1e-5)
    assert row["val_f1"] == pytest.approx(sk.f1_score(y, z > 0), abs=1e-5)
    assert row["val_recall"] == pytest.approx(sk.recall_score(y, z > 0), abs=1e-5)


def test_regression_r2(tmp_path, monkeypatch):
    y = np.random.default_rng(3).standard_normal(ROWS).astype(np.float32)
    row, out, _ = _evaluate(tmp_path, monkeypatch, y, 1, torch.nn.MSELoss(), ["r2", "mae"],
                            "regression")
    assert row["val_r2"] == pytest.approx(sk.r2_score(y, out.reshape(-1).numpy()), abs=1e-4)


def test_metrics_that_do_not_fit_the_problem_are_clear_errors():
    with pytest.raises(ConfigError, match="'auroc' is for classifiers, but this model is a "
                                          "regression model; choose among r2, pearson"):
        resolve_metrics(["auroc"], "regression", 1)
    with pytest.raises(ConfigError, match="'r2' is for regression"):
        resolve_metrics(["r2"], "multiclass", 10)
    with pytest.raises(ConfigError, match="'r2' is computed over one output per row, and this "
                                          "model has 3"):
        resolve_metrics(["r2"], "regression", 3)
    with pytest.raises(ConfigError, match="'mcc' takes no average"):
        resolve_metrics(["mcc_macro"], "multiclass", 10)
    assert isinstance(resolve_metrics(["f1_micro"], "multiclass", 4)["f1_micro"], ExactMetric)
    assert resolve_metrics(["f1_micro"], "multiclass", 4)["f1_micro"].average == "micro"
