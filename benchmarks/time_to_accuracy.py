"""Time to accuracy: which strategy reaches a validation accuracy soonest, and at what cost.

2 workers on local[2], every strategy and its main options in one run, 3 seeds each (the
seed sets the initial weights, the data order and the validation split):
  - digits: scikit-learn's digits, MLP 64-128-10, Adam 3e-3, batch 32 per worker, 12 epochs,
    target 0.95 validation accuracy;
  - blobs: 24,000 rows of scikit-learn's ``make_classification`` (64 features, 48
    informative, 10 classes of 2 clusters each; generated here, offline), MLP 64-256-256-10,
    Adam 1e-3, batch 64 per worker, 10 epochs, target 0.90.
On both, a sweep of ``local_sgd`` periods and ``dynamic_averaging`` thresholds (around each
task's own drift) puts the two on the accuracy-vs-bytes plane.

Time is the ranks' training time (the sum of ``epoch_time_s``; the driver evaluates each
epoch's snapshot beside the next epoch, so that costs no training time), bytes what rank 0
handed to collectives (``comm_bytes``), both up to the end of the first epoch whose snapshot
reached the target: the resolution is one epoch.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, digits, local_spark, md_table, write_results

SEEDS = (0, 1, 2)
MAIN = {
    "allreduce": ("allreduce", {}),
    "fp16": ("allreduce", {"compression": "fp16"}),
    "powersgd r=4": ("allreduce", {"compression": "powersgd", "rank": 4}),
    "topk 1%": ("allreduce", {"compression": "topk", "ratio": 0.01}),
    "sign": ("allreduce", {"compression": "sign"}),
    "local_sgd p=8": ("local_sgd", {"period": 8}),
    "dynamic_averaging auto": ("dynamic_averaging", {"check_every": 8}),
    "gossip ring": ("gossip", {"topology": "ring"}),
    "ssp s=2": ("ssp", {"staleness": 2}),
    "ssp dynamic 0..4": ("ssp", {"staleness": 4, "min_staleness": 0}),
    "fsdp": ("fsdp", {}),
}


def sweep(thresholds: tuple[float, ...]) -> dict:
    """local_sgd periods and dynamic_averaging thresholds (the drift is absolute: a larger
    model drifts more, so each task gets thresholds around its own drift)."""
    return {**{f"local_sgd p={p}": ("local_sgd", {"period": p}) for p in (2, 4, 16, 32)},
            **{f"dynamic_averaging t={t:g}": ("dynamic_averaging",
                                              {"threshold": t, "check_every": 8})
               for t in thresholds},
            "dynamic_averaging t=0.1": ("dynamic_averaging", {"threshold": 0.1,
                                                               "check_every": 8}),
            f"dynamic_averaging t={thresholds[2]:g} every 2": (
                "dynamic_averaging", {"threshold": thresholds[2], "check_every": 2})}


SWEEPS = {"digits": sweep((0.01, 0.03, 0.3, 1.0, 3.0)),
          "blobs": sweep((0.3, 1.0, 3.0, 10.0, 30.0))}
SWEEP_BASE = ("local_sgd p=8", "dynamic_averaging auto")


def blobs(spark):
    import numpy as np
    from sklearn.datasets import make_classification
    x, y = make_classification(n_samples=24_000, n_features=64, n_informative=48,
                               n_redundant=8, n_classes=10, n_clusters_per_class=2,
                               class_sep=1.5, random_state=0)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    return spark.createDataFrame([(r.tolist(), int(label)) for r, label in zip(x, y)],
                                 "features array<float>, label int")


# task: (data, model arch, lr, batch, epochs, target, configs)
TASKS = {"digits": (digits, (64, [128], 10), 3e-3, 32, 12, 0.95, {**MAIN, **SWEEPS["digits"]}),
         "blobs": (blobs, (64, [256, 256], 10), 1e-3, 64, 10, 0.90, {**MAIN, **SWEEPS["blobs"]})}


def fit_one(df, task: str, label: str, seed: int, store: str) -> dict:
    import torch

    from sparkddl import TorchEstimator
    from sparkddl.models import MLP
    _, arch, lr, batch, epochs, target, configs = TASKS[task]
    name, options = configs[label]
    model = TorchEstimator(
        model=MLP(*arch), optimizer=lambda p: torch.optim.Adam(p, lr=lr),
        loss=torch.nn.CrossEntropyLoss(), batchSize=batch, epochs=epochs, numWorkers=2,
        validation=0.2, store=store, strategy=name, strategyOptions=options, seed=seed,
        finalWeights="last", progress=False, checkpointEvery=0).fit(df)
    curve, wall, sent = [], 0.0, 0.0
    for r in model.history:
        wall += r["epoch_time_s"]
        sent += r["comm_bytes"]
        curve.append({"epoch": r["epoch"], "wall_s": wall, "MB": sent / 1e6,
                      "val_accuracy": r["val_accuracy"], "syncs": r.get("syncs")})
    hit = next((c for c in curve if c["val_accuracy"] >= target), None)
    steps_per_epoch = round(model.history[-1]["samples_per_sec"]
                            * model.history[-1]["epoch_time_s"] / (2 * batch))
    return {"task": task, "strategy": label, "seed": seed, "target": target,
            "reached": hit is not None,
            "time_to_target_s": hit["wall_s"] if hit else None,
            "epochs_to_target": hit["epoch"] if hit else None,
            "steps_to_target": hit["epoch"] * steps_per_epoch if hit else None,
            "MB_to_target": hit["MB"] if hit else None,
            "best_accuracy": max(c["val_accuracy"] for c in curve),
            "final_accuracy": curve[-1]["val_accuracy"], "total_MB": curve[-1]["MB"],
            "total_s": curve[-1]["wall_s"], "curve": curve}


def spread(values: list) -> str:
    """median (min-max) over the seeds that have a value; '-' if none."""
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    fmt = (lambda v: f"{v:.3g}") if max(abs(v) for v in got) < 1e4 else (lambda v: f"{v:,.0f}")
    if len(got) == 1:
        return fmt(got[0])
    return f"{fmt(statistics.median(got))} ({fmt(min(got))}-{fmt(max(got))})"


def _signed(diffs: list[float]) -> str:
    """Paired differences: median (min..max), signed."""
    if not diffs:
        return "-"
    return f"{statistics.median(diffs):+.3f} ({min(diffs):+.3f}..{max(diffs):+.3f})"


def summarize(runs: list[dict]) -> list[dict]:
    out = []
    for task, (*_, configs) in TASKS.items():
        for label in configs:
            mine = [r for r in runs if r["task"] == task and r["strategy"] == label]
            if not mine:
                continue
            out.append({
                "task": task, "strategy": label,
                "reached": f"{sum(r['reached'] for r in mine)}/{len(mine)}",
                "time_to_target_s": spread([r["time_to_target_s"] for r in mine]),
                "epochs": spread([r["epochs_to_target"] for r in mine]),
                "steps": spread([r["steps_to_target"] for r in mine]),
                "MB_to_target": spread([r["MB_to_target"] for r in mine]),
                "best_accuracy": spread([r["best_accuracy"] for r in mine]),
                "total_MB": spread([r["total_MB"] for r in mine]),
                "vs_allreduce": _signed(_paired(runs, task, label, "best_accuracy")),
                "sweep": label in SWEEPS[task] or label in SWEEP_BASE,
                "median_best": statistics.median(r["best_accuracy"] for r in mine),
                "median_total_MB": statistics.median(r["total_MB"] for r in mine),
                "median_time_to_target_s": statistics.median(
                    [r["time_to_target_s"] for r in mine if r["reached"]] or [float("nan")]),
            })
    return out


def plot(runs: list[dict], summary: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(TASKS) + 2, 2, figsize=(13, 4.2 * (len(TASKS) + 2)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, task in zip(axes, TASKS):
        target = TASKS[task][5]
        for i, label in enumerate(MAIN):
            mine = [r for r in runs if r["task"] == task and r["strategy"] == label]
            if not mine:
                continue
            color, style = colors[i % len(colors)], "-" if i < len(colors) else "--"
            for j, r in enumerate(mine):  # one line per seed, one colour per strategy
                xs_t = [c["wall_s"] for c in r["curve"]]
                xs_b = [max(c["MB"], 1e-3) for c in r["curve"]]
                ys = [c["val_accuracy"] for c in r["curve"]]
                kw = {"color": color, "linestyle": style, "alpha": 0.8, "linewidth": 1,
                      "label": label if j == 0 else None}
                row[0].plot(xs_t, ys, **kw)
                row[1].plot(xs_b, ys, **kw)
        for ax, xlabel in zip(row, ("training time (s, sum of epochs)",
                                    "MB sent by rank 0 (log)")):
            ax.axhline(target, color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("validation accuracy")
            ax.set_ylim(max(0.0, target - 0.25), 1.0)
            ax.set_title(f"{task}: accuracy vs {'time' if ax is row[0] else 'bytes'} "
                         f"(every seed; target {target})", fontsize=9)
            ax.grid(alpha=0.3)
        row[1].set_xscale("log")
        row[0].legend(fontsize=6, ncol=2, loc="lower right")
    for ax, task in zip(axes[len(TASKS)], TASKS):
        _sweep_panel(ax, task, runs)
    _sweep_target_panel(axes[-1][0], "blobs", runs)
    ax = axes[-1][1]
    for i, label in enumerate(MAIN):
        for task, marker in zip(TASKS, "os"):
            s = next((s for s in summary if s["task"] == task and s["strategy"] == label), None)
            if s and s["median_time_to_target_s"] == s["median_time_to_target_s"]:
                ax.scatter(s["median_total_MB"] or 1e-3, s["median_time_to_target_s"],
                           color=colors[i % len(colors)], marker=marker,
                           label=f"{label} ({task})")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per run (median, log)")
    ax.set_ylabel("time to target (s, median of seeds that reached it)")
    ax.set_title("time to target vs traffic", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _paired(runs: list[dict], task: str, label: str, key: str) -> list[float]:
    """``key`` of each seed's run minus allreduce's on the same seed (the seed's split and
    initial weights move accuracy more than most strategies do)."""
    base = {r["seed"]: r[key] for r in runs if r["task"] == task and r["strategy"] == "allreduce"}
    return [r[key] - base[r["seed"]] for r in runs
            if r["task"] == task and r["strategy"] == label and r["seed"] in base]


def _sweep_panel(ax, task: str, runs: list[dict]) -> None:
    """Best accuracy (paired with allreduce) against total bytes, per family."""
    labels = [*SWEEPS[task], *SWEEP_BASE]
    for family, marker in (("local_sgd", "o"), ("dynamic_averaging", "s")):
        pts = []
        for label in labels:
            mine = [r for r in runs if r["task"] == task and r["strategy"] == label]
            if label.startswith(family) and mine:
                diffs = _paired(runs, task, label, "best_accuracy")
                pts.append((statistics.median(r["total_MB"] for r in mine),
                            statistics.median(diffs), min(diffs), max(diffs), label))
        pts.sort()
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=family)
        for x, y, lo, hi, label in pts:
            ax.vlines(x, lo, hi, color="grey", linewidth=0.8)
            ax.annotate(label.split(" ", 1)[1], (x, y), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.axhline(0, color="grey", linestyle=":", linewidth=1, label="allreduce")
    ax.set_xscale("log")
    ax.set_xlabel(f"MB sent by rank 0 in {TASKS[task][4]} epochs (median over seeds, log)")
    ax.set_ylabel("best accuracy - allreduce's, same seed")
    ax.set_title(f"{task}: local_sgd periods vs dynamic_averaging thresholds "
                 "(median; bar: range over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _sweep_target_panel(ax, task: str, runs: list[dict]) -> None:
    """Bytes and time to the target, per sweep point (median over seeds)."""
    for family, marker in (("local_sgd", "o"), ("dynamic_averaging", "s")):
        pts = []
        for label in [*SWEEPS[task], *SWEEP_BASE]:
            hit = [r for r in runs if r["task"] == task and r["strategy"] == label
                   and r["reached"]]
            if label.startswith(family) and hit:
                pts.append((statistics.median(r["MB_to_target"] for r in hit),
                            statistics.median(r["time_to_target_s"] for r in hit), label))
        pts.sort()
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=family)
            for x, y, label in pts:
                ax.annotate(label.split(" ", 1)[1], (x, y), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent by rank 0 to the target (median, log)")
    ax.set_ylabel("time to target (s, median)")
    ax.set_title(f"{task}: bytes and time to {TASKS[task][5]} for each sweep point", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def run_all(only: set[str], sweep_only: bool = False, labels: tuple[str, ...] = ()
            ) -> list[dict]:
    spark = local_spark()
    runs = []
    with tempfile.TemporaryDirectory() as store:
        for task, (make_df, *_, configs) in TASKS.items():
            if only and task not in only:
                continue
            df = make_df(spark).cache()
            df.count()
            for label in configs:
                if (sweep_only and label not in SWEEPS[task]) or (labels and label not in labels):
                    continue
                for seed in SEEDS:
                    runs.append(fit_one(df, task, label, seed, store))
                    r = runs[-1]
                    print(f"{task} {label} seed {seed}: reached={r['reached']} "
                          f"t={r['time_to_target_s']} MB={r['MB_to_target']} "
                          f"best={r['best_accuracy']:.4f} total_MB={r['total_MB']:.1f}",
                          flush=True)
            df.unpersist()
    spark.stop()
    return runs


def main() -> None:
    global SEEDS
    args = sys.argv[1:]
    if "--quick" in args:  # a smoke run of the whole script: 1 seed, 3 configs, 2 epochs
        args.remove("--quick")
        SEEDS = (0,)
        for task, (make_df, arch, lr, batch, _, target, configs) in list(TASKS.items()):
            keep = ["allreduce", "local_sgd p=8", "dynamic_averaging t=0.1"]
            TASKS[task] = (make_df, arch, lr, batch, 2, target, {k: configs[k] for k in keep})
    # --report: tables and plot again from the last run's JSON; --sweep-only: only the
    # sweep's points, --configs=a,b: only those, merged into the last run's JSON (as are
    # runs of any task names given)
    labels = tuple(a.split("=", 1)[1].split(",") for a in args if a.startswith("--configs="))
    labels = labels[0] if labels else ()
    args = [a for a in args if not a.startswith("--configs=")]
    flags = {a for a in args if a.startswith("--")}
    runs = []
    if flags & {"--report", "--sweep-only"} or labels or [a for a in args if a not in flags]:
        path = RESULTS / "time_to_accuracy.json"
        runs = json.loads(path.read_text())["runs"] if path.exists() else []
    if "--report" not in flags:
        new = run_all({a for a in args if a not in flags}, "--sweep-only" in flags, labels)
        fresh = {(r["task"], r["strategy"], r["seed"]) for r in new}
        runs = [r for r in runs if (r["task"], r["strategy"], r["seed"]) not in fresh] + new
    summary = summarize(runs)
    columns = ["task", "strategy", "reached", "time_to_target_s", "epochs", "steps",
               "MB_to_target", "best_accuracy", "vs_allreduce", "total_MB"]
    sweep_md = "\n".join(["#### Sweep: local_sgd periods and dynamic_averaging thresholds",
                          "", *md_table([s for s in summary if s["sweep"]],
                                        ["task", "strategy", "reached", "time_to_target_s",
                                         "MB_to_target", "best_accuracy", "vs_allreduce",
                                         "total_MB"])])
    write_results("time_to_accuracy", [s for s in summary if not s["sweep"]
                                       or s["strategy"] in MAIN], columns,
                  "Time to accuracy, 2 workers on local[2]",
                  lambda path: plot(runs, summary, path),
                  notes="median (min-max) over seeds 0, 1, 2; time = training time to the end "
                        "of the first epoch whose snapshot reached the target (digits 0.95, "
                        "blobs 0.90), bytes = rank 0's comm_bytes to then; best = best "
                        "validation accuracy within the budget (digits 12 epochs, blobs 10); "
                        "vs_allreduce = best minus allreduce's best on the same seed.",
                  extra={"runs": runs}, more_md=sweep_md)


if __name__ == "__main__":
    main()
