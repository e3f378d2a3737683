"""Model, optimizer, loss, metric and architecture handling on the driver (no Spark)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from sparkddl.errors import ConfigError
from sparkddl.fit.checks import check_sample
from sparkddl.fit.inputs import resolve_best_by
from sparkddl.ml.architecture import describe, importable_name
from sparkddl.models import CNN, MLP, build_model
from sparkddl.train.components import model_factory, optimizer_recipe, resolve_loss
from sparkddl.train.metrics import accuracy, best_mode, resolve_metrics
from sparkddl.train.steps import LossFn


def test_optimizer_instance_is_rebuilt_with_every_setting():
    net = torch.nn.Linear(3, 2)
    recipe = optimizer_recipe(torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9,
                                              weight_decay=1e-4, nesterov=True))
    rebuilt = recipe.build(torch.nn.Linear(3, 2).parameters())
    assert type(rebuilt) is torch.optim.SGD
    g = rebuilt.param_groups[0]
    assert (g["lr"], g["momentum"], g["weight_decay"], g["nesterov"]) == (0.05, 0.9, 1e-4, True)
    assert recipe.build(net.parameters(), learning_rate=0.2).param_groups[0]["lr"] == 0.2


def test_optimizer_with_per_group_settings_needs_a_factory():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.5},
                           {"params": net[1].parameters()}], lr=0.1)
    with pytest.raises(ConfigError, match=r"parameter groups with their own settings.*factory"):
        optimizer_recipe(opt)


def test_optimizer_names_and_unknown_ones():
    assert optimizer_recipe("adam", lr=0.01).build(torch.nn.Linear(1, 1).parameters()) \
        .param_groups[0]["lr"] == 0.01
    with pytest.raises(ConfigError, match=r"unknown optimizer 'adamm'; choose one of sgd, adam"):
        optimizer_recipe("adamm")


def test_losses_by_name_and_unknown_ones():
    assert isinstance(resolve_loss("cross_entropy"), torch.nn.CrossEntropyLoss)
    with pytest.raises(ConfigError, match=r"unknown loss 'crossentropy'; choose one of"):
        resolve_loss("crossentropy")


def test_module_factories_copy_the_module():
    net = torch.nn.Linear(2, 2)
    factory = model_factory(net)
    copy = factory()
    assert copy is not net and torch.equal(copy.weight, net.weight)
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module"):
        model_factory(3.5)


def test_metrics_resolve_and_compute():
    metrics = resolve_metrics(["accuracy", "mae"])
    assert list(metrics) == ["accuracy", "mae"]
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1])).item() == pytest.approx(2 / 3)
    assert accuracy(torch.tensor([1.5, -2.0]), torch.tensor([1.0, 1.0])).item() == 0.5
    with pytest.raises(ConfigError, match=r"unknown metric 'f2'; choose among accuracy, mse, "
                                          r"mae, f1, precision"):
        resolve_metrics(["f2"])
    assert best_mode("val_loss") == "min" and best_mode("val_accuracy") == "max"
    assert best_mode("val_rmse") == "min" and best_mode("val_perplexity", "min") == "min"


def test_best_by_lists_valid_choices():
    assert resolve_best_by(None, {"accuracy": accuracy}, has_val=True) == "val_loss"
    assert resolve_best_by(None, {}, has_val=False) == "train_loss"
    with pytest.raises(ConfigError, match=r"'val_loss' \(val_\* needs validation data"):
        resolve_best_by("val_loss", {}, has_val=False)


def test_sample_check_explains_shape_and_label_mistakes():
    net = torch.nn.Linear(64, 10)
    ce = LossFn(("x",), ("y",), (torch.nn.CrossEntropyLoss(),))
    good = {"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.int64)}
    assert check_sample(net, ce, good).kind == "multiclass"
    narrow = {"x": np.zeros((4, 60), np.float32), "y": np.zeros(4, np.int64)}
    with pytest.raises(ConfigError, match=r"x: \[4, 60\] torch.float32.*input size"):
        check_sample(net, ce, narrow)
    floats = {"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.float32)}
    assert check_sample(net, ce, floats).kind == "multiclass"  # whole numbers: class indices
    with pytest.raises(ConfigError, match="'y' holds values that are not whole numbers"):
        check_sample(net, ce, {**floats, "y": np.full(4, 0.5, np.float32)})
    with pytest.raises(ConfigError, match=r"ranges over \[0, 12\] but the model outputs 10"):
        check_sample(net, ce, good, (0, 12))


def test_builtin_models_are_saved_by_import():
    arch = describe(model_factory(MLP(64, [32], 10)))
    assert arch == {"kind": "import", "target": "sparkddl.models:MLP",
                    "kwargs": {"in_features": 64, "hidden": [32], "out_features": 10,
                               "dropout": 0.0}}
    assert describe(model_factory(torch.nn.Linear(2, 2))) == {"kind": "pickle"}
    assert importable_name(build_model) == "sparkddl.models:build_model"
    assert importable_name(lambda: 0) is None
    assert CNN()(torch.zeros(3, 64)).shape == (3, 10)
    with pytest.raises(ConfigError, match=r"cannot import module 'nope' for model 'nope:f'"):
        build_model("nope:f")


def test_secrets_are_redacted_from_configs():
    from sparkddl.cli.preset import redacted
    cfg = {"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "abc",
                              "spark.hadoop.fs.s3a.access.key": "AKIA", "spark.master": "x"}},
           "store": {"token": "t", "path": "/p"}, "password": ""}
    out = redacted(cfg)
    assert out["spark"]["conf"] == {"spark.hadoop.fs.s3a.secret.key": "***",
                                    "spark.hadoop.fs.s3a.access.key": "***", "spark.master": "x"}
    assert out["store"] == {"token": "***", "path": "/p"} and out["password"] == ""


def test_saved_import_targets_must_be_module_classes_unless_trusted():
    from sparkddl.errors import SparkDDLError
    from sparkddl.ml.architecture import rebuild, trusted_loading

    no_pickle = lambda: b""  # noqa: E731
    built = rebuild({"kind": "import", "target": "sparkddl.models:MLP",
                     "kwargs": {"in_features": 4, "hidden": [3], "out_features": 2}},
                    no_pickle, "here")
    assert isinstance(built, MLP)
    evil = {"kind": "import", "target": "os:system", "kwargs": {"command": "echo pwned"}}
    with pytest.raises(SparkDDLError, match=r"'os:system', which is not a torch.nn.Module"):
        rebuild(evil, no_pickle, "here")
    factory = {"kind": "import", "target": "sparkddl.models:build_model",
               "kwargs": {"name": "mlp", "in_features": 4}}
    with pytest.raises(SparkDDLError, match="not a torch.nn.Module class"):
        rebuild(factory, no_pickle, "here")
    with trusted_loading():
        assert isinstance(rebuild(factory, no_pickle, "here"), MLP)
    # a module not imported yet is not imported on the file's word: that runs its code
    assert "this_module_is_not_imported" not in sys.modules
    unimported = {"kind": "import", "target": "this_module_is_not_imported:Net", "kwargs": {}}
    with pytest.raises(SparkDDLError, match=r"module 'this_module_is_not_imported' is not "
                                            r"imported yet.*model=MyNet\(\)"):
        rebuild(unimported, no_pickle, "here")
    assert "this_module_is_not_imported" not in sys.modules
