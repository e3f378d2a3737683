"""Shared plumbing for benchmarks: a Spark session, timing, and JSON + markdown + PNG output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"


def local_spark(master: str = "local[2]", **conf: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # executors (and the torchrun processes TorchDistributor starts) import this module by
    # name when a pickled benchmark function refers to it; they inherit the JVM's PYTHONPATH
    here = str(Path(__file__).resolve().parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [here, *paths] if p)
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master(master).appName("sparkddl-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_results(name: str, rows: list[dict], columns: list[str], title: str,
                  plot: Callable[[Path], None] | None = None, notes: str = "",
                  extra: dict | None = None, more_md: str = "") -> Path:
    """Write results/<name>.json, .md (a markdown table) and .png (via ``plot``).

    ``extra`` adds keys to the JSON; ``more_md`` is appended to the markdown (more tables)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": name, "date": date.today().isoformat(), "machine": machine()}
    (RESULTS / f"{name}.json").write_text(json.dumps({**meta, "rows": rows, **(extra or {})},
                                                     indent=2))
    lines = [f"### {title}", "", f"{meta['date']}, {meta['machine']}. {notes}".strip(), "",
             *md_table(rows, columns)]
    md = RESULTS / f"{name}.md"
    md.write_text("\n".join(lines) + "\n" + (f"\n{more_md.rstrip()}\n" if more_md else ""))
    if plot is not None:
        import matplotlib
        matplotlib.use("Agg")
        plot(RESULTS / f"{name}.png")
    print(md.read_text())
    return md


def digits(spark):
    """scikit-learn's digits (scaled to 0..1) as a DataFrame of ``features``, ``label``."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    rows = [((r / 16.0).tolist(), int(label)) for r, label in zip(x, y)]
    return spark.createDataFrame(rows, "features array<float>, label int")


def digits_parquet(path: Path, tiles: int = 112, noise: float = 0.05, files: int = 4,
                   seed: int = 0) -> int:
    """scikit-learn's digits (scaled to 0..1) tiled ``tiles`` times with Gaussian noise, written
    with pyarrow as ``files`` Parquet files of ``features`` (64 float32) and ``label`` (int64).
    112 tiles of the 1,797 digits = 201,264 rows. Returns the row count."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    x = np.tile((digits.data / 16.0).astype(np.float32), (tiles, 1))
    x += rng.normal(0.0, noise, x.shape).astype(np.float32)
    y = np.tile(digits.target.astype(np.int64), tiles)
    order = rng.permutation(len(y))
    x, y = x[order], y[order]
    path.mkdir(parents=True, exist_ok=True)
    width = x.shape[1]
    for i, rows in enumerate(np.array_split(np.arange(len(y)), files)):
        values = pa.array(x[rows].reshape(-1))
        offsets = pa.array(np.arange(0, (len(rows) + 1) * width, width, dtype=np.int32))
        table = pa.table({"features": pa.ListArray.from_arrays(offsets, values),
                          "label": pa.array(y[rows])})
        pq.write_table(table, path / f"part-{i:03d}.parquet")
    return len(y)


def mlp():
    """The benchmarks' model: an MLP 64-256-256-10."""
    import torch.nn as nn
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def spawn_ranks(fn: Callable[..., object], world: int, *args: object) -> object:
    """Run ``fn(*args)`` on ``world`` fresh processes (torch.multiprocessing, spawn) joined in a
    gloo process group on 127.0.0.1, each with 1 torch thread; rank 0's return value.

    No Spark: the plain-PyTorch reference the Spark runners are compared with."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:  # a free port for the rendezvous (closed before use)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.pt"
        mp.spawn(_rank_main, args=(world, port, str(out), fn, args), nprocs=world, join=True)
        import torch
        return torch.load(out, weights_only=True)  # plain data written by rank 0 above


def _rank_main(rank: int, world: int, port: int, out: str, fn: Callable[..., object],
               args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(*args)
        # both ranks leave together: a gloo group torn down while its peer is still sending
        # can abort the peer ("terminate called without an active exception", seen once)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(result, out)


def md_table(rows: list[dict], columns: list[str]) -> list[str]:
    """A markdown table (as lines) of ``columns`` of ``rows``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return lines


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def traced_fit(est: Any, df: Any, store: Path) -> dict:
    """``est.fit(df)`` timed, with the trace's phases (prepare, stage) and the history's row
    counts; whether the data was read in place (nothing under the store's data/)."""
    from tracing import Trace
    trace = Trace()
    try:
        start = time.time()
        model = est.fit(df)
        end = time.time()
        prep = trace.span("prepare")
        stage = trace.span("run_stage")
    finally:
        trace.close()
    h = model.history
    data = store / "data"
    return {"wall_s": end - start, "loop_s": sum(r["epoch_time_s"] for r in h),
            "final_loss": h[-1]["train_loss"], "epoch_times": [r["epoch_time_s"] for r in h],
            "rows_trained": [r.get("rows_trained") for r in h],
            "rows_skipped": [r.get("rows_skipped") for r in h],
            "in_place": not (data.exists() and any(data.iterdir())),
            "phases": [("before prepare (driver checks)", prep[0] - start),
                       ("prepare (plan or materialize the data)", prep[1] - prep[0]),
                       ("prepare -> stage starts", stage[0] - prep[1]),
                       ("stage (launch, train, teardown)", stage[1] - stage[0]),
                       ("stage -> model returned", end - stage[1])]}


def start_run(prefix: str, scratch: str | None) -> tuple[Path, float, dict[str, float]]:
    """A benchmark's work directory (under ``scratch`` where given), its start time and the
    load at the start; the peers' and the progress bar's chatter silenced."""
    import logging
    import tempfile
    logging.getLogger("TorchDistributor").setLevel(logging.ERROR)
    logging.getLogger("sparkddl.progress").setLevel(logging.WARNING)
    if scratch:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch))
    return work, time.perf_counter(), {"load_1min_at_start": os.getloadavg()[0]}


def end_run(work: Path, keep: bool, started: float, timings: dict[str, float]) -> None:
    """The work directory removed (unless kept), the total time and the load at the end
    (2 cores: other work shows here) added to ``timings``."""
    import shutil
    if keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    timings["total_s"] = time.perf_counter() - started
    timings["load_1min_at_end"] = os.getloadavg()[0]
