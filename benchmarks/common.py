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
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"


def local_spark(master: str = "local[2]", **conf: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
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
                  plot: Callable[[Path], None] | None = None, notes: str = "") -> Path:
    """Write results/<name>.json, .md (a markdown table) and .png (via ``plot``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": name, "date": date.today().isoformat(), "machine": machine()}
    (RESULTS / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    lines = [f"### {title}", "", f"{meta['date']}, {meta['machine']}. {notes}".strip(), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    md = RESULTS / f"{name}.md"
    md.write_text("\n".join(lines) + "\n")
    if plot is not None:
        import matplotlib
        matplotlib.use("Agg")
        plot(RESULTS / f"{name}.png")
    print(md.read_text())
    return md


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)
