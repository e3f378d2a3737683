"""sparkddl side by side with the peers users would pick, in one run (issue 35, item 5).

Where users start: the data is already Parquet on disk (not timed), nothing is running. Every
system trains the same model on the same files, on this machine's CPU:
  - data: scikit-learn's digits /16 tiled ``--tiles`` times (112: 201,264 rows) with
    N(0, 0.05) noise, written once with pyarrow as 4 Parquet files (``common.digits_parquet``);
  - model: ``common.mlp()`` (MLP 64-256-256-10), torch seed 0; Adam, lr 1e-3; cross-entropy;
    batch 256 per worker; 2 epochs; 2 workers; 1 torch thread per rank.
Systems, each in a fresh process of its own (so each pays its own cold start: a Spark session,
or a Ray cluster, of its own; nothing is shared between systems):
  - floor: one process, no framework: the files read with pyarrow into tensors, a plain loop
    (a new permutation each epoch) on 1 torch thread;
  - ddp: plain torch DDP without Spark (gloo's allreduce, as a hand-written script has it):
    ``workers`` processes spawned by torch.multiprocessing (gloo, 1 thread each), each
    reading its share of the files (``files[rank::world]``) with pyarrow into tensors, then
    the same loop (a new permutation each epoch, equal steps on every rank);
  - sparkddl: ``TorchEstimator(...).fit(spark.read.parquet(path))`` (the table is read in
    place), numWorkers=2, progress=False; steady throughput from ``model.history``;
  - TorchDistributor + Petastorm: side_by_side.py's ``peer`` on the table's files (the recipe
    of Spark's and Databricks' docs: ``make_batch_reader`` sharded by rank, Petastorm's
    DataLoader, DDP, rows // (batch x world) steps per epoch);
  - TorchDistributor + Mosaic Streaming: the DataFrame converted to MDS shards with
    ``streaming.base.converters.dataframe_to_mds`` (its defaults: zstd; the conversion is in
    the cold wall), then ``TorchDistributor(num_processes=2, local_mode=False)`` running a
    function that reads a ``StreamingDataset`` (the local directory, shuffle, batch 256)
    through a torch DataLoader (num_workers=2: the fastest of 0, 1 and 2 here), with DDP.
    Both ranks are told they share one host (LOCAL_WORLD_SIZE=2): local_mode=False makes
    each a node of its own, which on one host collides in Streaming's shared memory;
  - Ray Train: ``ray.init(num_cpus=3)`` (in the cold wall; with num_cpus=2 the two training
    workers hold both CPUs and Ray Data's read tasks never start: it hangs),
    ``ray.data.read_parquet`` over the same files, ``TorchTrainer`` with
    ``ScalingConfig(num_workers=2, use_gpu=False)``,
    ``get_dataset_shard("train").iter_torch_batches(batch_size=256)`` and
    ``ray.train.torch.prepare_model`` (DDP); the model comes back as rank 0's checkpoint;
    Ray shut down after.
Measured:
  - cold wall: from the first line of the system's own work in its fresh process (before its
    libraries, torch included, are imported) to the trained model on the driver; its setup
    part (Spark session start, ``ray.init``) and, for Streaming, its conversion are also
    given apart;
  - steady samples/s per rank: epochs after the first, measured inside the training
    function on rank 0 (each epoch from its first batch request to its epoch-end loss
    allreduce); for sparkddl from ``model.history`` (its ``samples_per_sec`` counts every
    rank: divided by the world size);
  - final train loss: the last epoch's mean over every rank's batches (a sanity check that
    all trained the same model);
  - peak RSS (and PSS) of the whole process tree of the system's process (the JVM, Spark's
    Python workers, torchrun's ranks, Ray's raylet/GCS/workers), sampled every 0.2 s by a
    thread of the parent. RSS counts pages shared between processes once per process; PSS
    divides them among the sharers (sampled every 1 s).

  python benchmarks/peers.py [--epochs 2 --tiles 112 --only floor,sparkddl,...]

Runs in .venv-bench (``make bench-peers``): the peers' packages are never in sparkddl's
dependencies. PyPI's torchvision (which Mosaic Streaming imports) is built for CUDA torch and
cannot load its C++ ops next to the CPU torch wheel; torchvision 0.28 then fails at import.
``--install-torchvision-shim`` (run by ``make bench-env``) puts a small import hook into the
venv that declares the two ops it registers fakes for before torchvision is imported; nothing
here uses them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import digits_parquet, write_results  # noqa: E402

FLOOR, DDP, SPARKDDL, PETASTORM, STREAMING, RAY = ("floor", "ddp", "sparkddl", "petastorm",
                                                    "streaming", "ray")
SYSTEMS = [FLOOR, DDP, SPARKDDL, PETASTORM, STREAMING, RAY]
LABELS = {
    FLOOR: "plain torch floor (1 process, pyarrow -> tensors, 1 thread)",
    DDP: "plain torch DDP, no Spark (2 processes, each reads its files with pyarrow)",
    SPARKDDL: "sparkddl: TorchEstimator.fit(spark.read.parquet(...))",
    PETASTORM: "TorchDistributor + Petastorm (the table's files)",
    STREAMING: "TorchDistributor + Mosaic Streaming (dataframe_to_mds + StreamingDataset)",
    RAY: "Ray Train TorchTrainer + ray.data.read_parquet",
}


@dataclass(frozen=True)
class Hyper:
    epochs: int = 2
    batch: int = 256  # per worker
    lr: float = 1e-3
    seed: int = 0
    workers: int = 2


# ------------------------------------------------------------------------- shared helpers

def _mlp() -> Any:
    from common import mlp
    return mlp()


def _steady(epoch_times: list[float], samples_per_epoch: list[float]) -> float:
    """Samples/s over the epochs after the first (over all of them when there is one)."""
    times, samples = epoch_times[1:] or epoch_times, samples_per_epoch[1:] or samples_per_epoch
    return sum(samples) / sum(times)


def _ddp_epochs(model: Any, batches: Callable[[int], Any], hp: Hyper,
                to_xy: Callable[[Any], tuple[Any, Any]]) -> dict[str, Any]:
    """The DDP loop of the Streaming and Ray peers: every batch ``batches(epoch)`` yields;
    each epoch timed from its first batch request to its epoch-end loss allreduce. The
    rank's samples per epoch, the epoch times and the rank-averaged loss of the last epoch."""
    import torch
    import torch.distributed as dist

    opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    epoch_times, samples, sums = [], [], torch.zeros(2, dtype=torch.float64)
    for epoch in range(hp.epochs):
        t = time.perf_counter()
        sums.zero_()
        n = 0
        for batch in batches(epoch):
            x, y = to_xy(batch)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sums[0] += loss.item()
            sums[1] += 1
            n += len(y)
        dist.all_reduce(sums)
        epoch_times.append(time.perf_counter() - t)
        samples.append(n)
    return {"epoch_times": epoch_times, "samples_per_epoch": samples,
            "final_loss": float(sums[0] / sums[1]), "threads": torch.get_num_threads()}


