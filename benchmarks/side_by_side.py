"""sparkddl side by side with plain PyTorch and with the Spark recipe users follow today.

One process, one local[2] session, the same data, model and hyper-parameters for every
runner:
  - data: scikit-learn's digits /16, tiled to 201,264 rows with N(0, 0.05) noise, written
    once with pyarrow as 4 Parquet files (not timed) and read with ``spark.read.parquet``:
    the users' existing DataFrame. Every runner starts from that DataFrame.
  - model: MLP 64-256-256-10, the same initial weights (torch seed 0); Adam, lr 1e-3;
    cross-entropy; batch 256 per worker; 3 epochs; every rank uses 1 torch thread.
Runners:
  - floor: one process, no Spark in the loop: the table's files read with pyarrow into
    tensors, then a plain loop (batch 256, a new permutation each epoch) with 1 and with 2
    torch threads; the
    per-worker goal compares with 1 thread, as each rank below has 1;
  - reference: plain torch DDP in 2 processes (torch.multiprocessing, gloo on 127.0.0.1)
    over the same in-memory tensors, no Spark: the ceiling of synchronous DDP here;
  - peer: ``TorchDistributor(num_processes=2, local_mode=False)`` running a training
    function written as Spark's and Databricks' docs show: the DataFrame written to Parquet
    by Spark (32 MiB row groups, as Petastorm's Spark converter writes), Petastorm
    ``make_batch_reader`` sharded by rank with ``num_epochs=None`` and its PyTorch
    ``DataLoader``, DDP, and rows // (batch x world) steps per epoch on every rank;
  - peer on the table's files: the same recipe, Petastorm reading the Parquet files the
    DataFrame reads (no Spark write): where users whose data is already a table start;
  - ``sparkddl.run``: the same DDP loop, reading through sparkddl's data plane (``prepare``
    on the driver, ``epoch_batches`` on the ranks);
  - ``TorchEstimator.fit``: cold on the DataFrame (a plain scan of the table: read in
    place, nothing written), cold on the DataFrame filtered (``label >= 0``: no longer the
    table's files, so materialized into the store), and warm (a second fit on the same
    store); warm with the allreduce strategy's
    ``overlap=False`` (gradients averaged after the backward pass by sparkddl, not by DDP);
    and warm with ``strategy="local_sgd"`` (models averaged every 8 steps instead of
    gradients every step: another algorithm).
Order: floor, reference, the two peers, fit (cold, in place), fit (cold, materialized),
run (cold, its own store), fit (warm), the two warm variants.
The first sparkddl call pays the session's first-use costs (JIT).
End-to-end time counts from the DataFrame (after ``df.count()``, which the users' job has
done anyway) to the trained model on the driver. The session start and the first start of
the Spark Python workers (which import torch once per worker) are shared by every Spark
runner and reported separately. Time in the training loop is measured on rank 0 (the sum of
the epochs, each from its first batch request to its last step and the epoch-end loss
allreduce); for the fit it is the sum of ``epoch_time_s`` from ``model.history``.
The fixed costs of sparkddl are taken from timestamps: wrappers around library functions
and the arrival times of the ranks' channel messages on the driver (nothing in sparkddl is
edited).
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import digits_parquet, local_spark, mlp, spawn_ranks
from side_by_side_report import (
    FIT_COLD,
    FIT_DERIVED,
    FIT_WARM,
    FLOOR,
    FLOOR_2,
    LOCAL_SGD,
    NO_OVERLAP,
    PEER,
    PEER_DISK,
    REFERENCE,
    RUN_COLD,
    report,
)
from tracing import CHECKS, DATA, END, LAUNCH, LOOP, Trace

WORKERS = 2


@dataclass(frozen=True)
class Hyper:
    epochs: int = 3
    batch: int = 256  # per worker
    lr: float = 1e-3
    seed: int = 0


# ---------------------------------------------------------------- floor: plain PyTorch

def load_tensors(path: Path) -> tuple[Any, Any]:
    """The whole table as in-memory tensors on the driver, read with pyarrow from its files
    (``df.toArrow()`` collects through the JVM and exceeds spark.driver.maxResultSize at 4 M
    rows)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    table = pq.read_table(path, columns=["features", "label"])
    feats = table.column("features").combine_chunks()
    # copies owned by torch: Arrow's buffers are read-only and cannot be shared with the
    # reference's processes
    x = np.array(feats.flatten().to_numpy().reshape(len(feats), -1))
    return torch.from_numpy(x), torch.from_numpy(np.array(table.column("label").to_numpy()))


