"""Lakehouse tables: a Delta table with deletion vectors read in place (each rank applies
the deletion vectors of the files it reads) or materialized, in cold fits; and what the
deletion vectors cost in memory.

One process, one local[2] session:
  - data (not timed): scikit-learn's digits /16 tiled ``--tiles`` times (2226: 4,000,122
    rows; 20: 35,940) with N(0, 0.05) noise (``common.digits_parquet``, ``--files`` files),
    each file written again as one data file of a Delta table by tests/delta_build.py's
    ``DeltaBuilder`` (pyarrow, row groups of ``--row-group`` rows; one commit a file), then
    one commit deleting ``--deleted`` (5 %) of the rows, drawn at random (seeded) over the
    whole table, as deletion vectors of storage "u" (every file's bitmap in one DV file).
    The deleted rows carry the label -1 in the files: CrossEntropyLoss raises on it
    (checked), so a fit that trained on one deleted row would fail.
  - planning, on the driver, best of ``--repeats`` (the table's files in the OS cache):
      - ``sparkddl.read_delta(spark, table)``: the log (deltalake + sparkddl's replay for the
        DV descriptors), every file's footer and DV decoded for Spark's anti-join, and the
        Spark DataFrame built;
      - ``sparkddl.data.prepare(df, spec, num_workers=2, batch_size=256, store=...)`` on that
        DataFrame, as the fit calls it (the DVs already decoded by read_delta, cached in its
        listing): footers, kept rows per row group, label range;
      - ``prepare(table, ...)`` given the table's folder: the same from a fresh listing (log
        replay, footers, every DV read and decoded);
      - ``delta_table(table)`` alone and decoding every DV alone (a fresh listing's).
  - cold fits, in this order, each ``TorchEstimator(...).fit(df)`` with a fresh store:
      (a) in place: ``df = sparkddl.read_delta(spark, table)`` as is. Checked: the fit's
          log says it reads the table in place with deletion vectors the ranks apply, and
          the store has no data/ folder afterwards;
      (b) materialized: ``sparkddl.read_delta(spark, table).select("features", "label")``:
          a transformation that keeps every row Spark gives (not a filter on the label, so
          that a deleted row Spark let through would still reach the loss), which sparkddl
          materializes (checked: its log says so, and the store has a data/ folder).
    Both DataFrames are counted by Spark first, as layouts.py does (the count is checked:
    the rows not deleted). Same MLP as layouts.py's cold fits (64-256-256-10, torch seed
    0), Adam lr 1e-3, cross-entropy, batch 256 per worker, ``--epochs`` (2) epochs,
    numWorkers=2, 1 torch thread per rank. Wall: from the DataFrame (counted) to the
    trained model on the driver. rows trained per epoch: the fit history's rows_trained.
  - memory of the deletion vectors (bytes of arrays, not process RSS):
      - on the driver: the decoded bitmaps, sum over the files of
        ``listing.masks.deleted(fs, path, rows).nbytes`` (sorted uint64 indexes, 8 bytes a
        deleted row), against a dense boolean mask of every file (1 byte a row), the
        serialized bitmaps (the DV file on disk), and deltalake's
        ``DeltaTable.deletion_vectors()`` (deltalake 1.6.6: one row per file with a DV, a
        list<bool> keep mask of every row of it), its Arrow result's nbytes after
        ``read_all()`` (its masks are checked against sparkddl's bitmaps, row by row);
      - per rank: the decoded bitmaps of the files whose row groups the rank reads, from
        the fit's plan (``prepared.train.plan(2, 256, seed=0).pieces(rank)``, each piece's
        row group mapped to its file); a rank decodes a file's whole bitmap, even where it
        reads one row group of the file.

  python benchmarks/lakehouse.py [--tiles 2226] [--files 8] [--row-group 131072]
                                 [--deleted 0.05] [--scratch DIR] [--keep]
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # tests.delta_build: the Delta writer of the tests
from common import digits_parquet, end_run, local_spark, md_table, mlp, start_run, traced_fit  # noqa: E402

DEFAULT_TILES = 2226
SPEC_FEATURES, SPEC_LABEL = "features", "label"


# ---------------------------------------------------------------------------- the table

def write_table(source: Path, table: Path, row_group: int, share: float, seed: int
                ) -> dict[str, Any]:
    """The Delta table at ``table``: each Parquet file of ``source`` as a data file, then
    ``share`` of all rows deleted (random, seeded) by deletion vectors in one DV file; the
    deleted rows' label set to -1 in the files. Returns what was written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.delta_build import DeltaBuilder

    parts = [pq.read_table(p) for p in sorted(source.glob("*.parquet"))]
    sizes = [t.num_rows for t in parts]
    total = sum(sizes)
    rng = np.random.default_rng(seed)
    gone = np.sort(rng.choice(total, size=int(round(share * total)), replace=False))
    starts = np.cumsum([0, *sizes])
    builder = DeltaBuilder(table)
    deletes: dict[str, list[int]] = {}
    for i, part in enumerate(parts):
        mine = gone[(gone >= starts[i]) & (gone < starts[i + 1])] - starts[i]
        label = part.column("label").to_numpy().copy()
        label[mine] = -1
        part = part.set_column(part.schema.get_field_index("label"), "label",
                               pa.array(label))
        path = builder.add_file(part, name=f"part-{i:03d}", row_group_size=row_group)
        deletes[path] = mine.tolist()
    builder.delete(deletes, storage="u")
    dv_files = sorted(table.rglob("deletion_vector_*.bin"))
    return {"rows": total, "deleted": len(gone), "files": len(parts),
            "rows_per_file": sizes, "deleted_per_file": [len(v) for v in deletes.values()],
            "dv_files": len(dv_files), "dv_file_bytes": sum(f.stat().st_size for f in dv_files),
            "data_bytes": sum(f.stat().st_size for f in table.glob("*.parquet")),
            "row_groups_per_file": [pq.ParquetFile(table / f"part-{i:03d}.parquet")
                                    .metadata.num_row_groups for i in range(len(parts))]}


