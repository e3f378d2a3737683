"""The training functions of test_frameworks.py, in a module that imports no training
library itself: each imports what it uses when it runs. A rank unpickles a function by
reference, which imports its module; were these in the test module, every fresh rank process
(local mode, pyspark's torchrun workers) would import Lightning, accelerate and transformers
(about 10 s on two cores) whatever the function uses."""
from __future__ import annotations


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