def floor(x: Any, y: Any, hp: Hyper, threads: int) -> dict[str, Any]:
    """A plain loop over in-memory tensors: a new permutation each epoch, batches gathered."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(hp.seed)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        gen = torch.Generator().manual_seed(hp.seed)
        steps, epoch_times, loss_sum = len(y) // hp.batch, [], 0.0
        for _ in range(hp.epochs):
            t = time.perf_counter()
            order, loss_sum = torch.randperm(len(y), generator=gen), 0.0
            for s in range(steps):
                idx = order[s * hp.batch:(s + 1) * hp.batch]
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                loss_sum += loss.item()
            epoch_times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(saved)
    return {"loop_s": sum(epoch_times), "samples": steps * hp.batch * hp.epochs,
            "final_loss": loss_sum / steps, "epoch_times": epoch_times}


# --------------------------------- the DDP loop of the peer, sparkddl.run and the reference

def ddp_loop(batches: Callable[[int], Any], steps: int, hp: Hyper, stamps: dict[str, float]
             ) -> dict[str, Any]:
    """Train a DDP-wrapped MLP on ``steps`` batches per epoch from ``batches(epoch)``;
    rank 0's timings and the rank-averaged loss of the last epoch."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(hp.seed)
    model = DDP(mlp())
    opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    stamps["model_ready"] = time.time()
    epoch_times, sums = [], torch.zeros(2, dtype=torch.float64)
    for epoch in range(hp.epochs):
        t = time.perf_counter()
        sums.zero_()
        for step, batch in zip(range(steps), batches(epoch)):
            x, y = batch["features"], batch["label"]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sums[0] += loss.item()
            sums[1] += 1
            if epoch == 0 and step == 0:
                stamps["first_step"] = time.time()
        dist.all_reduce(sums)
        epoch_times.append(time.perf_counter() - t)
    stamps["loop_end"] = time.time()
    return {"loop_s": sum(epoch_times), "epoch_times": epoch_times,
            "samples": steps * hp.batch * hp.epochs * dist.get_world_size(),
            "final_loss": float(sums[0] / sums[1]), "threads": torch.get_num_threads()}


# ------------------------------- reference: plain torch DDP, 2 processes, in-memory tensors

