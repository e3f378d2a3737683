"""The embedded default job for now: train an MLP on scikit-learn's digits with
``sparkddl.run`` on 2 workers of local Spark, and print what happened."""
from __future__ import annotations

import time


def train_digits(epochs: int = 30, batch_size: int = 32, lr: float = 0.05) -> dict:
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP

    import sparkddl

    sparkddl.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)
    # every rank takes every world-th row: disjoint shards of equal size
    n = len(x_train) // world * world
    xs = torch.tensor(x_train[rank:n:world], dtype=torch.float32)
    ys = torch.tensor(y_train[rank:n:world])
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    start = time.time()
    for epoch in range(epochs):
        perm = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(xs) - batch_size + 1, batch_size):
            idx = perm[i:i + batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
        if rank == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}")
    with torch.no_grad():
        pred = model.module(torch.tensor(x_test, dtype=torch.float32)).argmax(1)
    return {"world_size": world, "train_rows_per_rank": len(xs), "epochs": epochs,
            "train_seconds": time.time() - start,
            "test_accuracy": float((pred == torch.tensor(y_test)).float().mean())}


def main() -> None:
    from pyspark.sql import SparkSession

    import sparkddl

    spark = (SparkSession.builder.master("local[2]").appName("sparkddl-demo")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    start = time.time()
    out = sparkddl.run(train_digits, num_workers=2, spark=spark)
    print(f"trained on {out['world_size']} workers ({out['train_rows_per_rank']} rows each, "
          f"{out['epochs']} epochs) in {out['train_seconds']:.1f}s of training, "
          f"{time.time() - start:.1f}s end to end")
    print(f"held-out digits accuracy: {out['test_accuracy']:.4f}")
    spark.stop()


if __name__ == "__main__":
    main()
