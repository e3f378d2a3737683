"""Out-of-core proof: TorchEstimator.fit on a Parquet table many times larger than a rank's memory.

One process, one ``local-cluster[2,1,M]`` session (two executor JVMs, each with its own
Python workers, as on a real cluster):
  - data: N rows of ``features`` (array<float>, 64 values) and ``label`` (int, 10 classes),
    written once by Spark into ``<work>/data`` (reused by a later run with the same row count
    when ``--keep`` left it there). No Python per row: ``spark.range`` and SQL expressions
    only. The label is ``pmod(xxhash64(id, seed), 10)`` and the features are that class's
    fixed random centre (N(0, 0.35) per value) plus N(0, 1) noise (``randn``): a Gaussian
    mixture an MLP learns to the Bayes rate. One ~256 MiB file per write task, Spark's
    default 128 MiB row groups. The default size (``--gb 8``) is the issue's "a dataset at
    least 4x the memory of one rank's Python worker".
  - fit: ``TorchEstimator`` on ``spark.read.parquet(<work>/data)`` (the library reads such a
    plain scan in place, or materializes it into the Store: the Store's size after the fit
    tells which), MLP 64-128-10, Adam 1e-3, batch 1024 per rank, 2 ranks, ``--epochs``,
    ``--validation`` held out, a fresh Store under ``<work>/store`` (removed afterwards).
  - memory: a background thread samples, every 0.2 s during the fit, the driver's own VmRSS
    and VmRSS / VmHWM of every process descended from this one (the driver JVM, the executor
    JVMs, the pyspark daemons and the Python workers they fork), read from /proc. The two
    Python workers with the highest peak are the ranks (a barrier task trains inside its
    Python worker). The driver's ``ru_maxrss`` is read before and after the fit.
  - time: the fit's wall time; spans of a few driver-side library functions, taken by
    wrapping them for the fit only (nothing in sparkddl is edited); the epoch rows of
    ``model.history``; and, unless ``--no-read-pass``, a separate read-only pass: one epoch of
    ``epoch_batches`` on each of 2 ranks (``sparkddl.run``), no model, to time the reader alone.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import math
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, md_table, write_results
from tracing import recording

WORKERS, D, CLASSES, HIDDEN, BATCH = 2, 64, 10, 128, 1024
CENTRE_SCALE = 0.35  # class centres N(0, 0.35) per value, noise N(0, 1)
FILE_BYTES = 256 << 20  # one file per write task
BYTES_PER_ROW = 257  # measured: 64 float32 (random: they do not compress) + list levels + label
SAMPLE_S = 0.2
MIB = 1 << 20


# ----------------------------------------------------------------------------- the data

def synthetic(spark: Any, rows: int, seed: int, partitions: int) -> Any:
    """The dataset as a DataFrame: a class per row from a hash of its id, then that class's
    centre plus Gaussian noise in every feature. Only built-in expressions (code-generated)."""
    import numpy as np
    from pyspark.sql import functions as F

    centres = np.random.default_rng(seed).normal(0.0, CENTRE_SCALE, (CLASSES, D))
    label = F.pmod(F.xxhash64(F.col("id"), F.lit(seed)), F.lit(CLASSES)).cast("int")
    labelled = spark.range(0, rows, 1, partitions).select(label.alias("label"))
    values = [(F.element_at(F.array(*[F.lit(float(c)) for c in centres[:, i]]),
                            F.col("label") + 1) + F.randn(seed * 1000 + i)).cast("float")
              for i in range(D)]
    return labelled.select(F.array(*values).alias("features"), "label")


def generate(spark: Any, data: Path, rows: int, seed: int) -> dict[str, Any]:
    """Write the dataset to ``data`` unless a complete one with ``rows`` rows is there."""
    marker = data.with_suffix(".json")  # beside the table: readers skip no file inside it
    if marker.exists() and data.exists():
        meta = json.loads(marker.read_text())
        if meta.get("rows") == rows and meta.get("seed") == seed and \
                spark.read.parquet(f"file://{data}").count() == rows:
            print(f"reusing {data}: {rows:,} rows, {meta['bytes'] / 1e9:.2f} GB", flush=True)
            return {**meta, "reused": True}
    marker.unlink(missing_ok=True)
    shutil.rmtree(data, ignore_errors=True)
    partitions = max(2 * WORKERS, math.ceil(rows * BYTES_PER_ROW / FILE_BYTES))
    per_file = math.ceil(rows / partitions)
    print(f"writing {rows:,} rows (~{rows * BYTES_PER_ROW / 1e9:.2f} GB) as {partitions} "
          f"files to {data}", flush=True)
    start = time.perf_counter()
    (synthetic(spark, rows, seed, partitions).write.mode("overwrite")
     .option("maxRecordsPerFile", per_file).parquet(f"file://{data}"))
    meta = {"rows": rows, "seed": seed, "bytes": parquet_bytes(data),
            "files": len(list(data.glob("*.parquet"))), "write_s": time.perf_counter() - start}
    marker.write_text(json.dumps(meta, indent=2))
    return {**meta, "reused": False}


def parquet_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet"))


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def row_groups(data: Path) -> int:
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(f).num_row_groups for f in data.glob("*.parquet"))


# ------------------------------------------------------------------------ memory sampling

def _status(pid: int | str) -> dict[str, int]:
    """VmRSS and VmHWM of a process in bytes (empty when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        out[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])  # comm may hold spaces
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def _is_pyspark(cmd: str) -> bool:
    return "pyspark.daemon" in cmd or "pyspark/worker" in cmd or "pyspark.worker" in cmd


