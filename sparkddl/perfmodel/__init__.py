"""``sparkddl plan``: calibrate on the user's cluster, then predict how a job scales and
how much memory each rank needs."""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict
from typing import Any, Sequence

from sparkddl.config import TrainConfig
from sparkddl.fit.inputs import prepare_data, shard_plan
from sparkddl.launch import preflight
from sparkddl.launch.launcher import launch_ranks, new_run_id
from sparkddl.perfmodel import memory
from sparkddl.perfmodel.calibrate import Candidate, calibrate
from sparkddl.perfmodel.predict import Model, Prediction
from sparkddl.session import cluster_context
from sparkddl.session.probe import FIT_IMPORTS
from sparkddl.store import Store
from sparkddl.train.components import model_factory, optimizer_recipe, resolve_loss
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)

WORKERS = (1, 2, 4, 8, 16, 32, 64)
CANDIDATES = (
    Candidate("allreduce", "allreduce", {}),
    Candidate("allreduce-no-overlap", "allreduce", {"overlap": False}),
    Candidate("fp16", "allreduce", {"compression": "fp16", "warmup_steps": 0}),
    Candidate("bf16", "allreduce", {"compression": "bf16", "warmup_steps": 0}),
    Candidate("powersgd", "allreduce", {"compression": "powersgd", "rank": 2,
                                        "warmup_steps": 0}),
    Candidate("topk", "allreduce", {"compression": "topk", "ratio": 0.01, "warmup_steps": 0}),
    Candidate("sign", "allreduce", {"compression": "sign", "warmup_steps": 0}),
    Candidate("local_sgd", "local_sgd", {"period": 8}, steps=16),
    Candidate("dynamic_averaging", "dynamic_averaging", {"check_every": 8}, steps=16),
    Candidate("gossip", "gossip", {}),
    Candidate("ssp", "ssp", {"staleness": 3}),
    # timed where the installed torch runs it on the calibration's device (torch >= 2.6 on
    # CPU); its memory is priced everywhere
    Candidate("fsdp", "fsdp", {}),
)
# priced for memory only (their time is not modelled)
MEMORY_ONLY: tuple[Candidate, ...] = ()


def run_calibration(spark: Any, df: Any, model: Any, optimizer: Any, loss: Any,
                    config: TrainConfig, calibration_workers: int = 2,
                    candidates: tuple[Candidate, ...] = CANDIDATES) -> tuple[dict, int]:
    """One short barrier stage; returns the measurements and the training rows."""
    sc = cluster_context(spark)
    preflight.check_num_workers(calibration_workers)
    workers = preflight.available_workers(sc, calibration_workers)
    preflight.start_cluster_checks(sc, workers, config.use_gpu, FIT_IMPORTS)()
    store = Store.from_uri(config.store)
    data = prepare_data(df, config, store, workers)
    # calibration runs outside train(), whose end frees an epoch cache: none here
    plan = dataclasses.replace(shard_plan(data, config, workers), cache_bytes=0)
    spec = TrainSpec(config.replace(epochs=1, snapshot_every=1), run_id=new_run_id(),
                     model_factory=model_factory(model), optimizer=optimizer_recipe(optimizer),
                     loss=resolve_loss(loss), metrics={}, plan=plan, store_root=store.root)
    cal = launch_ranks(sc, calibrate, (spec, list(candidates), min(plan.steps_per_epoch, 50)),
                       num_workers=workers, run_id=spec.run_id, use_gpu=config.use_gpu,
                       timeout_s=config.timeout_s,
                       description=f"sparkddl plan calibration x{workers}")
    return cal, data.train.rows


def predictions(cal: dict, rows: int, workers: tuple[int, ...] = WORKERS) -> list[Prediction]:
    model = Model(cal)
    return [model.predict(label, n, rows) for label in cal["strategies"] for n in workers]


def memory_predictions(cal: dict, workers: tuple[int, ...] = WORKERS,
                       candidates: tuple[Candidate, ...] = CANDIDATES + MEMORY_ONLY
                       ) -> list[memory.MemoryPrediction]:
    """Rank 0's predicted peak memory for every candidate and worker count."""
    return [memory.predict(cal["memory"], c.label, c.name, c.options, n)
            for c in candidates for n in workers]


def table(preds: list[Prediction]) -> str:
    lines = ["| strategy | workers | epoch s | speed-up | compute ms | comm ms | input ms | "
             "bottleneck |", "|---|---|---|---|---|---|---|---|"]
    for p in preds:
        lines.append(f"| {p.strategy} | {p.workers} | {p.epoch_s:.3g} | {p.speedup:.2f} | "
                     f"{p.compute_s * 1e3:.3g} | {p.comm_s * 1e3:.3g} | {p.input_s * 1e3:.3g} | "
                     f"{p.bottleneck} |")
    return "\n".join(lines)


def plot(preds: list[Prediction]) -> bytes:
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label in dict.fromkeys(p.strategy for p in preds):
        mine = [p for p in preds if p.strategy == label]
        ax.plot([p.workers for p in mine], [p.speedup for p in mine], "-o", markersize=3,
                label=label)
    ns = sorted({p.workers for p in preds})
    ax.plot(ns, ns, ":", color="grey", label="linear")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("predicted speed-up over 1 worker")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def to_json(cal: dict, rows: int, preds: list[Prediction],
            mem: Sequence[memory.MemoryPrediction] = ()) -> str:
    model = Model(cal)
    return json.dumps({"calibration": cal, "rows": rows,
                       "link": asdict(model.link),
                       "codec_s": {label: model.codec_s(label) for label in cal["strategies"]},
                       "predictions": [asdict(p) for p in preds],
                       "memory": [asdict(m) for m in mem]}, indent=1, default=str)


memory_table = memory.table

__all__ = ["CANDIDATES", "MEMORY_ONLY", "WORKERS", "predictions", "memory_predictions",
           "run_calibration", "table", "memory_table", "plot", "to_json"]
