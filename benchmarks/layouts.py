"""Table layouts: copied or read in place, and the rows an epoch trains, for sparkddl (now and
before issue 44), TorchDistributor + Petastorm and Ray Data; and the cold fits on a
Spark-written table (issue 44, item 8).

One process, one local[2] session:
  - data: scikit-learn's digits /16 tiled ``--tiles`` times (112: 201,264 rows; 2226:
    4,000,122) with N(0, 0.05) noise, written with pyarrow (``common.digits_parquet``, not
    timed), read with ``spark.read.parquet`` and written again BY SPARK in each layout:
      - "full+remainder": ``repartition(8)`` with ``parquet.block.size`` = 4 MB: the files
        are larger than a block, so each holds one full row group and a remainder (the
        layout of big tables; the actual row groups per file are reported);
      - "one group per file": ``repartition(8)``, the default block size (128 MB);
      - "fewer files than ranks": ``repartition(2)``;
      - "skewed files": ``repartition(8, k)`` by a skewed key (k = 0 for about half the
        rows, 1 for a quarter, ... 7 for the rest: a geometric key, hashed into 8 files);
      - "single file": ``coalesce(1)``.
Layout matrix (world 2, 3, 4, and 8 on the planners alone; batch 256 per rank):
  - sparkddl now: ``sparkddl.data.prepare(spark.read.parquet(table), spec, num_workers=world,
    batch_size=256, store=...)``: read in place (``prepared.in_place``) or copied, and the
    rows an epoch trains, ``plan.rows_per_epoch / rows`` of ``prepared.train.plan(world,
    256)``; the plan's pieces are checked (every row of every row group in exactly one
    piece of one rank; a rank's pieces sum to its rows);
  - sparkddl before issue 44: the old planner's rule applied to the same footers: Petastorm's
    shard rule (row group i -> rank i % world), and the table copied into the store when more
    than 25 % of its rows would be skipped per epoch, i.e. when world x (min(shard) // batch)
    x batch < 0.75 x rows; otherwise that share is trained. (The share a copy trained depends
    on the copy's own row groups and is not recomputed here.);
  - TorchDistributor + Petastorm (the recipe of side_by_side.py's ``peer``:
    ``make_batch_reader(cur_shard=rank, shard_count=world, num_epochs=None)``, rows // (batch
    x world) steps on every rank): the rows of each rank's shard, computed from the footers
    with Petastorm's rule (files sorted by path, row group i -> rank i % world, as
    ``Reader._partition_row_groups`` does without a seed) AND measured: each rank's reader
    opened with ``num_epochs=1`` reading the label column only, its rows counted (a rank with
    no row group fails with NoDataAvailableError when it opens). A rank-synchronous epoch
    reads steps x batch rows of each rank's shard, cycling through the shard where it is
    smaller, so the distinct rows of an epoch are sum over ranks of min(shard, steps x batch);
    the rows a small shard reads twice in the epoch are counted too;
  - Ray Data: not installed in .venv and not run: Ray Train splits its "train" dataset with
    ``streaming_split(world, equal=True)`` (``ray.train.DataConfig.configure``), which its
    docs document as each split getting exactly the same number of rows (up to world - 1
    dropped); ``iter_torch_batches`` keeps the last partial batch by default. What that
    implies is written down, marked "documented, not measured".
Cold fits on the "full+remainder" table, in the same session, in this order:
  - plain DDP, no Spark: side_by_side.py's ``files_train`` in 2 spawned processes (each
    reads its files, ``files[rank::2]``, with pyarrow; equal steps);
  - TorchDistributor + Petastorm on the table's files: side_by_side.py's ``peer``;
  - sparkddl: ``TorchEstimator(...).fit(spark.read.parquet(table))``, numWorkers=2, its store
    checked afterwards for a data/ folder (none: read in place).
  Same MLP (64-256-256-10, torch seed 0), Adam lr 1e-3, cross-entropy, batch 256 per worker,
  ``--epochs`` (2) epochs, 1 torch thread per rank. Wall: from the DataFrame (already counted)
  to the trained model on the driver, as in side_by_side.py.

  python benchmarks/layouts.py [--tiles 112] [--only matrix,fits] [--scratch DIR] [--keep]
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    digits_parquet,
    end_run,
    local_spark,
    md_table,
    mlp,
    spawn_ranks,
    start_run,
    traced_fit,
)

FULL, ONE, FEWER, SKEWED, SINGLE = ("full+remainder", "one group per file",
                                    "fewer files than ranks", "skewed files", "single file")
# geometric: k = 0 for ~1/2 of the rows, 1 for ~1/4, ..., 7 for the last ~1/128 (deterministic:
# a hash of the row, not rand(), so that a retried task writes the same file)
SKEW_KEY = ("least(7, cast(floor(-log2((pmod(xxhash64(features, label), 1048576) + 1) "
            "/ 1048576.0)) as int))")
LAYOUTS: dict[str, tuple[str, Callable[[Any], Any], dict[str, str]]] = {
    FULL: ("repartition(8), parquet.block.size = 4 MB", lambda df: df.repartition(8),
           {"parquet.block.size": str(4 << 20)}),
    ONE: ("repartition(8), default block size", lambda df: df.repartition(8), {}),
    FEWER: ("repartition(2)", lambda df: df.repartition(2), {}),
    SKEWED: ("repartition(8, k), k skewed (geometric)",
             lambda df: df.selectExpr("*", f"{SKEW_KEY} as k").repartition(8, "k").drop("k"),
             {}),
    SINGLE: ("coalesce(1)", lambda df: df.coalesce(1), {}),
}
OLD_MAX_SKIPPED = 0.25  # the old planner copied a table above this share of rows skipped
DOCUMENTED = "documented, not measured"


# ---------------------------------------------------------------------------- the tables

def write_layout(spark: Any, source: str, name: str, root: Path) -> str:
    _, shape, options = LAYOUTS[name]
    path = root / name.replace(" ", "_").replace("+", "_")
    writer = shape(spark.read.parquet(source)).write.mode("overwrite")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.parquet(f"file://{path}")
    return str(path)


def footers(path: str) -> list[tuple[str, list[int]]]:
    """(file, rows of each row group) of every data file, files sorted by path: the order
    Petastorm (and sparkddl) list them in (names starting with '_' or '.' are not data)."""
    import pyarrow.parquet as pq

    root = Path(path)
    files = sorted(str(p) for p in root.rglob("*") if p.is_file() and not any(
        part.startswith(("_", ".")) or part.endswith(".crc")
        for part in p.relative_to(root).parts))
    out = []
    for f in files:
        meta = pq.ParquetFile(f).metadata
        out.append((f, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]))
    return out


def groups_text(files: list[tuple[str, list[int]]]) -> str:
    """Row groups per file, runs of equal groups and identical files counted:
    "[15870, 9288] x 8", "[15870 x 31, 8045] x 4"."""
    def one(groups: list[int]) -> str:
        runs: list[list[int]] = []
        for g in groups:
            if runs and runs[-1][0] == g:
                runs[-1][1] += 1
            else:
                runs.append([g, 1])
        return "[" + ", ".join(f"{g} x {n}" if n > 1 else str(g) for g, n in runs) + "]"
    counts: dict[str, int] = {}
    for _, groups in files:
        counts[one(groups)] = counts.get(one(groups), 0) + 1
    if len(counts) > 4:  # many different files: each, in files order
        return "; ".join(one(groups) for _, groups in files)
    return "; ".join(f"{k} x {n}" if n > 1 else k for k, n in counts.items())


def petastorm_order(url: str) -> list[tuple[str, int]]:
    """(file, row group) of the table in the order Petastorm's Reader shards them: the same
    ParquetDataset and ``load_row_groups`` as ``petastorm.reader.Reader`` (no summary files:
    the footers of ``dataset.pieces``)."""
    import pyarrow.parquet as pq
    from petastorm.etl.dataset_metadata import load_row_groups
    from petastorm.fs_utils import get_filesystem_and_path_or_paths

    fs, path = get_filesystem_and_path_or_paths(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = pq.ParquetDataset(path, filesystem=fs, validate_schema=False,
                                    metadata_nthreads=10)
        return [(p.path, p.row_group) for p in load_row_groups(dataset)]


# ------------------------------------------------------------------------ rules and plans

def petastorm_shards(groups: list[int], world: int) -> list[int] | None:
    """Rows per rank under Petastorm's rule (row group i -> rank i % world); None where
    Petastorm refuses (fewer row groups than ranks: NoDataAvailableError)."""
    if len(groups) < world:
        return None
    rows = [0] * world
    for i, n in enumerate(groups):
        rows[i % world] += n
    return rows


def peer_epoch(shards: list[int], total: int, world: int, batch: int) -> dict[str, Any]:
    """What one rank-synchronous epoch of the recipe covers: rows // (batch x world) steps on
    every rank, each rank cycling through its own shard."""
    steps = total // (batch * world)
    per_rank = steps * batch
    distinct = sum(min(s, per_rank) for s in shards)
    return {"steps": steps, "rows_read": per_rank * world, "distinct": distinct,
            "repeated": sum(max(0, per_rank - s) for s in shards),
            "distinct_share": distinct / total}


def old_planner(groups: list[int], world: int, batch: int) -> dict[str, Any]:
    """The planner before issue 44: Petastorm's rule, and a copy when more than 25 % of the
    rows would be skipped per epoch."""
    total = sum(groups)
    shards = petastorm_shards(groups, world) or [0] * world  # fewer groups: min shard 0
    used = world * (min(shards) // batch) * batch
    copied = used < (1 - OLD_MAX_SKIPPED) * total
    return {"copied": copied, "rows_per_rank": shards, "share": None if copied else used / total,
            "share_in_place": used / total}


def check_plan(plan: Any) -> dict[str, Any]:
    """The new plan's pieces: every row of every row group in exactly one piece of one rank,
    a rank's pieces summing to its rows; row groups split between ranks and the most row
    groups one rank decodes."""
    problems = []
    spans: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    decodes = []
    for rank in range(plan.world):
        pieces = plan.pieces(rank)
        decodes.append(len({p.group for p in pieces}))
        if sum(p.rows for p in pieces) != plan.rows_per_rank[rank]:
            problems.append(f"rank {rank}: pieces hold {sum(p.rows for p in pieces)} rows, "
                            f"plan says {plan.rows_per_rank[rank]}")
        for p in pieces:
            spans[p.group].append((p.start, p.stop, rank))
    for group, rows in enumerate(plan.row_groups):
        at = 0
        for start, stop, _ in sorted(spans.get(group, [])):
            if start != at or stop <= start:
                problems.append(f"row group {group}: piece {start}..{stop} after row {at}")
            at = max(at, stop)
        if at != rows:
            problems.append(f"row group {group}: pieces end at {at} of {rows} rows")
    split = sum(1 for s in spans.values() if len({r for *_, r in s}) > 1)
    return {"problems": problems, "split_groups": split, "max_groups_decoded": max(decodes)}


def measured_petastorm(url: str, world: int) -> dict[str, Any]:
    """Every rank's Petastorm reader opened as the recipe does (sharded, no seed), for one
    epoch of the label column: the rows each rank reads, or the error it fails with."""
    from petastorm import make_batch_reader

    rows = []
    for rank in range(world):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with make_batch_reader(url, schema_fields=["label"], cur_shard=rank,
                                       shard_count=world, num_epochs=1, workers_count=2,
                                       shuffle_row_groups=False) as reader:
                    rows.append(sum(len(batch.label) for batch in reader))
        except Exception as exc:  # noqa: BLE001 - the failure is the result
            return {"error": f"{type(exc).__name__} (rank {rank})", "rows": None}
    return {"error": None, "rows": rows}


def ray_documented(total: int, world: int, batch: int) -> dict[str, Any]:
    """What Ray Train's split is documented to do: ``streaming_split(world, equal=True)``,
    every split exactly total // world rows; iter_torch_batches keeps the last partial batch."""
    per_rank = total // world
    return {"rows_per_rank": per_rank, "share": per_rank * world / total,
            "steps": -(-per_rank // batch)}


def matrix(spark: Any, tables: dict[str, str], worlds: list[int], planner_worlds: list[int],
           batch: int, work: Path, measure: bool) -> tuple[list[dict], list[dict], dict]:
    from sparkddl.data import DataSpec, prepare

    spec = DataSpec.of("features", "label")
    store = work / "store-matrix"
    rows, layouts, failures = [], [], {}
    for name, path in tables.items():
        files = footers(path)
        groups = [g for _, gs in files for g in gs]
        total = sum(groups)
        order_ok = None
        if measure:
            ours = [(f, i) for f, gs in files for i in range(len(gs))]
            order_ok = petastorm_order(f"file://{path}") == ours
        layouts.append({"layout": name, "written": LAYOUTS[name][0], "files": len(files),
                        "row_groups": len(groups),
                        "rows_per_file": [sum(gs) for _, gs in files],
                        "row_groups_per_file": groups_text(files),
                        "row_groups_rows": [gs for _, gs in files],
                        "petastorm_order_matches_footers": order_ok, "rows": total})
        df = spark.read.parquet(f"file://{path}")
        for world in worlds + [w for w in planner_worlds if w not in worlds]:
            row: dict[str, Any] = {"layout": name, "world": world, "rows": total,
                                   "planner_only": world not in worlds}
            # sparkddl now
            t = time.perf_counter()
            try:
                prepared = prepare(df, spec, num_workers=world, batch_size=batch,
                                   store=f"file://{store}")
                plan = prepared.train.plan(world, batch)
            except Exception as exc:  # noqa: BLE001 - reported with its traceback
                import traceback
                failures[f"{name} @ {world}"] = traceback.format_exc()
                row.update(now=f"FAILED: {type(exc).__name__}", now_share="")
                prepared = plan = None
            row["prepare_s"] = time.perf_counter() - t
            if plan is not None:
                checked = check_plan(plan)
                if checked["problems"]:
                    failures[f"{name} @ {world} pieces"] = "\n".join(checked["problems"][:20])
                row.update(now="in place" if prepared.in_place else "COPIED",
                           now_in_place=prepared.in_place,
                           now_share_value=plan.rows_per_epoch / total,
                           now_share=_pct(plan.rows_per_epoch / total),
                           now_rows_per_rank=list(plan.rows_per_rank),
                           now_steps=plan.steps_per_epoch, now_rows_skipped=plan.rows_skipped,
                           now_split_groups=checked["split_groups"],
                           now_max_groups_decoded=checked["max_groups_decoded"],
                           now_pieces_ok=not checked["problems"])
            # sparkddl before
            old = old_planner(groups, world, batch)
            row.update(before="copied" if old["copied"] else "in place",
                       before_share=("copy" if old["copied"] else _pct(old["share"])),
                       before_share_value=old["share"],
                       before_share_if_in_place=old["share_in_place"],
                       before_rows_per_rank=old["rows_per_rank"])
            # TorchDistributor + Petastorm
            shards = petastorm_shards(groups, world)
            row["petastorm_rule_rows_per_rank"] = shards
            if measure and world in worlds:
                got = measured_petastorm(f"file://{path}", world)
                row["petastorm_measured_rows_per_rank"] = got["rows"]
                row["petastorm_measured_error"] = got["error"]
                row["petastorm_rule_matches"] = (got["rows"] == shards) if shards else \
                    (got["error"] is not None)
            if shards is None:
                row.update(petastorm="FAILS (NoDataAvailableError: "
                                     f"{len(groups)} row groups < {world} ranks)",
                           petastorm_share="-", petastorm_rows="-")
            else:
                epoch = peer_epoch(shards, total, world, batch)
                row.update(petastorm="runs", petastorm_rows=" / ".join(f"{s:,}" for s in shards),
                           petastorm_share=_pct(epoch["distinct_share"]),
                           petastorm_share_value=epoch["distinct_share"],
                           petastorm_repeated=epoch["repeated"], petastorm_steps=epoch["steps"])
                if epoch["repeated"]:
                    row["petastorm_share"] += f" ({epoch['repeated']:,} read twice)"
            # Ray Data
            ray = ray_documented(total, world, batch)
            row.update(ray=f"{_pct(ray['share'])}, {DOCUMENTED}", ray_share_value=ray["share"])
            rows.append(row)
            print(f"  {name} @ {world}: sparkddl {row['now']} {row['now_share']} (before "
                  f"{row['before']} {row['before_share']}); petastorm {row['petastorm']} "
                  f"{row['petastorm_share']}", flush=True)
    materialized = (store / "data").exists() and any((store / "data").iterdir())
    return rows, layouts, {"matrix_store_has_data": materialized, "failures": failures}


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.2f} %"


# ------------------------------------------------------------------------------- cold fits

def fit_ddp(table: str, hp: Any) -> dict[str, Any]:
    import side_by_side
    files = [f for f, _ in footers(table)]
    start = time.perf_counter()
    out = spawn_ranks(side_by_side.files_train, 2, files, hp)
    return {"wall_s": time.perf_counter() - start, "loop_s": out["loop_s"],
            "final_loss": out["final_loss"], "samples_per_epoch": out["steps"] * hp.batch * 2,
            "epoch_times": out["epoch_times"]}


def fit_peer(spark: Any, table: str, hp: Any, work: Path) -> dict[str, Any]:
    import side_by_side
    side_by_side.WORKERS = 2
    df = spark.read.parquet(f"file://{table}")
    df.count()
    out = side_by_side.peer(spark, df, hp, work, table=f"file://{table}")
    return {"wall_s": out["e2e_s"], "loop_s": out["loop_s"], "final_loss": out["final_loss"],
            "samples_per_epoch": out["samples"] // hp.epochs, "epoch_times": out["epoch_times"],
            "phases": [(what, end - start) for what, _, start, end in out["phases"]]}


def fit_sparkddl(spark: Any, table: str, hp: Any, work: Path, cache_mb: int = 0
                 ) -> dict[str, Any]:
    import torch

    from sparkddl import TorchEstimator

    df = spark.read.parquet(f"file://{table}")
    df.count()
    store = work / "store-fit"
    torch.manual_seed(hp.seed)
    lr = hp.lr
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=lr),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=hp.batch, epochs=hp.epochs, numWorkers=2,
                         store=f"file://{store}", seed=hp.seed, progress=False,
                         epochCacheMB=cache_mb)
    return traced_fit(est, df, store)