def check_labels(table: Path, deleted: int) -> int:
    """Rows with label -1 in the data files (must be the rows deleted)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    n = sum(int(pc.sum(pc.equal(pq.read_table(f, columns=["label"]).column("label"), -1))
                .as_py() or 0) for f in sorted(table.glob("*.parquet")))
    assert n == deleted, f"{n} rows have label -1 in the files, {deleted} were deleted"
    return n


def cross_entropy_refuses_minus_one() -> str:
    """What CrossEntropyLoss does with a target of -1 (a deleted row's label)."""
    import torch
    try:
        torch.nn.CrossEntropyLoss()(torch.zeros(2, 10), torch.tensor([3, -1]))
    except Exception as exc:  # noqa: BLE001 - the point: it raises
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    raise AssertionError("CrossEntropyLoss accepted the label -1: the check would prove nothing")


# ---------------------------------------------------------------------------- planning

def spec() -> Any:
    from sparkddl.data import DataSpec
    return DataSpec.of([SPEC_FEATURES], [SPEC_LABEL])  # as the estimator builds it


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), times, out


def planning(spark: Any, table: str, batch: int, work: Path, repeats: int
             ) -> tuple[dict[str, Any], Any]:
    import sparkddl
    from sparkddl.data import prepare
    from sparkddl.store import Store
    from sparkddl.tables.delta import delta_table

    out: dict[str, Any] = {}
    store = f"file://{work}/store-plan"
    t, ts, df = best(lambda: sparkddl.read_delta(spark, table), repeats)
    out["read_delta_s"], out["read_delta_runs_s"] = t, ts
    t, ts, prepared = best(lambda: prepare(df, spec(), num_workers=2, batch_size=batch,
                                           store=store), repeats)
    out["prepare_df_s"], out["prepare_df_runs_s"] = t, ts
    assert prepared.in_place, "prepare(read_delta(...)) did not read the table in place"
    t, ts, from_url = best(lambda: prepare(table, spec(), num_workers=2, batch_size=batch),
                           repeats)
    out["prepare_url_s"], out["prepare_url_runs_s"] = t, ts
    t, ts, listing = best(lambda: delta_table(table), repeats)
    out["delta_listing_s"], out["delta_listing_runs_s"] = t, ts
    fs = Store.from_uri(table).filesystem()
    rows = {p: file_rows(fs, p) for p in listing.paths}

    decode_runs = []
    for _ in range(repeats):
        fresh = delta_table(table)  # its own Deletes: nothing decoded yet
        start = time.perf_counter()
        for p in fresh.paths:
            fresh.masks.deleted(fs, p, rows[p])
        decode_runs.append(time.perf_counter() - start)
    out["decode_dvs_s"], out["decode_dvs_runs_s"] = min(decode_runs), decode_runs
    out["label_range"] = list(prepared.label_range(SPEC_LABEL))
    out["label_range_from_url"] = list(from_url.label_range(SPEC_LABEL))
    assert tuple(out["label_range"]) == (0, 9), out["label_range"]
    out["planned_rows"] = prepared.train.rows
    assert from_url.train.rows == prepared.train.rows
    return out, prepared