def _spark(hp: Hyper) -> tuple[Any, float]:
    from common import local_spark
    t = time.perf_counter()
    spark = local_spark(f"local[{hp.workers}]")
    return spark, time.perf_counter() - t


# ------------------------------------------------------------------------------- floor

def run_floor(table: Path, hp: Hyper, work: Path) -> dict[str, Any]:
    """side_by_side.py's floor: the files read with pyarrow into tensors, a plain loop."""
    from side_by_side import floor, load_tensors

    t = time.perf_counter()
    x, y = load_tensors(table)
    load_s = time.perf_counter() - t
    out = floor(x, y, hp, threads=1)
    steps = len(y) // hp.batch
    return {"epoch_times": out["epoch_times"], "samples_per_epoch": [steps * hp.batch] * hp.epochs,
            "final_loss": out["final_loss"], "ranks": 1, "parts": {"pyarrow read": load_s},
            "trained_at": time.perf_counter()}


# ------------------------------------------------------------------------ plain DDP

def run_ddp(table: Path, hp: Hyper, work: Path) -> dict[str, Any]:
    """A hand-written allreduce fit: torch DDP in ``workers`` spawned processes (gloo,
    1 thread each), each rank reading its share of the files with pyarrow; no Spark."""
    import side_by_side
    from common import spawn_ranks

    sbs = side_by_side.Hyper(epochs=hp.epochs, batch=hp.batch, lr=hp.lr, seed=hp.seed)
    files = sorted(str(f) for f in table.glob("*.parquet"))
    t = time.perf_counter()
    out = spawn_ranks(side_by_side.files_train, hp.workers, files, sbs)
    trained = time.perf_counter()
    return {"epoch_times": out["epoch_times"],
            "samples_per_epoch": [out["steps"] * hp.batch] * hp.epochs,
            "final_loss": out["final_loss"], "ranks": hp.workers,
            "parts": {"spawn + import + rendezvous + train": trained - t,
                      "rank 0's pyarrow read": out["read_s"]}, "trained_at": trained}


# ---------------------------------------------------------------------------- sparkddl

