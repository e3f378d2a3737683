"""The training code users already have, unmodified, under ``sparkddl.TorchDistributor``:
PyTorch Lightning (Databricks' notebook: one device per task, ``num_nodes`` = tasks),
Hugging Face ``transformers.Trainer`` and ``accelerate.Accelerator(cpu=True)``. Each runs
twice in one session, since Spark reuses Python workers and these libraries keep process-wide
state; each run's result must equal the first's (same seed, same data)."""
from __future__ import annotations

import pytest

from sparkddl import TorchDistributor

pytest.importorskip("pytorch_lightning", reason="the frameworks test extra is not installed")
pytest.importorskip("accelerate", reason="the frameworks test extra is not installed")
pytest.importorskip("transformers", reason="the frameworks test extra is not installed")

pytestmark = pytest.mark.timeout(240)


def digits(rank: int, world: int):
    """Rank ``rank``'s share of scikit-learn's digits, as float features and long labels."""
    import torch
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[:1200], dtype=torch.float32) / 16
    y = torch.tensor(y[:1200], dtype=torch.long)
    return x[rank::world], y[rank::world]


def lightning_digits(devices: int, num_nodes: int, epochs: int = 2) -> dict:
    """Databricks' Lightning notebook, in short: a LightningModule, a DataLoader, a Trainer
    with ``strategy="ddp"``, run by TorchDistributor."""
    import os

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 10)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    pl.seed_everything(0)
    x, y = digits(0, 1)  # Lightning's DistributedSampler shards it
    loader = DataLoader(TensorDataset(x, y), batch_size=50)
    model = Net()
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes,
                         strategy="ddp", max_epochs=epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    weight = model.layer.weight.detach()
    import torch.distributed as dist
    copies = [None] * trainer.world_size
    dist.all_gather_object(copies, weight.sum().item()) if dist.is_initialized() else None
    accuracy = (model.layer(x).argmax(1) == y).float().mean().item()
    return {"world": trainer.world_size, "global_rank": trainer.global_rank,
            "checksum": weight.sum().item(), "copies": copies, "accuracy": accuracy,
            "pid_env": os.environ.get("LOCAL_RANK")}


def accelerate_digits(epochs: int = 3) -> dict:
    """accelerate's basic loop on CPU: Accelerator(cpu=True), prepare, backward."""
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x, y = digits(0, 1)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.cross_entropy(model(xb), yb))
            optimizer.step()
    weight = accelerator.unwrap_model(model).weight.detach()
    copies = accelerator.gather(weight.sum().reshape(1)).tolist()
    return {"world": accelerator.num_processes, "checksum": weight.sum().item(),
            "copies": copies}


def transformers_digits() -> dict:
    """transformers.Trainer on a small torch module (no download: nothing pretrained)."""
    import torch
    from transformers import Trainer, TrainingArguments

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 10)

        def forward(self, features, labels=None):
            logits = self.layer(features)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            return {"loss": loss, "logits": logits}

    x, y = digits(0, 1)
    rows = [{"features": a, "labels": b} for a, b in zip(x, y)]
    torch.manual_seed(0)
    model = Net()
    import tempfile
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=25,
                             num_train_epochs=2, learning_rate=0.5, optim="sgd",
                             lr_scheduler_type="constant", report_to=[], save_strategy="no",
                             use_cpu=True, seed=0, disable_tqdm=True, logging_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    weight = model.layer.weight.detach()
    import torch.distributed as dist
    copies = [None] * dist.get_world_size()
    dist.all_gather_object(copies, weight.sum().item())
    return {"world": trainer.args.world_size, "checksum": weight.sum().item(),
            "copies": copies}


def _synced(result: dict, world: int) -> None:
    assert result["world"] == world
    assert len(set(result["copies"])) == 1, result  # every rank holds the same weights


def test_lightning_one_device_per_task_num_nodes_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(lightning_digits, 1, 2)
    _synced(first, 2)
    assert first["accuracy"] > 0.8
    second = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(lightning_digits, 1, 2)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)
    # pyspark's own TorchDistributor (torchrun in each task) trains the same model
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkDistributor
    theirs = PysparkDistributor(num_processes=2, local_mode=False,
                                use_gpu=False).run(lightning_digits, 1, 2)
    assert theirs["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def test_lightning_devices_in_local_mode(spark_local):
    result = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(lightning_digits, 2, 1)
    _synced(result, 2)


def test_accelerate_cpu_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(accelerate_digits)
    _synced(first, 2)
    second = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(accelerate_digits)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def test_transformers_trainer_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(transformers_digits)
    _synced(first, 2)
    second = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(transformers_digits)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def accelerate_bare() -> float:
    """accelerate's loop with a bare Accelerator() on CPU: it forms no process group."""
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    return float(accelerator.num_processes) + 0 * model.weight.sum().item()


def independent_ranks() -> int:
    import os
    return int(os.environ["RANK"])


def test_unsynced_training_is_named_at_the_driver(spark_local):
    import sparkddl
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match=r"Accelerator\(cpu=True\)"):
        processes = TorchDistributor(num_processes=2, local_mode=False,
                                     use_gpu=False).run(accelerate_bare)
    assert processes == 1.0  # each rank thought it was alone
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match="num_nodes=2"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(accelerate_bare)
    # Lightning checks its own world against torchrun's: a Trainer without num_nodes fails
    with pytest.raises(sparkddl.TrainingFailedError, match="does not match the world size"):
        TorchDistributor(num_processes=2, local_mode=False,
                         use_gpu=False).run(lightning_digits, 1, 1, 1)
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match="no rank called"):
        assert sparkddl.run(independent_ranks, num_workers=2) == 0


def test_synced_runs_do_not_warn(spark_local, recwarn):
    import sparkddl
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(accelerate_digits, 1)
    sparkddl.run(accelerate_digits, 1, num_workers=2)
    assert not [w for w in recwarn if issubclass(w.category, sparkddl.UnsyncedTrainingWarning)]