def reference_train(x: Any, y: Any, hp: Hyper) -> dict[str, Any]:
    """One rank of plain DDP outside Spark: rows rank::world of the in-memory tensors."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    xs, ys = x[rank::world], y[rank::world]
    steps = len(ys) // hp.batch
    return ddp_loop(permuted(xs, ys, steps, hp, rank), steps, hp, {})


def permuted(xs: Any, ys: Any, steps: int, hp: Hyper, rank: int) -> Callable[[int], Any]:
    """``batches(epoch)`` for ddp_loop: a new seeded permutation of the rank's rows each
    epoch, ``steps`` batches gathered from it."""
    import torch
    gen = torch.Generator().manual_seed(hp.seed * 1000 + rank)

    def batches(epoch: int) -> Any:
        order = torch.randperm(len(ys), generator=gen)
        for s in range(steps):
            idx = order[s * hp.batch:(s + 1) * hp.batch]
            yield {"features": xs[idx], "label": ys[idx]}
    return batches


def files_train(files: list[str], hp: Hyper) -> dict[str, Any]:
    """One rank of plain DDP outside Spark that reads its own files (``files[rank::world]``)
    with pyarrow into tensors: the ceiling of an allreduce fit on these files."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    t = time.perf_counter()
    parts = [load_tensors(Path(f)) for f in files[rank::world]]
    xs, ys = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    read_s = time.perf_counter() - t
    steps = torch.tensor([len(ys) // hp.batch])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # equal steps on every rank
    steps = int(steps)
    return {**ddp_loop(permuted(xs, ys, steps, hp, rank), steps, hp, {}), "steps": steps,
            "read_s": read_s}


def reference(x: Any, y: Any, hp: Hyper, load_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    out = spawn_ranks(reference_train, WORKERS, x, y, hp)
    return {**out, "e2e_s": load_s + time.perf_counter() - start}


# -------------------------------------------------------- peer: TorchDistributor + Petastorm

def peer_train(url: str, rows: int, hp: Hyper) -> dict[str, Any]:
    """Runs in each torchrun process TorchDistributor starts: the docs' recipe."""
    stamps = {"fn_start": time.time()}
    import warnings

    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)  # Petastorm on pyarrow 14
    from petastorm import make_batch_reader
    from petastorm.pytorch import DataLoader

    torch.set_num_threads(1)  # 2 ranks on 2 cores, as sparkddl's ranks (spark.task.cpus)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stamps["process_group"] = time.time()
    steps = rows // (hp.batch * world)  # equal steps on every rank: no rank waits forever
    reader = make_batch_reader(url, num_epochs=None, cur_shard=rank, shard_count=world)
    with DataLoader(reader, batch_size=hp.batch) as loader:
        batches = iter(loader)
        stamps["reader_open"] = time.time()
        out = ddp_loop(lambda epoch: batches, steps, hp, stamps)
    dist.destroy_process_group()
    return {**out, "stamps": stamps}


def peer(spark: Any, df: Any, hp: Hyper, work: Path, table: str | None = None
         ) -> dict[str, Any]:
    """The docs' recipe: the DataFrame written to Parquet by Spark first, or, with ``table``
    (the files the DataFrame reads), Petastorm reading those files where they are."""
    from pyspark.ml.torch.distributor import TorchDistributor

    start = time.time()
    if table is None:
        url = f"file://{work}/peer-parquet"
        df.write.mode("overwrite").option("parquet.block.size", str(32 << 20)).parquet(url)
        rows = spark.read.parquet(url).count()
        what = "write Parquet with Spark + count"
    else:
        url, rows, what = table, df.count(), "count (the table's files are read in place)"
    written = time.time()
    out = TorchDistributor(num_processes=WORKERS, local_mode=False,
                           use_gpu=False).run(peer_train, url, rows, hp)
    end = time.time()
    s = out.pop("stamps")
    phases = [(what, DATA, start, written),
              ("TorchDistributor: barrier stage, allGather, torchrun -> rank 0 function starts",
               LAUNCH, written, s["fn_start"]),
              ("imports + init_process_group", LAUNCH, s["fn_start"], s["process_group"]),
              ("Petastorm reader + DataLoader open", LAUNCH, s["process_group"], s["reader_open"]),
              ("model + DDP + Adam (torch's first optimizer/DDP in a process imports "
               "torch._dynamo, ~0.8 s; waits for rank 1)", LAUNCH, s["reader_open"],
               s["model_ready"]),
              ("first batch + first step (rank 0)", LAUNCH, s["model_ready"], s["first_step"]),
              ("first step -> loop ends (rank 0)", LOOP, s["first_step"], s["loop_end"]),
              ("function end -> run() returns", END, s["loop_end"], end)]
    return {**out, "e2e_s": end - start, "phases": phases}


# ------------------------------------------------------------ sparkddl.run + data plane

def sparkddl_train(plan: Any, hp: Hyper) -> dict[str, Any]:
    """Runs on each rank of sparkddl's barrier stage; epoch_batches opens a reader per epoch
    (inside the loop's time, as for the fit)."""
    import torch.distributed as dist

    import sparkddl
    from sparkddl.data import epoch_batches

    sparkddl.init_process_group()
    rank = dist.get_rank()
    stamps = {"process_group": time.time()}
    out = ddp_loop(lambda epoch: epoch_batches(plan, rank, epoch), plan.steps_per_epoch, hp,
                   stamps)
    return {**out, "stamps": stamps}


def sparkddl_run(spark: Any, df: Any, hp: Hyper, store: str, trace: Trace) -> dict[str, Any]:
    import sparkddl
    from sparkddl.data import DataSpec, prepare

    trace.reset()
    start = time.time()
    prepared = prepare(df, DataSpec.of("features", "label"), num_workers=WORKERS,
                       batch_size=hp.batch, store=store, seed=hp.seed)
    plan = prepared.train.plan(WORKERS, hp.batch, seed=hp.seed)
    planned = time.time()
    out = sparkddl.run(sparkddl_train, plan, hp, num_workers=WORKERS, spark=spark)
    end = time.time()
    s = out.pop("stamps")
    stage = trace.span("run_stage")
    phases = [("prepare (materialize) + plan", DATA, start, planned),
              ("driver checks + pickling", CHECKS, planned, stage[0]),
              *trace.launch_phases(stage[0]),
              ("-> init_process_group done", LAUNCH, trace.joined(), s["process_group"]),
              ("model + DDP + Adam", LAUNCH, s["process_group"], s["model_ready"]),
              ("first batch + first step (rank 0)", LAUNCH, s["model_ready"], s["first_step"]),
              ("first step -> loop ends (rank 0)", LOOP, s["first_step"], s["loop_end"]),
              ("function end -> run() returns", END, s["loop_end"], end)]
    return {**out, "e2e_s": end - start, "phases": phases,
            "materialize": trace.materialize_phases()}


# ------------------------------------------------------------------ TorchEstimator.fit

def sparkddl_fit(df: Any, hp: Hyper, store: str, trace: Trace, **params: Any
                 ) -> dict[str, Any]:
    import torch

    from sparkddl import TorchEstimator

    torch.manual_seed(hp.seed)
    lr = hp.lr
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=lr),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=hp.batch, epochs=hp.epochs,
                         numWorkers=WORKERS, store=store, seed=hp.seed, progress=False,
                         **params)
    trace.reset()
    start = time.time()
    model = est.fit(df)
    end = time.time()
    h = model.history
    stage = trace.span("run_stage")
    prep = trace.span("prepare")
    first_step = trace.first("progress", 0)
    last_epoch = trace.last("epoch", 0)
    phases = [("driver checks before the data", CHECKS, start, prep[0]),
              ("materialize (prepare)", DATA, *prep),
              ("sample check, run record, plan, evaluator", CHECKS, prep[1], stage[0]),
              *trace.launch_phases(stage[0]),
              ("-> first step done (process group, model, strategy wrap, optimizer, first "
               "batch)", LAUNCH, trace.joined(), first_step),
              ("first step -> last epoch row (steady loop)", LOOP, first_step, last_epoch),
              ("last epoch row -> stage returns (snapshot, teardown)", END, last_epoch,
               stage[1]),
              ("snapshot evaluation wait + TorchModel", END, stage[1], end)]
    samples = sum(r["samples_per_sec"] * r["epoch_time_s"] for r in h)
    return {"e2e_s": end - start, "loop_s": sum(r["epoch_time_s"] for r in h),
            "samples": samples, "final_loss": h[-1]["train_loss"],
            "epoch_times": [r["epoch_time_s"] for r in h], "phases": phases,
            "materialize": trace.materialize_phases(), "threads": 1}