def run_sparkddl(table: Path, hp: Hyper, work: Path) -> dict[str, Any]:
    spark, session_s = _spark(hp)
    try:
        import torch

        from sparkddl import TorchEstimator

        torch.manual_seed(hp.seed)
        lr = hp.lr
        est = TorchEstimator(model=_mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=lr),
                             loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                             labelCol="label", batchSize=hp.batch, epochs=hp.epochs,
                             numWorkers=hp.workers, store=f"file://{work}/store",
                             seed=hp.seed, progress=False)
        t = time.perf_counter()
        df = spark.read.parquet(f"file://{table}")  # the user's line: Spark's first query
        read_s = time.perf_counter() - t
        model = est.fit(df)
        fit_s = time.perf_counter() - t - read_s
        trained = time.perf_counter()
        h = model.history
        world = h[-1].get("world_size", hp.workers)
        parts = {"setup": session_s, "spark.read.parquet (the session's first query)": read_s,
                 "fit": fit_s,
                 "fit - its training phase (fixed cost)": fit_s - model.phases["training"],
                 **{f"cold fit phase: {k}": v for k, v in model.phases.items()}}
        # after the cold wall (trained_at): a warm fit in the same session, and the trivial
        # 2-worker run (its first in this session, then the median of 5)
        t = time.perf_counter()
        warm = est.copy({est.store: f"file://{work}/store-warm"}).fit(
            spark.read.parquet(f"file://{table}"))
        warm_s = time.perf_counter() - t
        parts.update({"warm fit": warm_s,
                      "warm fit - its training phase": warm_s - warm.phases["training"],
                      **{f"warm fit phase: {k}": v for k, v in warm.phases.items()}})
        parts.update(_trivial_runs(spark, hp.workers))
        return {"epoch_times": [r["epoch_time_s"] for r in h],
                # samples_per_sec counts every rank's samples: one rank's share
                "samples_per_epoch": [r["samples_per_sec"] * r["epoch_time_s"] / world
                                      for r in h],
                "final_loss": h[-1]["train_loss"], "ranks": world, "parts": parts,
                "rank_peak_rss_MB": max(r.get("peak_rss_MB", 0.0) for r in h),
                "trained_at": trained}
    finally:
        spark.stop()


def _trivial() -> int:
    return 1