def file_rows(fs: Any, path: str) -> int:
    import pyarrow.parquet as pq
    with fs.open_input_file(path) as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


# ------------------------------------------------------------------------------- memory

def memory(table: str, prepared: Any, batch: int, seed: int) -> dict[str, Any]:
    from urllib.parse import unquote, urlparse

    import numpy as np

    from sparkddl.store import Store
    from sparkddl.tables.delta import delta_table
    from sparkddl.tables.parquet import list_row_groups

    store = Store.from_uri(table)
    fs, root = store.filesystem(), store.fs_path(store.url())
    listing = delta_table(table)
    rows = {p: file_rows(fs, p) for p in listing.paths}
    decoded = {p: listing.masks.deleted(fs, p, rows[p]) for p in listing.paths}
    per_file = {p: (0 if d is None else int(d.nbytes)) for p, d in decoded.items()}
    out: dict[str, Any] = {
        "files_with_dv": sum(1 for d in decoded.values() if d is not None),
        "deleted_rows": int(sum(len(d) for d in decoded.values() if d is not None)),
        "driver_decoded_bytes": sum(per_file.values()),
        "dense_mask_bytes": sum(rows.values()),  # numpy bool: 1 byte a row of every file
        "serialized_bitmap_bytes": sum(v.size for v in listing.masks.by_file.values()),
    }
    # deltalake's own: a keep mask per file with a DV
    try:
        from deltalake import DeltaTable
        dt = DeltaTable(root)
        if not hasattr(dt, "deletion_vectors"):
            out["deltalake"] = "DeltaTable.deletion_vectors() does not exist in this deltalake"
        else:
            import pyarrow as pa
            start = time.perf_counter()
            got = dt.deletion_vectors().read_all()  # an arro3 Table in deltalake 1.x
            out["deltalake_s"] = time.perf_counter() - start
            out["deltalake_result_bytes"] = int(got.nbytes)  # as deltalake's arrays count it
            result = pa.RecordBatchReader._import_from_c_capsule(  # pyarrow 14: no pa.table()
                got.__arrow_c_stream__()).read_all()
            out["deltalake_result_pyarrow_bytes"] = int(result.nbytes)  # the same, by pyarrow
            out["deltalake_rows"] = result.num_rows
            agree = 0
            for uri, mask in zip(result.column("filepath").to_pylist(),
                                 _lists(result.column("selection_vector"))):
                path = unquote(urlparse(uri).path) if "://" in uri else uri
                ours = decoded.get(path)
                assert ours is not None, f"deltalake names {uri}, which has no DV here"
                assert len(mask) == rows[path], (uri, len(mask), rows[path])
                assert np.array_equal(np.flatnonzero(~mask), ours.astype(np.int64)), uri
                agree += 1
            assert agree == out["files_with_dv"], (agree, out["files_with_dv"])
            out["deltalake_agrees"] = f"yes, {agree} files row by row"
    except ImportError:
        out["deltalake"] = "deltalake is not installed"
    out["peak_rss_growth"] = peak_rss(root)
    # per rank: the files a rank's pieces read, and their decoded bitmaps
    plan = prepared.train.plan(2, batch, seed=seed)
    groups = list_row_groups(fs, root, prepared.train.table)
    assert len(groups) == len(plan.row_groups)
    ranks = []
    for rank in range(plan.world):
        pieces = plan.pieces(rank)
        files = sorted({groups[p.group].path for p in pieces})
        row_groups = sorted({(groups[p.group].path, groups[p.group].index) for p in pieces})
        ranks.append({"rank": rank, "files": len(files), "row_groups": len(row_groups),
                      "rows": sum(p.rows for p in pieces),
                      "decoded_bytes": sum(per_file[f] for f in files),
                      # the part of those bitmaps inside the row groups it reads
                      "decoded_bytes_in_its_row_groups": 8 * sum(
                          _deleted_in(decoded[groups[p.group].path], groups[p.group])
                          for p in _first_piece_per_group(pieces))})
    out["ranks"] = ranks
    out["plan"] = {"rows": plan.rows, "rows_per_epoch": plan.rows_per_epoch,
                   "steps_per_epoch": plan.steps_per_epoch, "row_groups": len(plan.row_groups)}
    return out


