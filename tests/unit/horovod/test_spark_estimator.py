"""sparkddl.horovod.spark: every Horovod TorchEstimator keyword maps onto a sparkddl Param or
is refused by name; notes once per keyword; Store objects; shapes with the batch's -1."""
from __future__ import annotations

import warnings

import pytest
import torch

import sparkddl.ml
from sparkddl.errors import ConfigError
from sparkddl.fit.checks import check_sample
from sparkddl.horovod.spark import (
    DBFSLocalStore,
    HDFSStore,
    LocalStore,
    Store,
    TorchEstimator,
    TorchModel,
)
from sparkddl.horovod.spark import torch as facade
from sparkddl.train.steps import loss_fn

# Horovod's keywords with a value that means something (not its default None)
VALUES = {"num_proc": 3, "feature_cols": ["x"], "label_cols": ["y"],
          "sample_weight_col": "w", "batch_size": 16, "shuffle_buffer_size": 100,
          "use_gpu": False, "train_reader_num_workers": 3, "random_seed": 7,
          "backward_passes_per_step": 2, "run_id": "run-1", "train_steps_per_epoch": 5,
          "input_shapes": [[-1, 1, 8, 8]], "label_shapes": [[-1]],
          "loss_weights": [0.5], "inmemory_cache_all": True, "verbose": 0,
          "gradient_compression": "fp16", "reader_pool_type": "process",
          "terminate_on_nan": True, "val_batch_size": 64, "partitions_per_process": 10,
          "val_reader_num_workers": 2, "train_async_data_loader_queue_size": 4,
          "val_async_data_loader_queue_size": 4, "mp_start_method": "spawn",
          "validation_steps_per_epoch": 3, "transformation_fn": lambda row: row,
          "train_minibatch_fn": lambda *a: None, "backend": object(),
          "loss_constructors": [torch.nn.MSELoss]}
BASE = {"model": torch.nn.Linear(64, 10), "optimizer": lambda p: torch.optim.SGD(p, lr=0.1),
        "loss": torch.nn.CrossEntropyLoss()}


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(facade, "_noted", set())


def build(**kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = TorchEstimator(**kwargs)
    return est, [str(w.message) for w in caught if w.category is FutureWarning]


def test_every_horovod_keyword_is_mapped_refused_or_noted():
    known = {*facade.RENAMED, *facade.REFUSED, *facade.NO_EFFECT, *facade.CONVERTED}
    assert known == set(VALUES)
    for name, value in VALUES.items():
        extra = {"loss": None} if name == "loss_constructors" else {}
        if name in facade.REFUSED:
            with pytest.raises(ConfigError, match=f"{name}= is not supported: .+"):
                TorchEstimator(**BASE, **{name: value})
            continue
        est, notes = build(**{**BASE, **extra, name: value})
        assert len(notes) == 1 and notes[0].startswith(f"{name}="), (name, notes)
        est.train_config()  # a valid sparkddl config


def test_renamed_keywords_set_the_sparkddl_params():
    est, notes = build(**BASE, **{k: VALUES[k] for k in facade.RENAMED})
    assert "feature_cols= is Horovod's name; sparkddl calls it featuresCol" in notes
    config = est.train_config()
    assert (config.num_workers, config.features, config.label, config.sample_weight,
            config.batch_size, config.shuffle_buffer, config.reader_workers, config.seed,
            config.backward_passes_per_step, config.run_id, config.steps_per_epoch) == \
        (3, ("x",), "y", "w", 16, 100, 3, 7, 2, "run-1", 5)
    assert config.epochs == 1  # Horovod's default


def test_converted_keywords():
    est, _ = build(**BASE, feature_cols=["x"], input_shapes=[[-1, 1, 8, 8]],
                   inmemory_cache_all=True, verbose=0, gradient_compression="fp16",
                   reader_pool_type="process", val_batch_size=32)
    config = est.train_config()
    assert config.feature_shapes == {"x": (1, 8, 8)}
    assert config.epoch_cache_mb == facade.CACHE_ALL_MB and config.progress is False
    assert config.strategy_options == {"compression": "fp16", "warmup_steps": 0}
    assert config.reader_pool == "thread"


def test_notes_are_said_once_per_keyword_per_process():
    _, first = build(**BASE, feature_cols=["x"], batch_size=8)
    _, again = build(**BASE, feature_cols=["x"], batch_size=8, label_cols=["y"])
    assert len(first) == 2 and again == ["label_cols= is Horovod's name; sparkddl calls it "
                                         "labelCol"]


def test_refusals_and_clashes_say_what_to_do():
    with pytest.raises(ConfigError, match="trainStep"):
        TorchEstimator(**BASE, train_minibatch_fn=lambda *a: None)
    with pytest.raises(ConfigError, match="unknown argument bogus="):
        TorchEstimator(**BASE, bogus=1)
    with pytest.raises(ConfigError, match="feature_cols= and featuresCol="):
        TorchEstimator(**BASE, feature_cols=["x"], featuresCol="x")
    with pytest.raises(ConfigError, match="label_shapes.*reshape it in the loss"):
        TorchEstimator(**BASE, label_shapes=[[-1, 2, 5]])
    with pytest.raises(ConfigError, match="2 shapes for 1 feature"):
        TorchEstimator(**BASE, feature_cols=["x"], input_shapes=[[-1, 4], [-1, 4]])
    with pytest.raises(ConfigError, match="powersgd"):
        TorchEstimator(**BASE, gradient_compression="int8")
    with pytest.raises(ConfigError, match="one weight per label"):
        TorchEstimator(**BASE, label_cols=["a", "b"], loss_weights=[1.0])
    # None is Horovod's default for these: nothing to refuse
    est, _ = build(**BASE, transformation_fn=None, backend=None, label_shapes=None)
    assert est.train_config().transform_fn is None


def test_loss_constructors_and_weights_over_several_labels():
    est, _ = build(model=BASE["model"], optimizer=BASE["optimizer"], label_cols=["a", "b"],
                   loss_constructors=[torch.nn.MSELoss, torch.nn.L1Loss], loss_weights=[2, 0.5])
    losses = est.getOrDefault("loss")
    assert [type(w.loss).__name__ for w in losses] == ["MSELoss", "L1Loss"]
    out, label = torch.zeros(4, 1), torch.ones(4, 1)
    assert losses[0](out, label).item() == pytest.approx(2.0)
    assert losses[1](out, label).item() == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="not both"):
        TorchEstimator(**BASE, loss_constructors=[torch.nn.MSELoss])