def _trivial_runs(spark: Any, workers: int, repeats: int = 5) -> dict[str, float]:
    """``sparkddl.run`` of a function that returns at once, on ``workers`` ranks: the
    session's first run, then the median of ``repeats``."""
    import warnings

    import sparkddl
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparkddl.UnsyncedTrainingWarning)
        for _ in range(repeats + 1):
            t = time.perf_counter()
            sparkddl.run(_trivial, num_workers=workers, spark=spark)
            times.append(time.perf_counter() - t)
    return {"trivial run, first of the session": times[0],
            f"trivial run, median of {repeats} after": sorted(times[1:])[repeats // 2]}


# ------------------------------------------------------------- TorchDistributor + Petastorm

def run_petastorm(table: Path, hp: Hyper, work: Path) -> dict[str, Any]:
    import side_by_side

    spark, session_s = _spark(hp)
    try:
        side_by_side.WORKERS = hp.workers  # read by peer() when it starts TorchDistributor
        sbs = side_by_side.Hyper(epochs=hp.epochs, batch=hp.batch, lr=hp.lr, seed=hp.seed)
        df = spark.read.parquet(f"file://{table}")
        out = side_by_side.peer(spark, df, sbs, work, table=f"file://{table}")
        trained = time.perf_counter()
        per_epoch = out["samples"] / (hp.epochs * hp.workers)  # steps x batch on each rank
        return {"epoch_times": out["epoch_times"], "samples_per_epoch": [per_epoch] * hp.epochs,
                "final_loss": out["final_loss"], "ranks": hp.workers,
                "parts": {"setup": session_s, "peer (count + TorchDistributor.run)":
                          out["e2e_s"]}, "trained_at": trained}
    finally:
        spark.stop()


# ------------------------------------------------------- TorchDistributor + Mosaic Streaming

def streaming_train(local: str, hp: Hyper, loader_workers: int, one_host: bool
                    ) -> dict[str, Any]:
    """Runs in each torchrun process TorchDistributor starts: the Streaming docs' recipe
    (StreamingDataset over the MDS directory, a torch DataLoader, DDP)."""
    if one_host:
        # TorchDistributor(local_mode=False) starts one torchrun per Spark task, each a node of
        # one process (LOCAL_WORLD_SIZE=1). On a cluster each task has a host of its own; here
        # both share one, and Streaming's per-node shared memory collides ("FileExistsError:
        # [Errno 17] File exists: '/000000_locals'"): tell it the real topology, one node
        os.environ["LOCAL_WORLD_SIZE"] = os.environ["WORLD_SIZE"]
        os.environ["LOCAL_RANK"] = os.environ["RANK"]
    import torch
    import torch.distributed as dist
    from streaming import StreamingDataset
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dataset = StreamingDataset(local=local, shuffle=True, shuffle_seed=hp.seed,
                               batch_size=hp.batch)
    loader = DataLoader(dataset, batch_size=hp.batch, num_workers=loader_workers)
    torch.manual_seed(hp.seed)
    model = DDP(_mlp())
    out = _ddp_epochs(model, lambda epoch: loader, hp,
                      lambda b: (b["features"], b["label"]))
    dist.destroy_process_group()
    return out


def run_streaming(table: Path, hp: Hyper, work: Path, loader_workers: int = 2
                  ) -> dict[str, Any]:
    spark, session_s = _spark(hp)
    try:
        from pyspark.ml.torch.distributor import TorchDistributor
        from streaming.base.converters import dataframe_to_mds

        t = time.perf_counter()
        df = spark.read.parquet(f"file://{table}")
        out = str(work / "mds")
        # as the Streaming docs' Spark example: out, columns, keep_local; zstd by default
        dataframe_to_mds(df, merge_index=True,
                         mds_kwargs={"out": out, "keep_local": True,
                                     "columns": {"features": "ndarray:float32",
                                                 "label": "int64"}})
        convert_s = time.perf_counter() - t
        t = time.perf_counter()
        result = TorchDistributor(num_processes=hp.workers, local_mode=False,
                                  use_gpu=False).run(streaming_train, out, hp, loader_workers,
                                                    spark.sparkContext.master.startswith("local"))
        trained = time.perf_counter()
        run_s = trained - t
        return {**result, "ranks": hp.workers, "trained_at": trained,
                "parts": {"setup": session_s, "dataframe_to_mds": convert_s,
                          "TorchDistributor.run": run_s}}
    finally:
        spark.stop()


# --------------------------------------------------------------------------------- Ray

def ray_train_loop(config: dict[str, Any]) -> None:
    """Runs on each Ray Train worker: the Ray Train docs' recipe."""
    import ray.train
    import ray.train.torch
    import torch

    hp: Hyper = config["hp"]
    torch.set_num_threads(1)
    torch.manual_seed(hp.seed)
    model = ray.train.torch.prepare_model(_mlp())  # DDP (gloo on the CPU)
    shard = ray.train.get_dataset_shard("train")
    out = _ddp_epochs(model, lambda epoch: shard.iter_torch_batches(batch_size=hp.batch), hp,
                      lambda b: (b["features"], b["label"]))
    # the docs' way back to the driver: rank 0 reports a checkpoint of the model with its
    # metrics (Ray Train V2 keeps the metrics reported with a checkpoint in Result.metrics)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(out, checkpoint=checkpoint)


def run_ray(table: Path, hp: Hyper, work: Path, cpus: int = 0) -> dict[str, Any]:
    t = time.perf_counter()
    import ray
    import ray.data
    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Ray's workers import this module by name (the training function is pickled by
    # reference): they inherit the driver's PYTHONPATH through the raylet
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # with num_cpus=2 the 2 training workers hold both CPUs and Ray Data's read tasks never
    # start ("Cluster resources are not enough to run any task from
    # TaskPoolMapOperator[ReadParquet]. The job may hang forever unless the cluster scales
    # up."): one more logical CPU for Ray Data by default (--ray-cpus)
    ray.init(num_cpus=cpus or hp.workers + 1, log_to_driver=False)
    setup_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        ds = ray.data.read_parquet(str(table))
        trainer = TorchTrainer(ray_train_loop, train_loop_config={"hp": hp},
                               scaling_config=ScalingConfig(num_workers=hp.workers,
                                                            use_gpu=False),
                               datasets={"train": ds},
                               run_config=RunConfig(storage_path=str(work / "ray_results"),
                                                    name="peers"))
        result = trainer.fit()
        with result.checkpoint.as_directory() as path:  # the trained model on the driver
            state = torch.load(os.path.join(path, "model.pt"), weights_only=True)
        assert len(state) == 6, sorted(state)
        trained = time.perf_counter()
        fit_s = trained - t
        m = result.metrics
        return {"epoch_times": m["epoch_times"], "samples_per_epoch": m["samples_per_epoch"],
                "final_loss": m["final_loss"], "ranks": hp.workers, "trained_at": trained,
                "parts": {"setup": setup_s, "TorchTrainer.fit": fit_s}}
    finally:
        ray.shutdown()


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    FLOOR: run_floor, DDP: run_ddp, SPARKDDL: run_sparkddl, PETASTORM: run_petastorm,
    STREAMING: run_streaming, RAY: run_ray}


# -------------------------------------------------------------- the parent: one child each

class TreeMemory:
    """Peak RSS (every ``interval`` s) and PSS (every 5th sample) of a process and all its
    descendants, summed, sampled by a thread."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil
        self._psutil, self.root = psutil, psutil.Process(pid)
        self.interval, self.peak_rss, self.peak_pss, self.peak_procs = interval, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except self._psutil.Error:
                break
            rss = pss = 0
            for p in procs:
                try:
                    if n % 5 == 0:
                        info = p.memory_full_info()
                        rss, pss = rss + info.rss, pss + info.pss
                    else:
                        rss += p.memory_info().rss
                except self._psutil.Error:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(procs))
            n += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(system: str, table: Path, work: Path, args: argparse.Namespace
              ) -> dict[str, Any]:
    out = work / f"{system}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--system", system,
           "--table", str(table), "--work", str(work / system), "--result", str(out),
           "--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
           "--workers", str(args.workers), "--seed", str(args.seed),
           "--streaming-loader-workers", str(args.streaming_loader_workers),
           "--ray-cpus", str(args.ray_cpus)]
    log = work / f"{system}.log"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as sink:
        # its own session: the group is ended on a timeout, children included
        child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        memory = TreeMemory(child.pid)
        try:
            rc = child.wait(timeout=args.system_timeout)
        except subprocess.TimeoutExpired:
            _end_tree(child)
            rc = f"timeout after {args.system_timeout:.0f} s"
        finally:
            memory.stop()
    wall = time.perf_counter() - start
    load = {"load_1min_before": load_before, "load_1min_after": os.getloadavg()[0]}
    text = log.read_text(errors="replace")
    if rc != 0 or not out.exists():
        tail = "\n".join(text.strip().splitlines()[-25:])
        print(f"=== {system} failed ({rc}):\n{tail}", file=sys.stderr)
        return {"system": system, "error": _error_line(text, rc), "process_wall_s": wall, **load,
                "peak_rss_MB": memory.peak_rss / 1e6, "peak_pss_MB": memory.peak_pss / 1e6}
    result = json.loads(out.read_text())
    return {**result, "process_wall_s": wall, **load, "peak_rss_MB": memory.peak_rss / 1e6,
            "peak_pss_MB": memory.peak_pss / 1e6, "peak_processes": memory.peak_procs}


def _end_tree(child: subprocess.Popen) -> None:
    """End the child and every process it started (by pid: Ray's daemons leave the child's
    process group)."""
    import psutil
    try:
        root = psutil.Process(child.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    child.wait()


def _error_line(text: str, rc: Any) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (errors[-1] if errors else lines[-1] if lines else f"exit {rc}")[:400]


def child_main(args: argparse.Namespace) -> None:
    hp = Hyper(epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed,
               workers=args.workers)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    import logging
    logging.basicConfig(level=logging.WARNING)
    for name in ("TorchDistributor", "sparkddl.progress", "py4j"):
        logging.getLogger(name).setLevel(logging.ERROR)
    kwargs = {STREAMING: {"loader_workers": args.streaming_loader_workers},
              RAY: {"cpus": args.ray_cpus}}.get(args.system, {})
    start = time.perf_counter()
    out = RUNNERS[args.system](Path(args.table), hp, work, **kwargs)
    end = time.perf_counter()
    trained = out.pop("trained_at")  # the trained model on the driver, before any teardown
    out["parts"]["teardown (not in the cold wall)"] = end - trained
    Path(args.result).write_text(json.dumps({"system": args.system,
                                             "cold_wall_s": trained - start, **out}))


# ---------------------------------------------------------------------------- the report

COLUMNS = ["system", "cold_wall_s", "setup_s", "conversion_s", "steady_samples_per_s_per_rank",
           "steady_vs_sparkddl", "cold_vs_sparkddl", "final_train_loss", "peak_rss_MB",
           "peak_pss_MB"]


def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {"system": LABELS[r["system"]], "key": r["system"]}
        if "error" in r:
            row.update(cold_wall_s="failed", steady_samples_per_s_per_rank="failed",
                       error=r["error"])
        else:
            parts = r.get("parts", {})
            row.update(cold_wall_s=r["cold_wall_s"], setup_s=parts.get("setup", ""),
                       conversion_s=parts.get("dataframe_to_mds", ""),
                       steady_samples_per_s_per_rank=_steady(r["epoch_times"],
                                                             r["samples_per_epoch"]),
                       final_train_loss=r["final_loss"], ranks=r["ranks"],
                       epoch_times_s=r["epoch_times"],
                       samples_per_epoch_per_rank=r["samples_per_epoch"], parts_s=parts)
        row.update(peak_rss_MB=r.get("peak_rss_MB"), peak_pss_MB=r.get("peak_pss_MB"),
                   peak_processes=r.get("peak_processes"),
                   process_wall_s=r.get("process_wall_s"),
                   load_1min_before=r.get("load_1min_before"),
                   load_1min_after=r.get("load_1min_after"))
        rows.append(row)
    ours = next((r for r in rows if r["key"] == SPARKDDL and "error" not in r), None)
    for r in rows:
        if ours is not None and "error" not in r:
            r["steady_vs_sparkddl"] = (r["steady_samples_per_s_per_rank"]
                                       / ours["steady_samples_per_s_per_rank"])
            r["cold_vs_sparkddl"] = r["cold_wall_s"] / ours["cold_wall_s"]
    return rows


def plot(rows: list[dict[str, Any]]) -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt

        ok = [r for r in rows if "error" not in r]
        names = [r["key"] for r in ok]
        colors = ["tab:green" if n == SPARKDDL else "tab:gray" if n in (FLOOR, DDP)
                  else "tab:blue" for n in names]
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for ax, key, title in zip(
                axes, ["cold_wall_s", "steady_samples_per_s_per_rank", "peak_rss_MB"],
                ["cold wall, s (lower is better)",
                 "steady samples/s per rank (higher is better)",
                 "peak RSS of the process tree, MB (lower is better)"]):
            values = [r[key] for r in ok]
            if not values:
                continue
            bars = ax.bar(names, values, color=colors)
            ax.bar_label(bars, fmt="%.0f" if max(values) > 100 else "%.1f", fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.tick_params(axis="x", labelsize=8, rotation=20)
        failed = [r["key"] for r in rows if "error" in r]
        fig.suptitle("Peers side by side, local CPU" +
                     (f" (failed: {', '.join(failed)})" if failed else ""), fontsize=11)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return draw


WHY = {
    PETASTORM: "TorchDistributor starts a barrier stage whose tasks run torchrun, and each "
               "rank is a new process that imports torch and Petastorm before its first step; "
               "Petastorm's reader threads decode row groups and its DataLoader re-batches "
               "them into tensors (side_by_side.md breaks this down)",
    STREAMING: "the table is written a second time (MDS shards, zstd) before training can "
               "start, and every sample is then decoded into a Python dict and collated by "
               "torch's DataLoader (per-sample work, in loader processes that share the 2 cores "
               "with the ranks)",
    RAY: "ray.init starts Ray's own processes (GCS, raylet, workers), then TorchTrainer a "
         "controller and worker actors; Ray Data reads in tasks of its own (which need a CPU "
         "beyond the ranks') and streams blocks to the ranks through the object store, "
         "converted to tensors batch by batch",
}


def summary(rows: list[dict[str, Any]]) -> str:
    ours = next((r for r in rows if r["key"] == SPARKDDL and "error" not in r), None)
    lines = ["#### Goal: ahead of every peer on cold wall and steady throughput", ""]
    if ours is None:
        return "\n".join(lines + ["- sparkddl did not finish: no comparison."])
    our_setup = ours["setup_s"] or 0.0
    for r in rows:
        if r["key"] in (SPARKDDL, FLOOR, DDP):
            continue
        if "error" in r:
            lines.append(f"- {r['system']}: failed ({r['error']})")
            continue
        cold = "ahead" if ours["cold_wall_s"] < r["cold_wall_s"] else "BEHIND"
        steady = ("ahead" if ours["steady_samples_per_s_per_rank"]
                  > r["steady_samples_per_s_per_rank"] else "BEHIND")
        setup, conversion = r["setup_s"] or 0.0, r["conversion_s"] or 0.0
        rest = r["cold_wall_s"] - setup - conversion
        lines.append(
            f"- vs {r['system']}: cold wall {cold} ({ours['cold_wall_s']:.1f} s vs "
            f"{r['cold_wall_s']:.1f} s: setup {our_setup:.1f} vs {setup:.1f} s"
            + (f", conversion 0 vs {conversion:.1f} s" if conversion else "")
            + f", the rest {ours['cold_wall_s'] - our_setup:.1f} vs {rest:.1f} s), steady "
            f"throughput {steady} ({ours['steady_samples_per_s_per_rank']:,.0f} vs "
            f"{r['steady_samples_per_s_per_rank']:,.0f} samples/s per rank; first epoch "
            f"{ours['epoch_times_s'][0]:.1f} vs {r['epoch_times_s'][0]:.1f} s). Why: "
            f"{WHY[r['key']]}.")
    floor = next((r for r in rows if r["key"] == FLOOR and "error" not in r), None)
    if floor is not None:
        ratio = ours["steady_samples_per_s_per_rank"] / floor["steady_samples_per_s_per_rank"]
        lines.append(
            f"- the floor (not a peer: one process, no framework, no allreduce) is ahead of "
            f"every system: {floor['cold_wall_s']:.1f} s cold (no JVM or cluster to start, no "
            f"workers to launch) and {floor['steady_samples_per_s_per_rank']:,.0f} samples/s; "
            f"sparkddl's ranks run {ratio:.2f} x that each ({ratio * ours['ranks']:.2f} x "
            f"together): 2 ranks share the 2 cores with Spark's JVM and average the gradients "
            f"every step (through shared memory: both ranks are on this host)")
    lines += ["", *fixed_costs(ours, rows), ""]
    ddp = next((r for r in rows if r["key"] == DDP and "error" not in r), None)
    if ddp is not None:
        ratio = ours["steady_samples_per_s_per_rank"] / ddp["steady_samples_per_s_per_rank"]
        lines.append(
            f"- plain DDP without Spark (not a peer: a hand-written allreduce fit, gloo) "
            f"runs its ranks at {ddp['steady_samples_per_s_per_rank']:,.0f} samples/s each and "
            f"takes {ddp['cold_wall_s']:.1f} s cold, {sum(ddp['epoch_times_s']):.1f} s of it "
            f"in the epochs; sparkddl's ranks run {ratio:.2f} x that, and its cold wall is "
            f"{ours['cold_wall_s'] - ddp['cold_wall_s']:+.1f} s beside it (the Spark session, "
            f"the executors' Python workers, the checks and the snapshots)")
    return "\n".join(lines)


def fixed_costs(ours: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The fixed-cost goals: a cold fit's wall past its training phase <= 4 s and <= 0.5 x
    TorchDistributor + Petastorm's cold wall; a warm trivial 2-worker run <= 0.3 s."""
    parts = ours.get("parts_s") or {}
    fixed = parts.get("fit - its training phase (fixed cost)")
    if fixed is None:
        return []
    phases = ", ".join(f"{k.split(': ', 1)[1]} {v:.2f}" for k, v in parts.items()
                       if k.startswith("cold fit phase: "))
    read = parts.get("spark.read.parquet (the session's first query)", 0.0)
    lines = ["#### Fixed costs", "",
             f"- cold fit: {parts['fit']:.2f} s, {fixed:.2f} s of it outside the training "
             f"phase (goal <= 4 s: {'met' if fixed <= 4 else 'NOT met'}); phases (s): {phases}",
             f"- before it, the user's spark.read.parquet, the session's first query: "
             f"{read:.2f} s (Spark's; counted in the cold wall, not in the fit); with it, "
             f"{fixed + read:.2f} s outside training"]
    if "warm fit" in parts:
        lines.append(f"- warm fit (a second one, same session): {parts['warm fit']:.2f} s, "
                     f"{parts['warm fit - its training phase']:.2f} s outside training")
    peer = next((r for r in rows if r["key"] == PETASTORM and "error" not in r), None)
    if peer is not None:
        ratio = ours["cold_wall_s"] / peer["cold_wall_s"]
        rest = (ours["cold_wall_s"] - (ours["setup_s"] or 0)) / (
            peer["cold_wall_s"] - (peer["setup_s"] or 0))
        lines.append(f"- cold wall {ratio:.2f} x TorchDistributor + Petastorm's (goal <= 0.5: "
                     f"{'met' if ratio <= 0.5 else 'NOT met'}); {rest:.2f} x without the Spark "
                     "session's start, which both pay alike")
    median = next((v for k, v in parts.items() if k.startswith("trivial run, median")), None)
    if median is not None:
        lines.append(f"- trivial 2-worker sparkddl.run: {median:.3f} s warm (goal <= 0.3 s: "
                     f"{'met' if median <= 0.3 else 'NOT met'}), "
                     f"{parts['trivial run, first of the session']:.2f} s as the session's "
                     "first after the fits")
    return lines


def parts_md(rows: list[dict[str, Any]]) -> str:
    lines = ["#### Where each cold wall goes", "", "| system | part | s |", "|---|---|---|"]
    for r in rows:
        for part, s in (r.get("parts_s") or {}).items():
            lines.append(f"| {r['key']} | {part} | {s:.2f} |")
        if "epoch_times_s" in r:
            lines.append(f"| {r['key']} | epochs (rank 0) | "
                         f"{', '.join(f'{t:.2f}' for t in r['epoch_times_s'])} |")
    return "\n".join(lines)


NEEDS = {PETASTORM: "petastorm", STREAMING: "streaming", RAY: "ray"}


def main(args: argparse.Namespace) -> None:
    import importlib.util
    systems = [s.strip() for s in args.only.split(",")] if args.only else SYSTEMS
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; pick from {SYSTEMS}")
    missing = sorted({NEEDS[s] for s in systems
                      if s in NEEDS and importlib.util.find_spec(NEEDS[s]) is None})
    if missing:
        # benchmarks/run_all.sh (make bench) runs every benchmark in .venv, which has none of
        # the peers: leave results/peers.* as they are
        print(f"peers.py skipped: {', '.join(missing)} not installed in {sys.prefix}; "
              f"run it with `make bench-peers` (.venv-bench)")
        return
    work = Path(tempfile.mkdtemp(prefix="sparkddl-peers-"))
    try:
        table = work / "digits"
        n_rows = digits_parquet(table, tiles=args.tiles)  # the users' data: not timed
        results = []
        for system in systems:
            print(f"=== {system}", flush=True)
            results.append(run_child(system, table, work, args))
            r = results[-1]
            print(f"    {r.get('cold_wall_s', 'failed')} s cold, peak RSS "
                  f"{r['peak_rss_MB']:.0f} MB", flush=True)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    rows = rows_of(results)
    hp = Hyper(epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed,
               workers=args.workers)
    failed = [f"{r['key']}: {r['error']}" for r in rows if "error" in r]
    loads = [r["load_1min_before"] for r in rows if r.get("load_1min_before") is not None]
    ray_cpus = args.ray_cpus or hp.workers + 1
    notes = (
        f"Data already in Parquet on disk (4 files, {n_rows:,} rows x 64 float32, written "
        f"before and not timed; in the page cache for every system). Each system runs in a "
        f"fresh process of its own and starts its own Spark session (local[{hp.workers}]) or "
        f"Ray cluster inside its cold wall (setup_s; nothing is shared between systems). Cold "
        f"wall: from the system's first line, before its libraries (torch too) are imported, "
        f"to the trained model on the driver (teardown after it is not counted). Steady: "
        f"samples/s of one rank over the epochs after the first, measured on rank 0 inside "
        f"the training function (sparkddl: model.history's samples_per_sec / world size). "
        f"Peak RSS/PSS: the system's whole process tree, summed, sampled every 0.2 s (RSS "
        f"counts shared pages in every process; PSS shares them out, every 1 s). Streaming: "
        f"dataframe_to_mds (zstd, its default) inside its cold wall (conversion_s); "
        f"DataLoader num_workers={args.streaming_loader_workers}; LOCAL_WORLD_SIZE/LOCAL_RANK "
        f"set to the one host's (TorchDistributor's local_mode=False makes each rank a "
        f"'node' of 1, and both on this host collide in Streaming's shared memory: "
        f"\"FileExistsError: [Errno 17] File exists: '/000000_locals'\"). Ray: "
        f"ray.init(num_cpus={ray_cpus}): with num_cpus={hp.workers} the {hp.workers} training "
        f"workers hold every CPU and Ray Data's read tasks never start (\"Cluster resources "
        f"are not enough to run any task from TaskPoolMapOperator[ReadParquet]. The job may "
        f"hang forever unless the cluster scales up.\"); the model comes back as a Ray "
        f"checkpoint. Shuffling: Ray none (iter_torch_batches as the docs show it); Petastorm "
        f"row groups; Streaming, sparkddl and the floor samples. torchvision (imported by "
        f"Streaming) runs without its C++ ops: PyPI's wheel is built for CUDA torch. 1-minute "
        f"load average as each system started: "
        f"{', '.join(f'{x:.1f}' for x in loads)} (2 cores; other work on the machine shows "
        f"here)."
        + (f" Failed: {'; '.join(failed)}." if failed else ""))
    write_results(
        "peers" if args.tiles == 112 and not args.only else
        f"peers_{n_rows // 1000}k" + (f"_{'_'.join(systems)}" if args.only else ""),
        rows, COLUMNS,
        f"sparkddl and its peers, {n_rows:,} rows, MLP 64-256-256-10, {hp.epochs} epochs, "
        f"batch {hp.batch} per worker, {hp.workers} workers x 1 torch thread, local CPU",
        plot(rows), notes=notes, extra={"hyper": asdict(hp), "rows_in_data": n_rows,
                                        "versions": versions()},
        more_md=summary(rows) + "\n\n" + parts_md(rows))


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("sparkddl", "torch", "pyspark", "pyarrow", "numpy", "petastorm", "ray",
                 "mosaicml-streaming", "torchvision"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


# ---------------------------------------------------- the environment: torchvision on CPU

SHIM = '''"""Installed into .venv-bench by benchmarks/peers.py --install-torchvision-shim.

PyPI's torchvision wheels are built against CUDA torch; next to the CPU torch wheel their C++
ops library cannot load (libtorch_cuda.so), and torchvision then fails at import: it registers
fake kernels for torchvision::nms and ::qnms without checking that the ops exist. Mosaic
Streaming imports torchvision (streaming.vision) on ``import streaming``. Before torchvision is
first imported, this declares those two ops' schemas (nothing in the benchmark calls them)."""
import sys
from importlib.abc import MetaPathFinder

_libs = []


def _declare():
    try:
        from importlib.metadata import version

        import torch
        if torch.version.cuda is not None or "+cpu" in version("torchvision"):
            return  # torchvision's own ops will load
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        _libs.append(lib)  # a Library undoes its definitions when collected
    except Exception:
        pass


class _BeforeTorchvision(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _declare()
        return None


sys.meta_path.insert(0, _BeforeTorchvision())
'''


def install_torchvision_shim() -> None:
    import sysconfig
    site = Path(sysconfig.get_paths()["purelib"])
    (site / "_peers_torchvision_shim.py").write_text(SHIM)
    (site / "peers-torchvision-shim.pth").write_text("import _peers_torchvision_shim\n")
    print(f"torchvision import shim installed in {site}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=112, help="digits copies (1,797 rows each)")
    p.add_argument("--epochs", type=int, default=Hyper.epochs)
    p.add_argument("--batch", type=int, default=Hyper.batch, help="per worker")
    p.add_argument("--lr", type=float, default=Hyper.lr)
    p.add_argument("--workers", type=int, default=Hyper.workers)
    p.add_argument("--seed", type=int, default=Hyper.seed)
    p.add_argument("--only", default="", help=f"comma-separated subset of {SYSTEMS}")
    p.add_argument("--streaming-loader-workers", type=int, default=2,
                   help="DataLoader num_workers for the Streaming peer (2: the fastest of 0, 1 "
                        "and 2 here)")
    p.add_argument("--ray-cpus", type=int, default=0,
                   help="ray.init(num_cpus=...); 0: workers + 1 (one for Ray Data's tasks)")
    p.add_argument("--system-timeout", type=float, default=420.0,
                   help="seconds before one system's process tree is ended")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--install-torchvision-shim", action="store_true",
                   help="install the import hook described above into this Python's "
                        "site-packages and exit")
    # a child: one system
    p.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--table", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse()
    if ARGS.install_torchvision_shim:
        install_torchvision_shim()
    elif ARGS.system:
        # through the module's name, not __main__: the training functions are then pickled by
        # reference and imported by name in torchrun's and Ray's processes (benchmarks/ is on
        # their PYTHONPATH)
        import peers
        peers.child_main(ARGS)
    else:
        main(ARGS)