def fits(spark: Any, table: str, hp: Any, work: Path, repeats: int, cache_mb: int = 0
         ) -> list[dict[str, Any]]:
    out: dict[str, list[dict]] = {"ddp": [], "peer": [], "sparkddl": []}
    if cache_mb:
        out["sparkddl_cache"] = []
    for i in range(repeats):
        print(f"  fits, round {i + 1}: plain DDP", flush=True)
        out["ddp"].append(fit_ddp(table, hp))
        print(f"    {out['ddp'][-1]['wall_s']:.1f} s; TorchDistributor + Petastorm", flush=True)
        out["peer"].append(fit_peer(spark, table, hp, work))
        print(f"    {out['peer'][-1]['wall_s']:.1f} s; sparkddl", flush=True)
        out["sparkddl"].append(fit_sparkddl(spark, table, hp, work / f"fit{i}"))
        print(f"    {out['sparkddl'][-1]['wall_s']:.1f} s", flush=True)
        if cache_mb:
            out["sparkddl_cache"].append(fit_sparkddl(spark, table, hp, work / f"fitc{i}",
                                                      cache_mb))
            print(f"    epochCacheMB={cache_mb}: {out['sparkddl_cache'][-1]['wall_s']:.1f} s",
                  flush=True)
    labels = {"ddp": "plain DDP, no Spark (2 processes, pyarrow reads files[rank::2])",
              "peer": "TorchDistributor + Petastorm on the table's files",
              "sparkddl": "sparkddl: TorchEstimator.fit(spark.read.parquet(table))",
              "sparkddl_cache": f"sparkddl, epochCacheMB={cache_mb} (epochs after the first "
                                "from memory)"}
    peer_wall = min(r["wall_s"] for r in out["peer"])
    rows = []
    for key, runs in out.items():
        best = min(runs, key=lambda r: r["wall_s"])
        rows.append({"runner": labels[key], "key": key, "wall_s": best["wall_s"],
                     "walls_s": [r["wall_s"] for r in runs], "loop_s": best["loop_s"],
                     "vs_peer": best["wall_s"] / peer_wall, "final_loss": best["final_loss"],
                     "epoch_times_s": [round(t, 2) for t in best["epoch_times"]],
                     "in_place": {True: "yes (no data/ in the store)",
                                  False: "NO (data/ in the store)"}.get(best.get("in_place"), ""),
                     **{k: best[k] for k in ("rows_trained", "rows_skipped", "phases",
                                             "samples_per_epoch") if k in best}})
    return rows


