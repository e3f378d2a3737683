"""spark-submit jobs/train.py to a real standalone master + worker on 127.0.0.1."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkddl.session.standalone import StandaloneCluster

ROOT = Path(__file__).resolve().parents[2]
SUBMIT_TIMEOUT_S = 300
# For the JVMs these tests start, which live seconds: compile with C1 alone. C2 compiles
# for long-running code and would rather cost such a JVM CPU time than save it (about a
# third of a Spark launch's CPU here). A flag of the JVM itself, not a Spark setting: what
# the tests check of Spark's settings is untouched ("Picked up JAVA_TOOL_OPTIONS" goes to
# each JVM's stderr).
SHORT_LIVED_JVM = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}


def live_members(pgid: int) -> list[int]:
    """Processes still in process group ``pgid``; zombies (exited, not yet reaped) do not
    count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive


def wait_group_gone(pgid: int, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (alive := live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def run_in_own_group(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a new session (its own process group) that checks that no process
    of the group outlives it: spark-submit's JVM starts the Python driver as a child, which a
    kill of the JVM alone would leave running. On a timeout (ours or pytest-timeout's) the
    whole group is killed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()  # not communicate(): a surviving child would hold the pipes open
        proc.stdout.close()
        proc.stderr.close()
        leftover = wait_group_gone(proc.pid)
        assert not leftover, f"processes {leftover} of the killed group {proc.pid} survived"
        raise
    leftover = wait_group_gone(proc.pid)
    if leftover:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not leftover, f"processes {leftover} outlived {cmd[0]} (group {proc.pid})"
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.timeout(60)
def test_a_timed_out_submit_leaves_no_process_of_its_group(tmp_path):
    # a parent that starts a child and hangs, as spark-submit's JVM does with its Python driver
    pids = tmp_path / "pids"
    parent = ("import os, subprocess, sys, time\n"
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
              "time.sleep(300)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_own_group([sys.executable, "-c", parent], timeout=5)
    group, child = map(int, pids.read_text().split())
    assert not live_members(group)
    with contextlib.suppress(FileNotFoundError):  # gone, or a zombie waiting to be reaped
        assert Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.timeout(420)
def test_spark_submit_to_a_standalone_cluster(tmp_path, monkeypatch):
    submit = Path(sys.executable).parent / "spark-submit"
    for key, value in SHORT_LIVED_JVM.items():  # the daemons', and so their executors', too
        monkeypatch.setenv(key, value)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    cluster = StandaloneCluster(cores=2, memory="2g")
    with cluster:
        # run_in_own_group also checks that nothing spark-submit started outlives it
        proc = run_in_own_group(
            [str(submit), "--master", cluster.master_url, "--conf", "spark.executor.memory=1g",
             str(ROOT / "jobs" / "train.py"), str(ROOT / "conf" / "digits.toml"),
             "--set", "train.epochs=3", "--set", f"output.dir={tmp_path / 'out'}",
             "--set", f"train.store={tmp_path / 'store'}", "--set", "train.progress=false"],
            timeout=SUBMIT_TIMEOUT_S, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        daemons = [p for p, _ in cluster._procs]
    # the preset's local[2] did not override spark-submit's --master
    assert f"spark master: {cluster.master_url}" in proc.stdout
    run = tmp_path / "out" / (tmp_path / "out" / "LATEST").read_text().strip()
    assert (run / "model" / "weights.pt").is_file()
    assert len(json.loads((run / "history.json").read_text())) == 3
    assert all(p.poll() is not None for p in daemons)  # master and worker are gone