PEAK = """
import json, resource, sys
sys.path.insert(0, {repo!r})
root = {root!r}
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
{setup}
before = peak()
{work}
print(json.dumps({{"before": before, "after": peak()}}))
"""
PEAK_CASES = {
    "sparkddl": ("""
import pyarrow.parquet as pq
from sparkddl.tables.delta import delta_table
from sparkddl.store import Store
listing = delta_table(root)
fs = Store.from_uri(root).filesystem()
rows = {p: pq.ParquetFile(fs.open_input_file(p)).metadata.num_rows for p in listing.paths}
""", "kept = [listing.masks.deleted(fs, p, rows[p]) for p in listing.paths]"),
    "deltalake": ("""
from deltalake import DeltaTable
dt = DeltaTable(root)
dt.get_add_actions(flatten=True)
""", "kept = dt.deletion_vectors().read_all()"),
}


def peak_rss(root: str) -> dict[str, int]:
    """Growth of a fresh process's peak RSS while it decodes every DV of the table, by
    sparkddl (``Deletes.deleted`` of each file) and by deltalake (``deletion_vectors()``),
    the table opened first in both (a process each, so that neither inherits the other's
    high-water mark)."""
    import json
    import subprocess

    out = {}
    for name, (setup, work) in PEAK_CASES.items():
        code = PEAK.format(repo=str(HERE.parent), root=root, setup=setup, work=work)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        out[name] = int(got["after"] - got["before"])
    return out


def _lists(column: Any) -> list[Any]:
    """Each list<bool> of a chunked column as a numpy bool array (without Python lists)."""
    import numpy as np
    out = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False).astype(bool)
        out += [values[offsets[i]:offsets[i + 1]] for i in range(len(chunk))]
    return [np.asarray(m) for m in out]


def _first_piece_per_group(pieces: list[Any]) -> list[Any]:
    seen, out = set(), []
    for p in pieces:
        if p.group not in seen:
            seen.add(p.group)
            out.append(p)
    return out


def _deleted_in(deleted: Any, group: Any) -> int:
    import numpy as np
    if deleted is None:
        return 0
    lo, hi = np.searchsorted(deleted, [group.first, group.first + group.rows])
    return int(hi - lo)


# ------------------------------------------------------------------------------- the fits

class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def fit(spark: Any, df: Any, hp: Any, store: Path) -> dict[str, Any]:
    import torch

    from sparkddl import TorchEstimator

    torch.manual_seed(hp.seed)
    lr = hp.lr
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=lr),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol=SPEC_FEATURES,
                         labelCol=SPEC_LABEL, batchSize=hp.batch, epochs=hp.epochs,
                         numWorkers=2, store=f"file://{store}", seed=hp.seed, progress=False)
    logger = logging.getLogger("sparkddl.data")
    captured, level = Captured(), logger.level
    logger.addHandler(captured)
    logger.setLevel(logging.INFO)
    try:
        out = traced_fit(est, df, store)
    finally:
        logger.removeHandler(captured)
        logger.setLevel(level)
    out["store_has_data"] = not out["in_place"]
    out["log"] = [line for line in captured.lines if line.startswith("data: ")]
    return out


