"""Horovod's Spark MNIST example (examples/spark/pytorch/pytorch_spark_mnist.py), ported to
sparkddl.horovod.spark: a Vector features column and a DOUBLE label (what libsvm files
give), a LocalStore, Horovod's keywords; the accuracy computed the example's way, as the
argmax of each row's model output."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from pyspark.ml.linalg import Vectors

from sparkddl.horovod.spark import LocalStore, TorchEstimator
from tests.integration.digits import _arrays


class Net(torch.nn.Module):
    """A small convolutional net over 8x8 images, ending in log-probabilities."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return torch.log_softmax(self.fc2(x), dim=-1)


def libsvm_like(spark):
    x, y = _arrays()
    rows = [(Vectors.dense(r.tolist()), float(label), i % 5) for i, (r, label)
            in enumerate(zip(x, y))]
    return spark.createDataFrame(rows, ["features", "label", "split"])


@pytest.mark.timeout(300)
def test_horovods_mnist_example_on_digits(spark_local, tmp_path):
    df = libsvm_like(spark_local)
    assert dict(df.dtypes)["label"] == "double"
    train, test = df.filter("split != 0").drop("split"), df.filter("split = 0").drop("split")
    torch.manual_seed(0)
    model = Net()
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        est = TorchEstimator(num_proc=2, store=LocalStore(str(tmp_path / "store")), model=model,
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.05,
                                                       momentum=0.5),
                             loss=torch.nn.NLLLoss(), input_shapes=[[-1, 1, 8, 8]],
                             feature_cols=["features"], label_cols=["label"], batch_size=32,
                             epochs=8, validation=0.1, verbose=1)
    said = [str(n.message) for n in notes if n.category is FutureWarning]
    assert any(s.startswith("feature_cols= is Horovod's name") for s in said)
    torch_model = est.setProgress(False).fit(train)
    assert torch_model.task == "multiclass"  # the double label taken as class indices
    pred = torch_model.transform(test).select("label", "rawPrediction").collect()
    label_pred = np.array([np.argmax(r["rawPrediction"]) for r in pred])
    accuracy = float((label_pred == np.array([r["label"] for r in pred])).mean())
    assert accuracy > 0.8, accuracy
    print(f"accuracy {accuracy:.3f}")

    # train_steps_per_epoch caps every rank's steps per epoch (the core's trainStepsPerEpoch)
    capped = TorchEstimator(num_proc=2, store=LocalStore(str(tmp_path / "store")), model=Net(),
                            optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                            loss=torch.nn.NLLLoss(), input_shapes=[[-1, 1, 8, 8]],
                            feature_cols=["features"], label_cols=["label"], batch_size=32,
                            epochs=2, train_steps_per_epoch=3, verbose=0).fit(train)
    assert capped.steps_per_rank == [6, 6]
