"""The preset's [spark] settings reach a job's driver JVM unless the user set them elsewhere:
fresh processes, real JVMs, their real heaps."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkddl.cli.spark_settings import local_heap_mb
from tests.integration.test_standalone import SHORT_LIVED_JVM, run_in_own_group

ROOT = Path(__file__).resolve().parents[2]
PRESET = str(ROOT / "conf" / "digits.toml")
PROBE = str(ROOT / "tests" / "integration" / "scripts" / "session_probe.py")
SETS = ["--set", "spark.master=local[1]", "--set", "spark.app_name=probe"]
MEMORY = ["--set", "spark.conf.spark.driver.memory=1536m"]
SUBMIT = str(Path(sys.executable).parent / "spark-submit")

# Each launch below starts its own driver JVM (a JVM's heap is fixed when it starts, so no
# two can share one); they are independent processes, so the module starts them all at
# once, with prepare_out_of_heap's, and each test checks its own launch's output. Most of
# a launch is JVM start-up, which waits as well as computes: six at once take well under
# six times one.
LAUNCHES = {
    "preset memory": ([sys.executable, PROBE, PRESET, *SETS, *MEMORY], {}),
    "no memory": ([sys.executable, PROBE, PRESET, *SETS], {}),
    "launcher args": ([sys.executable, PROBE, PRESET, *SETS, *MEMORY], {
        "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g --master local[2] pyspark-shell"}),
    "submit conf": ([SUBMIT, "--conf", "spark.driver.memory=1g", PROBE, PRESET, *SETS, *MEMORY],
                    {}),
    "submit plain": ([SUBMIT, PROBE, PRESET, *SETS, *MEMORY], {}),
}


def probe(cmd: list[str], **env: str) -> tuple[dict, str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYSPARK_SUBMIT_ARGS", "SPARK_DRIVER_MEMORY", "MASTER")}
    proc = run_in_own_group(cmd, timeout=300, cwd=ROOT,
                            env={**environ, **SHORT_LIVED_JVM, **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    # spark-submit merges its Python driver's stderr into its stdout
    return json.loads(line[len("PROBE "):]), proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every launch of this module, started at once: the name of one -> what it returned,
    waiting for that launch alone. Each launch keeps its own timeout and the check that
    nothing of its process group outlives it."""
    with ThreadPoolExecutor(len(LAUNCHES) + 1) as pool:
        running = {name: pool.submit(probe, cmd, **env) for name, (cmd, env) in LAUNCHES.items()}
        running["prepare out of heap"] = pool.submit(prepare_out_of_heap,
                                                     tmp_path_factory.mktemp("heap"))
        yield lambda name: running[name].result()


def heap_matches(max_heap_mb: float, xmx_mb: int) -> bool:
    # the JVM reports -Xmx less a survivor space, or rounded up to its heap region size
    return 0.85 * xmx_mb <= max_heap_mb <= 1.01 * xmx_mb


@pytest.mark.timeout(420)
def test_the_presets_master_and_driver_memory_reach_the_jvm(launched):
    got, _ = launched("preset memory")
    assert got["master"] == "local[1]" and got["app_name"] == "probe"
    assert heap_matches(got["max_heap_mb"], 1536), got


@pytest.mark.timeout(420)
def test_a_local_master_without_a_memory_setting_gets_half_the_machine(launched):
    got, err = launched("no memory")
    assert heap_matches(got["max_heap_mb"], local_heap_mb()), got
    assert f"driver heap {local_heap_mb()}m for local[1]" in err


@pytest.mark.timeout(420)
def test_the_launchers_settings_win_over_the_preset(launched):
    got, _ = launched("launcher args")
    assert got["master"] == "local[2]"
    assert heap_matches(got["max_heap_mb"], 1024), got


@pytest.mark.timeout(420)
def test_spark_submit_conf_wins_and_what_cannot_apply_is_said_once(launched):
    got, err = launched("submit conf")
    assert got["master"] == "local[1]"  # no --master given: the preset's applies
    assert heap_matches(got["max_heap_mb"], 1024), got
    # spark-submit's own value wins silently; nothing else was left unapplied
    assert "not applied" not in err


@pytest.mark.timeout(420)
def test_a_jvm_setting_spark_submit_left_unset_is_named_when_it_cannot_apply(launched):
    got, err = launched("submit plain")
    assert got["master"] == "local[1]"
    lines = [x for x in err.splitlines() if "not applied" in x]
    assert lines == ["WARNING preset [spark] spark.driver.memory=1536m not applied: "
                     "spark-submit started the driver JVM before the preset was read; pass it "
                     "to spark-submit (it is Spark's default)"]


def wide_table(path: Path, files: int, rows: int, width: int) -> None:
    """Parquet files of one row group each: rows x width float32 arrays and a label."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(files):
        values = pa.array(rng.standard_normal(rows * width, dtype=np.float32))
        features = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * width + 1, width,
                                                               dtype=np.int32)), values)
        table = pa.table({"features": features, "label": pa.array(rng.integers(0, 10, rows))})
        pq.write_table(table, path / f"part-{i}.parquet", row_group_size=rows)


def prepare_out_of_heap(tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``sparkddl prepare`` of two 100 MB row groups, two tasks at once, in a 512m heap;
    and the folder of its data, store and output."""
    wide_table(tmp_path / "wide", files=2, rows=25_000, width=1024)  # 2 x 100 MB row groups
    args = ["prepare", PRESET, "--set", "spark.master=local[2]",
            "--set", "spark.conf.spark.driver.memory=512m",
            "--set", f"data.source=parquet:{tmp_path / 'wide'}",
            "--set", f"train.store={tmp_path / 'store'}", "--set", f"output.dir={tmp_path}"]
    # the JVM's default collector, as users run it: the suite's serial one (conftest's
    # SPARK_SUBMIT_OPTS) fits these row groups in 512m where G1 does not
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS")}
    cli = str(Path(sys.executable).parent / "sparkddl")
    return run_in_own_group([cli, *args], timeout=300, cwd=ROOT,
                            env={**environ, **SHORT_LIVED_JVM}), tmp_path


@pytest.mark.timeout(420)
def test_preparation_out_of_heap_is_a_clear_error_naming_the_setting(launched):
    proc, tmp_path = launched("prepare out of heap")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    # the job's test split filters by a hash of the rows, so sizing them reads them already
    assert re.match(r"sparkddl: error: (sizing|writing) the training data ran out of Java "
                    r"heap with spark\.driver\.memory=512m shared by 2 tasks at once on "
                    r"local\[2\]", last), proc.stderr[-3000:]
    assert "raise spark.driver.memory" in last and "java.lang.OutOfMemoryError" in last
    assert not list((tmp_path / "store").rglob("meta.json"))  # nothing recorded as prepared