# ----------------------------------------------------------------------------- the report

MATRIX_COLUMNS = ["layout", "world", "sparkddl now", "now: rows/epoch", "sparkddl before",
                  "before: rows/epoch", "Petastorm rows per rank", "TorchDistributor + "
                  "Petastorm: distinct rows/epoch", "Ray Data (streaming_split equal=True)"]
FIT_COLUMNS = ["runner", "wall_s", "vs_peer", "loop_s", "epoch_times_s", "final_loss", "in_place"]


def matrix_md_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        out.append({"layout": r["layout"], "world": r["world"] if not r["planner_only"]
                    else f"{r['world']} (planner)", "sparkddl now": r["now"],
                    "now: rows/epoch": r["now_share"], "sparkddl before": r["before"],
                    "before: rows/epoch": r["before_share"],
                    "Petastorm rows per rank": r["petastorm_rows"],
                    "TorchDistributor + Petastorm: distinct rows/epoch":
                        r["petastorm_share"] if r["petastorm"] == "runs" else r["petastorm"],
                    "Ray Data (streaming_split equal=True)": r["ray"]})
    return out


def layouts_md(layouts: list[dict]) -> str:
    rows = [{"layout": lo["layout"], "written by Spark as": lo["written"], "files": lo["files"],
             "row groups": lo["row_groups"], "rows per file": ", ".join(
                 f"{n:,}" for n in lo["rows_per_file"]),
             "row groups per file (rows)": lo["row_groups_per_file"],
             "Petastorm's order = footers sorted by path": lo["petastorm_order_matches_footers"]}
            for lo in layouts]
    return "\n".join(["#### The tables as Spark wrote them", "",
                      *md_table(rows, list(rows[0]))]) if rows else ""