def test_store_objects_give_their_path_to_either_estimator(tmp_path):
    assert isinstance(Store.create(str(tmp_path)), LocalStore)
    assert isinstance(Store.create("hdfs://nn:8020/x"), HDFSStore)
    assert Store.create("dbfs:/ml/x").prefix_path == "/dbfs/ml/x"
    assert isinstance(Store.create("/dbfs/ml/x"), DBFSLocalStore)
    assert HDFSStore("/user/me", host="nn", port=8020).prefix_path == "hdfs://nn:8020/user/me"
    with pytest.raises(ConfigError, match=r"LocalStore\(train_path=\) is not supported"):
        LocalStore(str(tmp_path), train_path="/elsewhere")
    store = LocalStore(str(tmp_path))
    assert TorchEstimator(**BASE, store=store).train_config().store == str(tmp_path)
    core = sparkddl.ml.TorchEstimator(store=store)
    assert core.getStore() == str(tmp_path) and core.train_config().store == str(tmp_path)

    class HorovodLike:  # Horovod's own Store objects have a prefix_path too
        prefix_path = "hdfs://nn/runs"
    assert sparkddl.ml.TorchEstimator(store=HorovodLike()).getStore() == "hdfs://nn/runs"
    assert TorchModel is sparkddl.ml.TorchModel


def test_core_feature_shapes_take_a_leading_batch_dimension():
    est = sparkddl.ml.TorchEstimator(featureShapes={"features": [-1, 64]})
    assert est.train_config().feature_shapes == {"features": (64,)}
    model = sparkddl.ml.TorchModel()
    model._set(featureShapes={"features": [-1, 1, 8, 8]})
    model._input_columns = {}
    assert model._feature_shapes(["features"]) == {"features": [1, 8, 8]}


# ---- float labels (what libsvm gives) ----

def _sample(labels):
    return {"features": torch.rand(len(labels), 4).numpy(),
            "label": torch.tensor(labels, dtype=torch.float32).numpy()}


@pytest.mark.parametrize("loss", [torch.nn.CrossEntropyLoss(), torch.nn.functional.cross_entropy])
def test_a_class_index_loss_with_whole_float_labels_is_a_classifier(loss):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LogSoftmax(-1))
    step = loss_fn(loss, ("features",), ("label",), None, None)
    problem = check_sample(model, step, _sample([0.0, 2.0, 1.0, 2.0]))
    assert problem.kind == "multiclass" and problem.output_width == 3 and not problem.note
    batch = {k: torch.from_numpy(v) for k, v in _sample([0.0, 2.0, 1.0, 2.0]).items()}
    _, _, target = step(model, batch)
    assert target.dtype == torch.int64
    with pytest.raises(ConfigError, match="not whole numbers"):
        check_sample(model, step, _sample([0.5, 2.0, 1.0, 2.0]))


def test_float_labels_with_several_outputs_and_another_loss_say_it_is_a_regression(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LogSoftmax(-1))
    step = loss_fn(lambda out, y: torch.nn.functional.nll_loss(out, y.long()), ("features",),
                   ("label",), None, None)
    with caplog.at_level("WARNING"):
        problem = check_sample(model, step, _sample([0.0, 2.0, 1.0, 2.0]))
    assert problem.kind == "regression"
    assert "3 model outputs: this fit is a regression" in problem.note
    assert "cast('long')" in caplog.text


def test_weighted_class_index_losses_still_take_class_indices_and_hvd_compression_maps():
    import torch

    import sparkddl.horovod.torch as hvd
    from sparkddl.horovod.spark.torch import WeightedLoss, _compression
    from sparkddl.train.steps import class_target, takes_class_indices
    weighted = WeightedLoss(torch.nn.CrossEntropyLoss(), 0.5)
    assert takes_class_indices(weighted)
    target = class_target(weighted, torch.zeros(3, 10), torch.tensor([1.0, 2.0, 9.0]), "label")
    assert target.dtype == torch.int64 and target.tolist() == [1, 2, 9]
    assert _compression(hvd.Compression.none, {}) == {}
    assert _compression(hvd.Compression.fp16, {})["strategyOptions"]["compression"] == "fp16"