# ----------------------------------------------------------------------------- main

def warm_workers(spark: Any) -> float:
    """Start both Spark Python workers and import torch and sparkddl in them once."""
    def imports(_: Any) -> list[int]:
        import petastorm.reader  # noqa: F401
        import torch.distributed
        import torch.nn.parallel  # noqa: F401

        import sparkddl.data  # noqa: F401
        return [1]
    start = time.perf_counter()
    spark.sparkContext.parallelize(range(WORKERS), WORKERS).mapPartitions(imports).collect()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=112, help="digits copies (1,797 rows each)")
    parser.add_argument("--epochs", type=int, default=Hyper.epochs)
    args = parser.parse_args()
    hp = Hyper(epochs=args.epochs)
    logging.getLogger("TorchDistributor").setLevel(logging.ERROR)
    logging.getLogger("sparkddl.progress").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="sparkddl-sbs-"))
    try:
        rows_written = digits_parquet(work / "digits", tiles=args.tiles)
        t = time.perf_counter()
        spark = local_spark()
        session_s = time.perf_counter() - t
        try:
            results, notes = _run_all(spark, work, hp)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results, notes, {**asdict(hp), "workers": WORKERS}, rows_written, session_s)


def _run_all(spark: Any, work: Path, hp: Hyper) -> tuple[dict[str, Any], dict[str, Any]]:
    df = spark.read.parquet(f"file://{work}/digits")
    df.count()  # the users' DataFrame has been used before; Spark's own first-query costs
    notes = {"workers_start_s": warm_workers(spark)}
    results: dict[str, Any] = {}
    start = time.perf_counter()
    x, y = load_tensors(work / "digits")
    notes["floor_load_s"] = time.perf_counter() - start
    for name, threads in ((FLOOR, 1), (FLOOR_2, 2)):
        out = floor(x, y, hp, threads)
        results[name] = {**out, "e2e_s": notes["floor_load_s"] + out["loop_s"],
                         "threads": threads}
    results[REFERENCE] = reference(x, y, hp, notes["floor_load_s"])
    results[PEER] = peer(spark, df, hp, work)
    results[PEER_DISK] = peer(spark, df, hp, work, table=f"file://{work}/digits")
    trace = Trace()
    try:
        fit_store = f"file://{work}/store-fit"
        results[FIT_COLD] = sparkddl_fit(df, hp, fit_store, trace)
        # a filter makes the DataFrame something else than the table's files: materialized
        results[FIT_DERIVED] = sparkddl_fit(df.where("label >= 0"), hp,
                                            f"file://{work}/store-derived", trace)
        results[RUN_COLD] = sparkddl_run(spark, df, hp, f"file://{work}/store-run", trace)
        results[FIT_WARM] = sparkddl_fit(df, hp, fit_store, trace)
        results[NO_OVERLAP] = sparkddl_fit(df, hp, fit_store, trace,
                                           strategyOptions={"overlap": False})
        results[LOCAL_SGD] = sparkddl_fit(df, hp, fit_store, trace, strategy="local_sgd",
                                          strategyOptions={"period": 8})
    finally:
        trace.close()
    return results, notes


if __name__ == "__main__":
    main()