def fits(spark: Any, table: str, hp: Any, work: Path, kept: int) -> list[dict[str, Any]]:
    import sparkddl

    rows = []
    for key, label, shape in [
            ("in_place", "(a) in place: fit(read_delta(spark, table))", lambda df: df),
            ("materialized", "(b) materialized: fit(read_delta(spark, table)"
                             ".select('features', 'label'))",
             lambda df: df.select(SPEC_FEATURES, SPEC_LABEL))]:
        print(f"  fit {label}", flush=True)
        start = time.perf_counter()
        df = shape(sparkddl.read_delta(spark, table))
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        counted = df.count()
        count_s = time.perf_counter() - start
        assert counted == kept, f"Spark counts {counted} rows, {kept} are not deleted"
        out = fit(spark, df, hp, work / f"store-{key}")
        log_text = " ".join(out["log"])
        if key == "in_place":
            assert not out["store_has_data"], f"(a) wrote data/ to the store: {out['log']}"
            assert "in place" in log_text and "deletion vector" in log_text, \
                f"(a)'s log: {out['log']}"
        else:
            assert out["store_has_data"], f"(b) was not materialized: {out['log']}"
            assert "materializing" in log_text, f"(b)'s log: {out['log']}"
        for n in out["rows_trained"]:
            assert n is not None and kept - 2 * hp.batch < n <= kept, (n, kept)
        print(f"    {out['wall_s']:.1f} s, rows_trained {out['rows_trained']}", flush=True)
        rows.append({"key": key, "fit": label, "read_delta_s": read_s, "count_s": count_s,
                     **out})
    base = rows[0]["wall_s"]
    for r in rows:
        r["vs_in_place"] = r["wall_s"] / base
        r["rows_trained_per_epoch"] = ", ".join(f"{n:,}" for n in r["rows_trained"])
        r["epoch_times_s"] = [round(t, 1) for t in r["epoch_times"]]
        r["store"] = "data/ (materialized)" if r["store_has_data"] else "no data/ (in place)"
    return rows


# ----------------------------------------------------------------------------- the report

FIT_COLUMNS = ["fit", "wall_s", "vs_in_place", "loop_s", "epoch_times_s",
               "rows_trained_per_epoch", "final_loss", "store"]


def _kb(n: int) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def memory_md(mem: dict[str, Any], facts: dict[str, Any]) -> str:
    dense = mem["dense_mask_bytes"]
    rows = [{"what": "sparkddl, driver: decoded bitmaps of every file (uint64 indexes)",
             "bytes": f"{mem['driver_decoded_bytes']:,}",
             "size": _kb(mem["driver_decoded_bytes"]),
             "vs dense mask": f"{mem['driver_decoded_bytes'] / dense:.3f}"}]
    for r in mem["ranks"]:
        rows.append({"what": f"sparkddl, rank {r['rank']}: decoded bitmaps of its {r['files']} "
                             f"files ({r['row_groups']} row groups, {r['rows']:,} rows)",
                     "bytes": f"{r['decoded_bytes']:,}", "size": _kb(r["decoded_bytes"]),
                     "vs dense mask": f"{r['decoded_bytes'] / dense:.3f}"})
    rows.append({"what": "dense boolean mask of every file (1 byte a row)",
                 "bytes": f"{dense:,}", "size": _kb(dense), "vs dense mask": "1"})
    if "deltalake_result_bytes" in mem:
        b = mem["deltalake_result_bytes"]
        rows.append({"what": f"deltalake {mem.get('deltalake_version', '')} "
                             "DeltaTable.deletion_vectors() (Arrow list<bool> keep masks)",
                     "bytes": f"{b:,}", "size": _kb(b), "vs dense mask": f"{b / dense:.3f}"})
    else:
        rows.append({"what": "deltalake DeltaTable.deletion_vectors()",
                     "bytes": mem.get("deltalake", ""), "size": "", "vs dense mask": ""})
    peaks = mem.get("peak_rss_growth", {})
    shown = {k: v for k, v in peaks.items() if v > 0}
    for who, grew in shown.items():
        rows.append({"what": f"peak RSS growth of a fresh process decoding every DV ({who}; "
                             "allocator and runtime included)",
                     "bytes": f"{grew:,}", "size": _kb(grew), "vs dense mask":
                     f"{grew / dense:.3f}"})
    rows.append({"what": "serialized bitmaps (Roaring, in the DV file)",
                 "bytes": f"{mem['serialized_bitmap_bytes']:,}",
                 "size": _kb(mem["serialized_bitmap_bytes"]),
                 "vs dense mask": f"{mem['serialized_bitmap_bytes'] / dense:.3f}"})
    return "\n".join([f"#### Memory of the deletion vectors ({mem['deleted_rows']:,} rows "
                      f"deleted in {mem['files_with_dv']} files of {facts['rows']:,} rows)", "",
                      *md_table(rows, ["what", "bytes", "size", "vs dense mask"])]
                     + ([f"\nPeak RSS of a fresh process did not grow while it decoded every "
                         f"DV ({', '.join(sorted(set(peaks) - set(shown)))}): the decoding "
                         "stays below the high-water mark of opening the table (imports, "
                         "log, footers), so it is not measurable that way here."]
                        if set(peaks) - set(shown) else []))