def fits_md(rows: list[dict], hp: Any, n_rows: int, repeats: int, table: bool = True
            ) -> str:
    if not rows:
        return ""
    ours = next(r for r in rows if r["key"] == "sparkddl")
    ddp = next(r for r in rows if r["key"] == "ddp")
    lines = [f"#### Cold fits on the full+remainder table ({n_rows:,} rows, repartition(8), "
             f"4 MB blocks), {hp.epochs} epochs, batch {hp.batch} per worker, 2 workers"
             + (f", best of {repeats}" if repeats > 1 else ""), ""]
    if table:
        lines += [*md_table(rows, FIT_COLUMNS), ""]
    lines.append(
        f"- sparkddl / TorchDistributor + Petastorm: {ours['vs_peer']:.2f} x (goal <= 0.5 at "
        f"200 k rows, <= 0.35 at 4 M); sparkddl / plain DDP: {ours['wall_s'] / ddp['wall_s']:.2f}"
        f" x; sparkddl read the table in place: {ours['in_place']}; rows_trained per epoch "
        f"{ours.get('rows_trained')}, rows_skipped {ours.get('rows_skipped')}.")
    for r in rows:
        if r.get("phases"):
            lines.append(f"- {r['key']}: " + "; ".join(f"{what} {s:.2f} s"
                                                          for what, s in r["phases"]))
    return "\n".join(lines)


