"""A real Spark standalone cluster on 127.0.0.1 (one master, one worker) from the pip-installed
pyspark, for tests and local experiments.

    with StandaloneCluster(cores=2) as cluster:
        subprocess.run(["spark-submit", "--master", cluster.master_url, "jobs/train.py"])

``python -m sparkddl.session.standalone`` runs one in the foreground until interrupted. Ports are
chosen by the daemons (port 0) and read back from their logs, so nothing races for a port.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from sparkddl.errors import ClusterError

START_TIMEOUT_S = 60.0
_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.:-]+)")
_REGISTERED = re.compile(r"Successfully registered with master")


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


class StandaloneCluster:
    def __init__(self, cores: int = 2, memory: str = "2g", host: str = "127.0.0.1"):
        self.cores, self.memory, self.host = cores, memory, host
        self.master_url = ""
        self._dir = Path(tempfile.mkdtemp(prefix="sparkddl-standalone-"))
        self._procs: list[tuple[subprocess.Popen, IO[str]]] = []

    def __enter__(self) -> "StandaloneCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        master_log = self._spawn("master", "org.apache.spark.deploy.master.Master",
                                 "--host", self.host, "--port", "0", "--webui-port", "0")
        self.master_url = self._wait_for(master_log, _MASTER_URL, "the master to start").group(1)
        worker_log = self._spawn("worker", "org.apache.spark.deploy.worker.Worker",
                                 "--host", self.host, "--cores", str(self.cores),
                                 "--memory", self.memory, "--webui-port", "0",
                                 "--work-dir", str(self._dir / "work"), self.master_url)
        self._wait_for(worker_log, _REGISTERED, "the worker to register with the master")
        return self.master_url

    def stop(self) -> None:
        """Stop the worker, then the master; kill whatever does not stop within 10 s."""
        for proc, log in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            log.close()
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _spawn(self, name: str, main_class: str, *args: str) -> Path:
        home = spark_home()
        log_path = self._dir / f"{name}.log"
        log = open(log_path, "w")
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.host,
               "SPARK_NO_DAEMONIZE": "1"}
        proc = subprocess.Popen([str(home / "bin" / "spark-class"), main_class, *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own group: stop kills children
        self._procs.append((proc, log))
        return log_path

    def _wait_for(self, log_path: Path, pattern: re.Pattern, what: str) -> re.Match:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = pattern.search(log_path.read_text())
            if match:
                return match
            if any(p.poll() is not None for p, _ in self._procs):
                break
            time.sleep(0.2)
        tail = "\n".join(log_path.read_text().splitlines()[-20:])
        raise ClusterError(f"timed out or failed waiting for {what} ({log_path}):\n{tail}")


def main() -> int:
    with StandaloneCluster() as cluster:
        print(f"Spark standalone master at {cluster.master_url} (Ctrl-C stops it)", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
