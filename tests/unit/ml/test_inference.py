"""TorchModel.transform's executor side: the device it runs on and the batches it feeds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sparkddl.errors import ClusterError, ConfigError
from sparkddl.ml.inference import _predict_frames, check_device, resolve_device
from sparkddl.problems import Problem
from tests.stacks import needs_gpu


def test_the_device_follows_the_choice_the_training_and_the_executor():
    assert resolve_device("auto", False, True, ["1"]) == "cpu"  # trained on CPU
    assert resolve_device("auto", True, True, ["1"]) == "cuda:1"  # the task's own GPU
    assert resolve_device("auto", True, True, []) == "cuda:0"
    assert resolve_device("auto", True, False, []) == "cpu"  # no GPU here: CPU, as asked
    assert resolve_device("cuda", False, True, []) == "cuda:0"
    assert resolve_device("cpu", True, True, ["0"]) == "cpu"
    # a training task of this reused worker initialized CUDA seeing only GPUs 1 and 2
    assert resolve_device("auto", True, True, ["2"], visible_at_init="1,2") == "cuda:1"
    with pytest.raises(ClusterError, match="spark.python.worker.reuse=false"):
        resolve_device("auto", True, True, ["0"], visible_at_init="1,2")
    with pytest.raises(ConfigError, match="inferenceDevice='cuda' but torch on executor"):
        resolve_device("cuda", False, False, [])
    with pytest.raises(ConfigError, match="unknown inferenceDevice 'gpu'; choose one of auto"):
        check_device("gpu")


def _frames(rows=10, width=4):
    rng = np.random.default_rng(0)
    return [pd.DataFrame({"x": list(rng.standard_normal((rows, width)).astype(np.float32))})]


def _predict(module, device, batch_rows=3):
    [out] = list(_predict_frames(module, ["x"], Problem.MULTICLASS, batch_rows, {},
                                 iter(_frames()), device))
    return out


def test_batches_of_a_frame_give_what_one_forward_pass_gives():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3).eval()
    out = _predict(net, "cpu")
    x = torch.from_numpy(np.stack(_frames()[0]["x"].to_numpy()))
    want = net(x).argmax(1).double().numpy()
    assert out["prediction"].tolist() == want.tolist() and len(out) == 10


@needs_gpu
def test_on_cuda_the_predictions_match_the_cpu():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3).eval()
    on_cpu = _predict(net, "cpu")
    on_gpu = _predict(net.to("cuda:0"), "cuda:0")
    assert on_gpu["prediction"].tolist() == on_cpu["prediction"].tolist()
    assert np.allclose(np.stack(on_gpu["raw"]), np.stack(on_cpu["raw"]), atol=1e-5)


def test_feature_rows_that_cannot_feed_the_model_are_named_with_the_fix():
    from sparkddl.export.portable import column
    rows = pd.Series([np.ones(4), None, np.ones(4)], name="pixels")
    with pytest.raises(ValueError,
                       match=r"'pixels' has 1 null row.*na\.drop\(subset=\['pixels'\]\)"):
        column(rows, None)
    with pytest.raises(ValueError, match=r"'pixels' has 2 null row\(s\) in a batch of 2"):
        column(pd.Series([None, None], name="pixels", dtype=object), None)
    ragged = pd.Series([np.ones(4), np.ones(3)], name="pixels")
    with pytest.raises(ValueError,
                       match=r"'pixels' holds rows of different shapes \(\(3,\), \(4,\)\)"):
        column(ragged, None)
    short = pd.Series([np.ones(32), np.ones(32)], name="pixels")
    with pytest.raises(ValueError, match=r"'pixels' has 32 value\(s\) per row; the model "
                                         r"takes 64 \(shape \[8, 8\]\)"):
        column(short, [8, 8])
    assert column(pd.Series([np.ones(64)] * 2, name="pixels"), [8, 8]).shape == (2, 8, 8)
    assert column(pd.Series([1.0, float("nan")], name="x"), None).shape == (2,)  # NaN predicts NaN


def test_an_exported_models_input_check_runs_once_per_shape_and_still_refuses(monkeypatch):
    """torch.export's check of the inputs against the program (a pre-hook at every call) runs
    once per set of shapes for a model shipped as sparkddl ships it; an input that does not
    fit is refused at every call."""
    from torch.export import _unlift

    from sparkddl.export.program import InputSpec, export, load
    from sparkddl.ml.inference import checked_once_per_shape
    net = torch.nn.Linear(3, 2).eval()
    program = export(net, (InputSpec("f", (3,), "float32"),))
    module = checked_once_per_shape(load(program, net.state_dict()))
    plain = load(program, net.state_dict())
    checks = []
    real = _unlift._check_input_constraints_for_graph

    def counted(*args):
        checks.append(1)
        return real(*args)
    monkeypatch.setattr(_unlift, "_check_input_constraints_for_graph", counted)
    x = torch.randn(5, 3)
    for _ in range(3):
        assert torch.equal(module(x), plain(x))
    assert len(checks) == 1 + 3  # the plain module checks at every call
    module(torch.ones(7, 3))
    assert len(checks) == 5
    for _ in range(2):
        with pytest.raises(Exception, match=r"expected 3|equal to 3|== 3"):
            module(torch.ones(5, 4))
    assert len(checks) == 7