def plot(rows: list[dict], fit_rows: list[dict], worlds: list[int]) -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt
        import numpy as np

        panels = (1 if rows else 0) + (1 if fit_rows else 0)
        fig, axes = plt.subplots(1, panels, figsize=(9 * panels if rows else 6, 5.2),
                                 squeeze=False)
        axes = list(axes[0])
        if rows:
            ax = axes.pop(0)
            shown = [r for r in rows if r["world"] in worlds]
            labels = [f"{r['layout']}\n@{r['world']}" for r in shown]
            x = np.arange(len(shown))
            series = [("sparkddl now", "now_share_value", "tab:green"),
                      ("sparkddl before (0: copied)", "before_share_value", "tab:olive"),
                      ("TorchDistributor + Petastorm, distinct (0: fails)",
                       "petastorm_share_value", "tab:blue")]
            for i, (label, key, color) in enumerate(series):
                at = x + (i - 1) * 0.27
                ax.bar(at, [100 * (r.get(key) or 0) for r in shown], 0.27, label=label,
                       color=color)
                for xi, r in zip(at, shown):  # what a missing bar means
                    if r.get(key) is None:
                        word = {"before_share_value": "copied",
                                "petastorm_share_value": "fails"}.get(key, "failed")
                        ax.text(xi, 2, word, rotation=90, fontsize=6, ha="center")
            ax.set_xticks(x, labels, fontsize=6, rotation=90)
            ax.set_ylim(0, 105)
            ax.set_ylabel("% of rows trained per epoch")
            ax.set_title("rows per epoch by layout and world (higher is better)", fontsize=10)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=3,
                      framealpha=1.0)
            ax.set_ylim(0, 118)
        if fit_rows:
            ax = axes.pop(0)
            names = [r["key"] for r in fit_rows]
            bars = ax.bar(names, [r["wall_s"] for r in fit_rows],
                          color=["tab:gray", "tab:blue", "tab:green"][:len(names)])
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
            ax.set_title("cold fit on the full+remainder table, s (lower is better)",
                         fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return draw


# ----------------------------------------------------------------------------------- main

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=112, help="digits copies (1,797 rows each)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="per rank")
    p.add_argument("--worlds", default="2,3,4", help="world sizes of the layout matrix")
    p.add_argument("--planner-worlds", default="8",
                   help="more world sizes, on the planners alone (no Petastorm reads)")
    p.add_argument("--only", default="matrix,fits", help="matrix, fits or both")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the three fits")
    p.add_argument("--cache-mb", type=int, default=0,
                   help="also fit with sparkddl's epochCacheMB set to this (0: not run)")
    p.add_argument("--no-measure", action="store_true",
                   help="skip opening Petastorm's readers (the rule alone)")
    p.add_argument("--scratch", default=None, help="where the work directory goes")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    import side_by_side

    parts = {s.strip() for s in args.only.split(",") if s.strip()}
    if not parts <= {"matrix", "fits"}:
        raise SystemExit(f"--only takes matrix and/or fits, got {args.only}")
    worlds = [int(w) for w in args.worlds.split(",") if w]
    planner_worlds = [int(w) for w in args.planner_worlds.split(",") if w]
    hp = side_by_side.Hyper(epochs=args.epochs, batch=args.batch)
    work, started, timings = start_run("sparkddl-layouts-", args.scratch)
    try:
        n_rows = digits_parquet(work / "source", tiles=args.tiles)
        t = time.perf_counter()
        spark = local_spark("local[2]")
        timings["session_s"] = time.perf_counter() - t
        try:
            t = time.perf_counter()
            names = list(LAYOUTS) if "matrix" in parts else [FULL]
            tables = {name: write_layout(spark, f"file://{work}/source", name, work / "tables")
                      for name in names}
            timings["write_layouts_s"] = time.perf_counter() - t
            fit_rows: list[dict] = []
            if "fits" in parts:
                t = time.perf_counter()
                side_by_side.WORKERS = 2
                timings["workers_start_s"] = side_by_side.warm_workers(spark)
                fit_rows = fits(spark, tables[FULL], hp, work, args.repeats, args.cache_mb)
                timings["fits_s"] = time.perf_counter() - t
            rows, layouts, checks = [], [], {"failures": {}}
            if "matrix" in parts:
                t = time.perf_counter()
                rows, layouts, checks = matrix(spark, tables, worlds, planner_worlds,
                                               args.batch, work, not args.no_measure)
                timings["matrix_s"] = time.perf_counter() - t
            else:
                layouts = [{"layout": FULL, "written": LAYOUTS[FULL][0],
                            **_layout_facts(tables[FULL])}]
        finally:
            spark.stop()
    finally:
        end_run(work, args.keep, started, timings)
    report(args, rows, layouts, fit_rows, checks, timings, n_rows, hp, worlds, parts)


def _layout_facts(path: str) -> dict[str, Any]:
    files = footers(path)
    return {"files": len(files), "row_groups": sum(len(g) for _, g in files),
            "rows_per_file": [sum(g) for _, g in files], "row_groups_per_file": groups_text(files),
            "petastorm_order_matches_footers": "not checked (matrix only)",
            "row_groups_rows": [g for _, g in files], "rows": sum(sum(g) for _, g in files)}


def report(args: argparse.Namespace, rows: list[dict], layouts: list[dict],
           fit_rows: list[dict], checks: dict, timings: dict, n_rows: int, hp: Any,
           worlds: list[int], parts: set[str]) -> None:
    from common import write_results

    name = "layouts" if args.tiles == 112 else f"layouts_{n_rows // 1000}k"
    if parts == {"fits"} and args.tiles == 112:
        name = "layouts_fits"
    failures = checks.get("failures", {})
    mismatched = [f"{r['layout']} @ {r['world']}" for r in rows
                  if r.get("petastorm_rule_matches") is False]
    notes = (
        f"{n_rows:,} rows (digits tiled {args.tiles}x), each layout written by Spark "
        f"(local[2]) from the same DataFrame; batch {args.batch} per rank. rows/epoch: the "
        f"rows one epoch trains / all rows. sparkddl now: prepare(spark.read.parquet(table), "
        f"num_workers=world) and its plan (in place = prepared.in_place; the matrix's store "
        f"{'HAS' if checks.get('matrix_store_has_data') else 'has no'} data/ folder after "
        f"every prepare). sparkddl before: the old planner's rule on the same footers "
        f"(Petastorm's rule; copied where more than 25 % of the rows would be skipped per "
        f"epoch; 'copy': the share the copy trained depends on the copy's row groups and is "
        f"not recomputed here). Petastorm: rows per rank by its rule from the footers"
        + ("" if args.no_measure else
           f", checked against each rank's reader (label column, num_epochs=1): "
           f"{'all match' if not mismatched else 'MISMATCH at ' + ', '.join(mismatched)}")
        + f"; distinct rows/epoch = sum over ranks of min(shard, steps x batch) / rows with "
          f"steps = rows // (batch x world) (a smaller shard is read twice in part). Ray Data: "
          f"{DOCUMENTED}: Ray Train splits with streaming_split(world, equal=True), each split "
          f"exactly rows // world rows (Ray is not installed here)."
        + (f" PLANNER FAILURES: {', '.join(failures)} (tracebacks in the JSON)."
           if failures else ""))
    run_times = ("#### Run times (s) and 1-minute load average (2 cores)\n\n"
                 + "; ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    if rows:
        main_rows, columns = matrix_md_rows(rows), MATRIX_COLUMNS
        title = (f"Table layouts x world: copied? rows per epoch? ({n_rows:,} rows written by "
                 f"Spark, batch {args.batch} per rank)")
        more = [layouts_md(layouts), fits_md(fit_rows, hp, n_rows, args.repeats), run_times]
    else:
        main_rows, columns = fit_rows, FIT_COLUMNS
        title = (f"Cold fits on a Spark-written table ({n_rows:,} rows, repartition(8), 4 MB "
                 f"blocks), {hp.epochs} epochs, batch {hp.batch} per worker, 2 workers")
        notes = (f"{n_rows:,} rows written by Spark (local[2]); one session; in this order: "
                 f"plain DDP, TorchDistributor + Petastorm on the table's files, sparkddl. "
                 f"Wall: from the DataFrame to the trained model on the driver.")
        more = [fits_md(fit_rows, hp, n_rows, args.repeats, table=False), layouts_md(layouts),
                run_times]
    write_results(name, main_rows, columns, title, plot(rows, fit_rows, worlds), notes=notes,
                  extra={"hyper": asdict(hp), "rows_in_data": n_rows, "matrix": rows,
                         "layouts": layouts, "fits": fit_rows, "timings_s": timings,
                         "checks": checks, "args": vars(args)},
                  more_md="\n\n".join(m for m in more if m))


if __name__ == "__main__":
    ARGS = parse()
    # through the module's name, not __main__: functions pickled for TorchDistributor's and
    # torch.multiprocessing's processes are then imported by name (benchmarks/ is on their
    # PYTHONPATH)
    import layouts
    layouts.main(ARGS)