class Sampler:
    """Every ``SAMPLE_S`` seconds on a background thread: this process's VmRSS, and VmRSS /
    VmHWM of every process descended from it (only this session's Spark: another user's
    Spark on the machine is not a descendant), each classified by its command line."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self.driver_samples: list[tuple[float, int]] = []
        self.procs: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        now = time.time()
        self.driver_samples.append((now, _status(self.me).get("VmRSS", 0)))
        parents = _parents()
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(self.me, []))
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            status = _status(pid)
            if not status:
                continue
            p = self.procs.get(pid)
            if p is None or p["kind"] == "other":  # a spawn helper may exec into a daemon
                cmd = _cmdline(pid)
                p = self.procs[pid] = {"pid": pid, "ppid": parents[pid], "first_seen": now,
                                       "peak_rss": 0, "hwm": 0, **(p or {}),
                                       "kind": self._kind(cmd, parents[pid]), "cmd": cmd[:160]}
            p["last_seen"] = now
            p["peak_rss"] = max(p["peak_rss"], status.get("VmRSS", 0))
            p["hwm"] = max(p["hwm"], status.get("VmHWM", 0))

    def _kind(self, cmd: str, ppid: int) -> str:
        if _is_pyspark(cmd):
            parent = self.procs.get(ppid)
            forked = parent is not None and parent["kind"] in ("pyspark daemon", "python worker") \
                or _is_pyspark(_cmdline(ppid))
            return "python worker" if forked else "pyspark daemon"
        if "CoarseGrainedExecutorBackend" in cmd:
            return "executor JVM"
        if os.path.basename(cmd.split(" ", 1)[0]) == "java":  # not jspawnhelper
            return "driver JVM"
        return "other"

    def peak(self, p: dict[str, Any]) -> int:
        return max(p["peak_rss"], p["hwm"])

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return sorted((p for p in self.procs.values() if p["kind"] == kind), key=self.peak,
                      reverse=True)


# ------------------------------------------------------------------------ time spans

SPANS = (("sparkddl.fit.inputs", "prepare"),  # data: in-place scan or materialization
         ("sparkddl.fit.inputs", "check_sample"),
         ("sparkddl.launch.launcher", "run_stage"),  # the barrier stage, launch to teardown
         ("sparkddl.fit.evaluation", "SnapshotEvaluator._evaluate"))  # driver validation


class Spans:
    """Wall-clock spans of a few driver-side sparkddl functions, taken by wrapping them
    (restored by ``close``). A name that is not where it was looked for (the code moved) is
    skipped and listed in ``missing``: the split then says it is unknown."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.missing: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []
        for module, dotted in SPANS:
            try:
                owner: Any = importlib.import_module(module)
                *path, name = dotted.split(".")
                for part in path:
                    owner = getattr(owner, part)
                original = getattr(owner, name)
            except (ImportError, AttributeError):
                self.missing.append(f"{module}.{dotted}")
                continue
            setattr(owner, name, recording(self.spans, name, original))
            self._saved.append((owner, name, original))

    def close(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def total(self, name: str) -> float | None:
        found = [e - s for n, s, e in self.spans if n == name]
        return sum(found) if found else None

    def cell(self, name: str) -> float | str:
        """The total seconds for a table cell; says why when there are none."""
        if any(m.rsplit(".", 1)[-1] == name for m in self.missing):
            return "not in this version"
        total = self.total(name)
        return round(total, 2) if total is not None else "not called"

    def first_start(self, name: str) -> float | None:
        found = [s for n, s, _ in self.spans if n == name]
        return min(found) if found else None

    def last_end(self, name: str) -> float | None:
        found = [e for n, _, e in self.spans if n == name]
        return max(found) if found else None


class LogRecords(logging.Handler):
    """The sparkddl logger's records (INFO and up), with their wall-clock times."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.name, record.levelname,
                             record.getMessage()[:500]))


# ------------------------------------------------------------------------ the fit

def mlp() -> Any:
    import torch.nn as nn
    return nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def measured_fit(spark: Any, data: Path, store: Path, epochs: int, validation: float
                 ) -> dict[str, Any]:
    import torch

    from sparkddl.ml import TorchEstimator

    df = spark.read.parquet(f"file://{data}")
    torch.manual_seed(0)
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=BATCH, epochs=epochs, numWorkers=WORKERS,
                         validation=validation or None, store=f"file://{store}", seed=0,
                         progress=False)
    spans = Spans()
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    driver_before = _status(os.getpid()).get("VmRSS", 0)
    try:
        with Sampler() as sampler:
            start = time.time()
            try:
                model = est.fit(df)
            except BaseException:
                _print_peaks(sampler)
                raise
            end = time.time()
    finally:
        spans.close()
    return {"model": model, "start": start, "end": end, "spans": spans, "sampler": sampler,
            "maxrss_before": maxrss_before,
            "maxrss_after": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "driver_before": driver_before, "store_bytes": tree_bytes(store)}


def _print_peaks(sampler: Sampler) -> None:
    for p in sorted(sampler.procs.values(), key=sampler.peak, reverse=True):
        print(f"  {p['kind']:15} pid {p['pid']:>7}: peak {sampler.peak(p) / MIB:,.0f} MiB",
              file=sys.stderr)


# ------------------------------------------------------------- the read-only pass

def read_rank(plan: Any) -> dict[str, Any]:
    """On each rank of ``sparkddl.run``: one epoch of the rank's batches, nothing else."""
    import torch
    import torch.distributed as dist

    import sparkddl
    from sparkddl.data import epoch_batches

    sparkddl.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    start, rows = time.perf_counter(), 0
    with contextlib.closing(epoch_batches(plan, rank, 0)) as batches:
        for batch in batches:
            rows += len(batch["label"])
    mine = torch.tensor([time.perf_counter() - start, rows], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return {"read_s": [float(t[0]) for t in every], "rows": [int(t[1]) for t in every]}


def read_pass(spark: Any, data: Path) -> dict[str, Any]:
    import sparkddl
    from sparkddl.data import DataSpec, prepare

    start = time.perf_counter()
    prepared = prepare(f"file://{data}", DataSpec.of("features", "label"),
                       num_workers=WORKERS, batch_size=BATCH)
    plan = prepared.train.plan(WORKERS, BATCH, seed=0)
    planned = time.perf_counter()
    out = sparkddl.run(read_rank, plan, num_workers=WORKERS, spark=spark)
    return {**out, "plan_s": planned - start, "run_s": time.perf_counter() - planned}


# ----------------------------------------------------------------------------- report

def _s(value: float | None) -> float | str:
    return round(value, 2) if value is not None else "n/a"


def summarize(gen: dict[str, Any], fit: dict[str, Any], read: dict[str, Any] | None,
              read_error: str | None, args: argparse.Namespace, groups: int, mem_mb: int
              ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], dict]:
    model, spans, sampler = fit["model"], fit["spans"], fit["sampler"]
    start, end = fit["start"], fit["end"]
    history = [dict(r) for r in model.history]
    train_s = sum(r.get("epoch_time_s", 0.0) for r in history)
    trained = sum(r["samples_per_sec"] * r["epoch_time_s"] for r in history
                  if "samples_per_sec" in r and "epoch_time_s" in r)
    workers = sampler.of_kind("python worker")
    ranks = workers[:WORKERS]
    driver_peak = max(rss for _, rss in sampler.driver_samples)
    stage_s = spans.total("run_stage")
    stage_start, stage_end = spans.first_start("run_stage"), spans.last_end("run_stage")
    last = history[-1] if history else {}
    row = {
        "rows": gen["rows"],
        "gb_on_disk": gen["bytes"] / 1e9,
        "fit_s": end - start,
        "train_rows_per_s": trained / train_s if train_s else "n/a",
        "driver_peak_mib": driver_peak / MIB,
        "driver_growth_mib": (driver_peak - fit["driver_before"]) / MIB,
        **{f"rank_{chr(97 + i)}_peak_mib": sampler.peak(p) / MIB for i, p in enumerate(ranks)},
        "data_per_rank_peak": (gen["bytes"] / sampler.peak(ranks[0])) if ranks else "n/a",
        "store_gb_written": fit["store_bytes"] / 1e9,
        "val_accuracy": last.get("val_accuracy", "n/a"),
    }
    if fit["maxrss_after"] > fit["maxrss_before"]:
        row["driver_maxrss_rise_mib"] = (fit["maxrss_after"] - fit["maxrss_before"]) / MIB
    split = [
        {"phase": "fit, end to end", "s": _s(end - start),
         "what": "est.fit(df): from the call to the TorchModel"},
        {"phase": "driver preparation", "s": _s(stage_start - start if stage_start else None),
         "what": "fit() called -> barrier stage submitted: checks, data preparation, sample "
                 "check, shard plan, evaluator (and loading the validation rows, where the "
                 "library does)"},
        {"phase": "  of which: data preparation", "s": spans.cell("prepare"),
         "what": "sparkddl.fit.inputs.prepare: reading the table in place (footers, the "
                 "validation selection) or materializing it into the Store (Spark jobs)"},
        {"phase": "barrier stage", "s": _s(stage_s),
         "what": "launcher.run_stage: task launch, rendezvous, training, snapshots, teardown"},
        {"phase": "  of which: training epochs", "s": _s(train_s if history else None),
         "what": "sum of model.history epoch_time_s (rank 0: from the first batch request "
                 "to the epoch-end allreduce; includes every wait for data)"},
        {"phase": "    of which: waiting for data",
         "s": _s(sum(r.get("data_wait_s", 0.0) for r in history) if history else None),
         "what": "sum of model.history data_wait_s: rank 0's time waiting for its reader "
                 "(reading, decoding and shuffling that did not overlap training)"},
        {"phase": "  of which: launch + teardown",
         "s": _s(stage_s - train_s if stage_s is not None and history else None),
         "what": "the stage less the epochs"},
        {"phase": "after the stage", "s": _s(end - stage_end if stage_end else None),
         "what": "stage returned -> fit returns: last snapshot's evaluation, TorchModel"},
        {"phase": "driver validation", "s": spans.cell("_evaluate"),
         "what": "SnapshotEvaluator._evaluate on the driver, all snapshots (a background "
                 "thread: overlaps the stage)"},
    ]
    if read is not None:
        rank_rows = sum(read["rows"])
        slowest = max(read["read_s"])
        split.append({"phase": "read-only pass (separate run)", "s": _s(slowest),
                      "what": f"one epoch of epoch_batches, no model, slowest of 2 ranks: "
                              f"{rank_rows:,} rows, {rank_rows / slowest:,.0f} rows/s "
                              f"(ranks: {', '.join(f'{s:.1f} s' for s in read['read_s'])}); "
                              f"plan {read['plan_s']:.2f} s, sparkddl.run "
                              f"{read['run_s']:.1f} s"})
    elif read_error:
        split.append({"phase": "read-only pass (separate run)", "s": "failed",
                      "what": read_error[:300]})
    memory = [{"process": "driver (Python, this process)", "peak_mib": driver_peak / MIB,
               "how": f"VmRSS every {SAMPLE_S} s during the fit; {fit['driver_before'] / MIB:,.0f}"
                      f" MiB just before; ru_maxrss {fit['maxrss_before'] / MIB:,.0f} -> "
                      f"{fit['maxrss_after'] / MIB:,.0f} MiB"}]
    for i, p in enumerate(ranks):
        memory.append({"process": f"rank {chr(65 + i)} (Python worker pid {p['pid']})",
                       "peak_mib": sampler.peak(p) / MIB,
                       "how": "max of VmHWM and sampled VmRSS; the ranks are the two Python "
                              "workers with the highest peak"})
    for kind in ("driver JVM", "executor JVM", "pyspark daemon"):
        for p in sampler.of_kind(kind):
            memory.append({"process": f"{kind} pid {p['pid']}", "peak_mib": sampler.peak(p) / MIB,
                           "how": "max of VmHWM and sampled VmRSS"})
    if len(workers) > WORKERS:
        memory.append({"process": f"{len(workers) - WORKERS} other Python worker(s)",
                       "peak_mib": sampler.peak(workers[WORKERS]) / MIB,
                       "how": "the largest of them"})
    extra = {
        "config": {"rows": gen["rows"], "bytes": gen["bytes"], "files": gen.get("files"),
                   "row_groups": groups, "data_reused": gen["reused"],
                   "data_write_s": gen.get("write_s"), "epochs": args.epochs,
                   "validation": args.validation, "workers": WORKERS, "batch": BATCH,
                   "model": f"MLP {D}-{HIDDEN}-{CLASSES}", "executor_memory": args.executor_memory,
                   "master": f"local-cluster[{WORKERS},1,{mem_mb}]"},
        "history": history, "fit_time_s_reported": getattr(model, "fit_time_s", None),
        "steps_per_rank": getattr(model, "steps_per_rank", None),
        "time_split": split, "memory": memory,
        "processes": sorted(sampler.procs.values(), key=sampler.peak, reverse=True),
        "driver_rss_samples": [(round(t - start, 2), rss) for t, rss in sampler.driver_samples],
        "spans": [(n, round(s - start, 3), round(e - start, 3)) for n, s, e in spans.spans],
        "spans_missing": spans.missing, "read_pass": read, "read_pass_error": read_error,
    }
    return row, split, memory, extra


def plot_memory(row: dict[str, Any], memory: list[dict[str, Any]]) -> Callable[[Path], None]:
    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        bars = [("dataset\non disk", row["gb_on_disk"] * 1e9 / MIB)]
        bars += [("driver\n(Python)" if i == 0 else m["process"].split(" (")[0], m["peak_mib"])
                 for i, m in enumerate(memory[:1 + WORKERS])]
        fig, ax = plt.subplots(figsize=(7, 4))
        colors = ["#888888"] + ["#1f77b4"] * (len(bars) - 1)
        ax.bar([b[0] for b in bars], [b[1] for b in bars], color=colors)
        ax.set_yscale("log")
        ax.set_ylim(10, max(b[1] for b in bars) * 3)  # room for the labels
        ax.set_ylabel("MiB (log scale)")
        for i, (_, v) in enumerate(bars):
            ax.annotate(f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB", (i, v),
                        ha="center", va="bottom")
        ax.set_title(f"Peak RSS during TorchEstimator.fit vs the table, {row['rows']:,} rows")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return plot


def data_messages(records: list[tuple[float, str, str, str]], start: float, before: float
                  ) -> list[str]:
    """What the library logged about the data between ``start`` (the fit's) and ``before``
    (the stage's start): how it read the table."""
    return [msg for t, name, _, msg in records if name.startswith("sparkddl.data") and
            start <= t <= before][:4]


def notes_text(row: dict[str, Any], extra: dict[str, Any], total_ram: int) -> str:
    c = extra["config"]
    said = "; ".join(extra.get("data_log", [])) or "nothing at INFO"
    reused = "reused from an earlier run" if c["data_reused"] else \
        f"written in {c['data_write_s']:.0f} s"
    store = row["store_gb_written"]
    path = ("the Store holds little besides checkpoints: the table was read in place"
            if store < 0.1 * row["gb_on_disk"] else
            "the Store holds a copy of the data: the fit materialized the table")
    return (f"{c['master']}, spark.executor.memory {c['executor_memory']}; machine RAM "
            f"{total_ram / 2**30:.0f} GiB (the table may be in the OS page cache: the proof "
            f"is about process memory, not disk I/O). Table: {c['rows']:,} rows x {D} float32 "
            f"features + label, {c['files']} files, {c['row_groups']} row groups, {reused}. "
            f"Fit: {c['model']}, Adam, batch {BATCH} per rank, {c['workers']} ranks, "
            f"{c['epochs']} epoch(s), validation {c['validation']}. store_gb_written: bytes "
            f"under the fit's fresh Store afterwards ({path}); the library's log on the data: "
            f"{said}. Rank peaks: the two pyspark "
            f"Python workers (descendants of this process) with the highest peak of VmHWM and "
            f"VmRSS sampled every {SAMPLE_S} s; data_per_rank_peak = bytes on disk / the "
            f"larger rank peak. driver_growth_mib: the driver's peak VmRSS during the fit less "
            f"its VmRSS just before (it includes modules first imported during the fit and "
            f"what the driver holds while it streams the validation rows). "
            f"train_rows_per_s: rows trained (all ranks) / the sum of rank 0's epoch_time_s. "
            f"Waiting for data is rank 0's data_wait_s from the history (the reading that did "
            f"not overlap training); the read-only pass times the reader alone on the same "
            f"table. val_accuracy: the driver's "
            f"evaluation of the last snapshot on the held-out rows (chance: "
            f"{1 / CLASSES:.1f}).")


# ----------------------------------------------------------------------------- main

def memory_mb(text: str) -> int:
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return max(1, int(float(text[:-1]) * units[text[-1]]))
    return max(1, int(text))  # no unit: MiB, as Spark reads spark.executor.memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=8.0,
                        help="target size on disk in GB (1e9 bytes); rows = GB / "
                             f"~{BYTES_PER_ROW} bytes")
    parser.add_argument("--rows", type=int, default=None, help="rows (overrides --gb)")
    parser.add_argument("--work", default="/tmp/sparkddl-bigdata",
                        help="folder for the table (<work>/data) and the Store (<work>/store)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--validation", type=float, default=0.02,
                        help="fraction of rows held out for validation (0: none)")
    parser.add_argument("--executor-memory", default="2g",
                        help="spark.executor.memory of each of the 2 executors")
    parser.add_argument("--keep", action="store_true",
                        help="keep the table (a later run with the same rows reuses it)")
    parser.add_argument("--no-read-pass", action="store_true",
                        help="skip the read-only pass after the fit")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    args = parser.parse_args()

    rows = args.rows if args.rows else int(args.gb * 1e9 / BYTES_PER_ROW)
    work = Path(args.work).resolve()
    data, store = work / "data", work / "store"
    work.mkdir(parents=True, exist_ok=True)
    need = 0 if data.with_suffix(".json").exists() else rows * BYTES_PER_ROW
    free = shutil.disk_usage(work).free
    if free < 1.1 * need:
        sys.exit(f"{work}: {free / 1e9:.1f} GB free, the table needs ~{need / 1e9:.1f} GB")
    if free < need + 1.1 * rows * BYTES_PER_ROW:
        print(f"warning: {free / 1e9:.1f} GB free; a fit that materializes the table into the "
              f"Store needs another ~{rows * BYTES_PER_ROW / 1e9:.1f} GB", file=sys.stderr)

    records = LogRecords()
    lib_log = logging.getLogger("sparkddl")
    lib_log.setLevel(logging.INFO)
    lib_log.addHandler(records)
    echo = logging.StreamHandler(sys.stderr)
    echo.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    lib_log.addHandler(echo)
    logging.getLogger("sparkddl.fit.progress").setLevel(logging.WARNING)

    mem_mb = memory_mb(args.executor_memory)
    spark = local_spark(master=f"local-cluster[{WORKERS},1,{mem_mb}]",
                        **{"spark.executor.memory": f"{mem_mb}m",
                           "spark.sql.shuffle.partitions": "4"})
    read, read_error = None, None
    try:
        gen = generate(spark, data, rows, args.seed)
        groups = row_groups(data)
        shutil.rmtree(store, ignore_errors=True)  # a fresh Store: no cached materialization
        fit = measured_fit(spark, data, store, args.epochs, args.validation)
        shutil.rmtree(store, ignore_errors=True)
        if not args.no_read_pass:
            try:
                read = read_pass(spark, data)
            except Exception as exc:  # noqa: BLE001 - the fit's numbers stand on their own
                read_error = f"{type(exc).__name__}: {exc}"
                print(f"read-only pass failed: {read_error}", file=sys.stderr)
    finally:
        spark.stop()
        shutil.rmtree(store, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
            data.with_suffix(".json").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                work.rmdir()  # only when nothing else is in it
    row, split, memory, extra = summarize(gen, fit, read, read_error, args, groups, mem_mb)
    extra["log"] = [(round(t - fit["start"], 3), name, level, msg)
                    for t, name, level, msg in records.records]
    extra["data_log"] = data_messages(records.records, fit["start"],
                                      fit["spans"].first_start("run_stage") or fit["end"])
    total_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    more = ["#### Time split", "", *md_table(split, ["phase", "s", "what"]), "",
            "#### Peak memory", "", *md_table(memory, ["process", "peak_mib", "how"])]
    columns = ["rows", "gb_on_disk", "fit_s", "train_rows_per_s", "driver_peak_mib",
               "driver_growth_mib", *[k for k in row if k.startswith("rank_")],
               "data_per_rank_peak", "store_gb_written", "val_accuracy"]
    write_results("big_data", [row], columns,
                  f"Out-of-core fit: {row['gb_on_disk']:.2f} GB of Parquet, {WORKERS} ranks",
                  plot=plot_memory(row, memory), notes=notes_text(row, extra, total_ram),
                  extra=extra, more_md="\n".join(more))


if __name__ == "__main__":
    main()