def planning_md(plan: dict[str, Any], repeats: int) -> str:
    items = [("read_delta(spark, table): log, footers, every DV decoded, Spark frame",
              "read_delta_s"),
             ("prepare(read_delta df) as the fit calls it (DVs cached by read_delta)",
              "prepare_df_s"),
             ("prepare(table folder): fresh listing, footers, every DV read and decoded",
              "prepare_url_s"),
             ("delta_table(table) alone (log replay)", "delta_listing_s"),
             ("decoding every DV alone (read + CRC + Roaring decode)", "decode_dvs_s")]
    rows = [{"driver step": what, "s": plan[key],
             "runs": ", ".join(f"{t:.3f}" for t in plan[f"{key[:-2]}_runs_s"])}
            for what, key in items]
    return "\n".join([f"#### Planning on the driver (best of {repeats})", "",
                      *md_table(rows, ["driver step", "s", "runs"])])


def plot(fit_rows: list[dict], mem: dict[str, Any]) -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2))
        names = ["(a) in place", "(b) materialized"][:len(fit_rows)]
        bars = left.bar(names, [r["wall_s"] for r in fit_rows],
                        color=["tab:green", "tab:orange"][:len(fit_rows)])
        left.bar_label(bars, fmt="%.1f s", fontsize=9)
        for bar, r in zip(bars, fit_rows):
            prep = dict(r["phases"]).get("prepare (plan or materialize the data)", 0.0)
            left.bar(bar.get_x() + bar.get_width() / 2, prep, bar.get_width() * 0.4,
                     color="black", alpha=0.35)
        left.set_ylabel("s")
        left.set_title("cold fit from the DataFrame to the model, s (lower is better;\n"
                       "dark: prepare = plan or materialize)", fontsize=10)
        labels, values, colors = ["driver,\ndecoded"], [mem["driver_decoded_bytes"]], \
            ["tab:green"]
        for r in mem["ranks"]:
            labels.append(f"rank {r['rank']},\ndecoded")
            values.append(r["decoded_bytes"])
            colors.append("tab:olive")
        labels.append("dense\nbool mask")
        values.append(mem["dense_mask_bytes"])
        colors.append("tab:gray")
        if "deltalake_result_bytes" in mem:
            labels.append("deltalake\ndeletion_vectors()")
            values.append(mem["deltalake_result_bytes"])
            colors.append("tab:blue")
        labels.append("serialized\n(DV file)")
        values.append(mem["serialized_bitmap_bytes"])
        colors.append("tab:purple")
        bars = right.bar(labels, [v / (1 << 20) for v in values], color=colors)
        right.bar_label(bars, fmt="%.2f", fontsize=8)
        right.tick_params(axis="x", labelsize=8)
        right.set_ylabel("MiB")
        right.set_title(f"deletion vectors in memory, MiB ({mem['deleted_rows']:,} rows "
                        f"deleted)", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return draw


def report(args: argparse.Namespace, facts: dict, plan: dict, mem: dict, fit_rows: list[dict],
           timings: dict, hp: Any, checks: dict) -> None:
    from dataclasses import asdict

    from common import write_results

    name = "lakehouse" if args.tiles == DEFAULT_TILES else f"lakehouse_{facts['rows'] // 1000}k"
    kept = facts["rows"] - facts["deleted"]
    a, b = fit_rows[0], fit_rows[1]
    title = (f"A Delta table with deletion vectors, read in place vs materialized: cold fits "
             f"({facts['rows']:,} rows, {facts['deleted']:,} deleted; {hp.epochs} epochs, "
             f"batch {hp.batch} per worker, 2 workers)")
    notes = (f"Digits tiled {args.tiles}x with noise, written by DeltaBuilder as "
             f"{facts['files']} data files ({', '.join(map(str, facts['row_groups_per_file']))}"
             f" row groups of <= {args.row_group:,} rows), {100 * args.deleted:g} % of the rows"
             f" deleted at random by deletion vectors (storage 'u', one DV file); deleted rows "
             f"carry label -1 ({checks['minus_one']}). One local[2] session, (a) then (b). "
             f"Wall: from the DataFrame (counted) to the trained model.")
    lines = [f"- (b) / (a): {b['wall_s'] / a['wall_s']:.2f} x; rows not deleted {kept:,}; "
             f"rows trained per epoch (a) {a['rows_trained_per_epoch']}, (b) "
             f"{b['rows_trained_per_epoch']}.",
             f"- (a) fit log: {' / '.join(a['log'])}",
             f"- (b) fit log: {' / '.join(b['log'])}"]
    for r in fit_rows:
        lines.append(f"- {r['key']}: read_delta {r['read_delta_s']:.2f} s and Spark count "
                     f"{r['count_s']:.2f} s before the fit (not in its wall); "
                     + "; ".join(f"{what} {s:.2f} s" for what, s in r["phases"]))
    if "deltalake_s" in mem:
        lines.append(f"- deltalake's deletion_vectors() took {mem['deltalake_s']:.2f} s and "
                     f"agrees with sparkddl's bitmaps: {mem['deltalake_agrees']}.")
    run_times = ("#### Run times (s) and 1-minute load average (2 cores)\n\n"
                 + "; ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    more = ["\n".join(lines), planning_md(plan, args.repeats), memory_md(mem, facts), run_times]
    write_results(name, fit_rows, FIT_COLUMNS, title, plot(fit_rows, mem), notes=notes,
                  extra={"hyper": asdict(hp), "table": facts, "planning": plan, "memory": mem,
                         "timings_s": timings, "checks": checks, "args": vars(args)},
                  more_md="\n\n".join(more))


# ----------------------------------------------------------------------------------- main

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=DEFAULT_TILES,
                   help="digits copies (1,797 rows each); 2226: 4,000,122 rows")
    p.add_argument("--files", type=int, default=8, help="data files of the table")
    p.add_argument("--row-group", type=int, default=131072, help="rows per row group")
    p.add_argument("--deleted", type=float, default=0.05, help="share of rows deleted by DVs")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="per rank")
    p.add_argument("--repeats", type=int, default=3, help="of each planning step (best of)")
    p.add_argument("--scratch", default=None, help="where the work directory goes")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    import deltalake
    import side_by_side

    hp = side_by_side.Hyper(epochs=args.epochs, batch=args.batch)
    work, started, timings = start_run("sparkddl-lakehouse-", args.scratch)
    checks: dict[str, Any] = {"minus_one": cross_entropy_refuses_minus_one()}
    try:
        t = time.perf_counter()
        digits_parquet(work / "source", tiles=args.tiles, files=args.files)
        facts = write_table(work / "source", work / "table", args.row_group, args.deleted,
                            seed=1)
        shutil.rmtree(work / "source")
        checks["label_minus_one_rows_in_files"] = check_labels(work / "table", facts["deleted"])
        timings["write_table_s"] = time.perf_counter() - t
        table = str(work / "table")
        kept = facts["rows"] - facts["deleted"]
        print(f"table: {facts['rows']:,} rows, {facts['deleted']:,} deleted, "
              f"{facts['files']} files", flush=True)
        t = time.perf_counter()
        spark = local_spark("local[2]")
        timings["session_s"] = time.perf_counter() - t
        try:
            t = time.perf_counter()
            plan, prepared = planning(spark, table, args.batch, work, args.repeats)
            timings["planning_s"] = time.perf_counter() - t
            assert plan["planned_rows"] == kept, (plan["planned_rows"], kept)
            t = time.perf_counter()
            mem = memory(table, prepared, args.batch, hp.seed)
            mem["deltalake_version"] = deltalake.__version__
            timings["memory_s"] = time.perf_counter() - t
            print(f"planning: {plan['prepare_df_s']:.2f} s; memory: driver "
                  f"{mem['driver_decoded_bytes']:,} B", flush=True)
            t = time.perf_counter()
            side_by_side.WORKERS = 2
            timings["workers_start_s"] = side_by_side.warm_workers(spark)
            fit_rows = fits(spark, table, hp, work, kept)
            timings["fits_s"] = time.perf_counter() - t
        finally:
            spark.stop()
    finally:
        end_run(work, args.keep, started, timings)
    report(args, facts, plan, mem, fit_rows, timings, hp, checks)


if __name__ == "__main__":
    ARGS = parse()
    # through the module's name, not __main__: functions pickled for the ranks are then
    # imported by name (benchmarks/ is on their PYTHONPATH)
    import lakehouse
    lakehouse.main(ARGS)
