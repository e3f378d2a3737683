"""HorovodRunner notebooks run on sparkddl: a HorovodRunner training function as users
wrote it for Databricks (only the two imports changed), on two Spark ranks and on two
processes of the driver (local mode)."""
from __future__ import annotations

import pytest

from sparkddl.errors import ConfigError
from sparkddl.horovod import HorovodRunner


def train(lr: float, epochs: int, batch_size: int = 32) -> dict:
    """An MNIST-style HorovodRunner function, on scikit-learn's digits."""
    import torch
    from sklearn.datasets import load_digits

    import sparkddl.horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different weights everywhere until the broadcast
    pixels, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(pixels / 16.0, dtype=torch.float32), torch.tensor(labels)
    held_out = torch.arange(len(y)) % 5 == 0
    x_train = x[~held_out][hvd.rank()::hvd.size()]
    y_train = y[~held_out][hvd.rank()::hvd.size()]
    steps = int((~held_out).sum()) // hvd.size() // batch_size  # the same on every rank

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(epochs):
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            rows = order[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[rows]), y_train[rows])
            loss.backward()
            optimizer.step()
        mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f}")

    with torch.no_grad():
        accuracy = (model(x[held_out]).argmax(dim=1) == y[held_out]).float().mean().item()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return {"accuracy": accuracy, "checksum": checksum, "size": hvd.size(),
            "checksums": hvd.allgather_object(checksum), "loss": mean_loss}


def check_trained(result: dict) -> None:
    assert result["size"] == 2
    assert result["accuracy"] > 0.8, result
    assert result["checksums"] == [result["checksum"]] * 2  # the ranks ended in step


@pytest.mark.timeout(300)
def test_horovod_runner_trains_on_spark_ranks(spark_local):
    check_trained(HorovodRunner(np=2).run(train, lr=0.05, epochs=3))


@pytest.mark.timeout(300)
def test_horovod_runner_local_mode_trains_on_driver_processes(spark_local):
    check_trained(HorovodRunner(np=-2).run(train, lr=0.05, epochs=3))


@pytest.mark.parametrize("np, words", [(0, "np=0"), ("2", "np must be an integer"),
                                       (True, "np must be an integer")])
def test_bad_np_is_a_config_error(np, words):
    with pytest.raises(ConfigError, match=words):
        HorovodRunner(np=np)


def test_bad_driver_log_verbosity_is_a_config_error():
    with pytest.raises(ConfigError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="some")
