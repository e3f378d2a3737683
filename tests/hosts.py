"""Several hosts on one machine: Linux network namespaces joined by a veth pair, each with
its own address and nothing else reachable (no route out, no bridge to the root namespace),
and a real Spark standalone master and workers inside them.

    with Hosts(2) as hosts, hosts.spark(workers=[0, 1]) as master_url:
        hosts.run(0, [python, "driver.py", master_url])  # the driver on host 0
        hosts.cut(1)  # host 1 drops off the network (its link goes down)

The machine's hostname resolves to a loopback address inside every namespace, as on stock
images, so code that trusts the hostname fails here as it would on a real cluster.
Everything (processes, namespaces, links) is removed on every path out of the block.
Creating namespaces needs root (CAP_NET_ADMIN): :func:`unavailable` says why not, for a skip.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from sparkddl.session.standalone import spark_home

START_TIMEOUT_S = 90.0
_MASTER = re.compile(r"Starting Spark master at (spark://[\w.:-]+)")
_REGISTERED = re.compile(r"Successfully registered with master")
_MASTER_UI = re.compile(r"MasterWebUI: Bound MasterWebUI to .*, and started at (http://[\w.:-]+)")


def unavailable() -> str:
    """Why namespaces cannot be made here ('' when they can)."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    name = f"sdprobe{os.getpid() % 100000}"
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create network namespaces: {done.stderr.strip()} (needs root)"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")


def _free_tag() -> str:
    """A tag no namespace or link on this machine is named with yet. Names made from the pid
    and the clock alone collided: a module's hosts still up when a test made its own got the
    same name one time in a thousand ('ip netns add' then fails with File exists)."""
    taken = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    taken += subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                            text=True).stdout
    while True:
        tag = f"{random.randrange(10 ** 6):06d}"
        if f"sd{tag}" not in taken:
            return tag


class Hosts:
    """``n`` hosts (2 or more): 10.78.<subnet>.<i+1>/24. Two hosts share one veth pair;
    more are joined through a bridge inside a namespace of their own (a switch)."""

    def __init__(self, n: int = 2):
        tag = _free_tag()
        self.n, self.tag = n, tag
        self.names = [f"sd{tag}h{i}" for i in range(n)]
        self.links = [f"sd{tag}v{i}" for i in range(n)]  # each host's interface
        self.subnet = 100 + int(tag) % 100
        self.addresses = [f"10.78.{self.subnet}.{i + 1}" for i in range(n)]
        self._switch = f"sd{tag}sw" if n > 2 else None
        self._procs: list[tuple[subprocess.Popen, object]] = []
        self.master_ui = ""  # the standalone master's web UI (hosts.spark sets it)
        self.dir = Path(tempfile.mkdtemp(prefix="sparkddl-hosts-"))

    def __enter__(self) -> "Hosts":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        for name in self.names + ([self._switch] if self._switch else []):
            _ip("netns", "add", name)
            _ip("link", "set", "lo", "up", ns=name)
        if self._switch is None:
            _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for name, link in zip(self.names, self.links):
                _ip("link", "set", link, "netns", name)
        else:
            _ip("link", "add", "br0", "type", "bridge", ns=self._switch)
            _ip("link", "set", "br0", "up", ns=self._switch)
            for i, (name, link) in enumerate(zip(self.names, self.links)):
                port = f"sd{self.tag}p{i}"
                _ip("link", "add", link, "type", "veth", "peer", "name", port)
                _ip("link", "set", link, "netns", name)
                _ip("link", "set", port, "netns", self._switch)
                _ip("link", "set", port, "master", "br0", ns=self._switch)
                _ip("link", "set", port, "up", ns=self._switch)
        for name, link, address in zip(self.names, self.links, self.addresses):
            _ip("addr", "add", f"{address}/24", "dev", link, ns=name)
            _ip("link", "set", link, "up", ns=name)

    def cut(self, i: int) -> None:
        """Host ``i`` drops off the network: its link goes down (its processes live on)."""
        _ip("link", "set", self.links[i], "down", ns=self.names[i])

    def heal(self, i: int) -> None:
        _ip("link", "set", self.links[i], "up", ns=self.names[i])

    def popen(self, i: int, cmd: list[str], log_name: str, env: dict[str, str] | None = None,
              stdin: int | None = None) -> tuple[subprocess.Popen, Path]:
        """Start ``cmd`` on host ``i`` in a process group of its own, output to a log file
        (``stdin=subprocess.PIPE``: the caller writes its input); it is killed (with its
        group) when the hosts close."""
        log_path = self.dir / f"{log_name}.log"
        log = open(log_path, "w")
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], *cmd], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                stdin=stdin, text=True, start_new_session=True)
        self._procs.append((proc, log))
        return proc, log_path

    def run(self, i: int, cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
            ) -> tuple[int, str]:
        """Run ``cmd`` on host ``i`` to its end (killed past ``timeout_s``): (exit code,
        output)."""
        proc, log_path = self.popen(i, cmd, f"run-{len(self._procs)}", env)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = -9
        return code, log_path.read_text()

    @contextlib.contextmanager
    def spark(self, workers: list[int], master: int = 0, cores: int = 1,
              memory: str = "1g") -> Iterator[str]:
        """A standalone master on host ``master`` and a worker on each host in ``workers``
        (started together once the master is up); yields the master's URL."""
        home = spark_home()

        def daemon(i: int, name: str, cls: str, *args: str) -> Path:
            env = {"SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.addresses[i],
                   "SPARK_NO_DAEMONIZE": "1",
                   # the master and the workers do little work: a JVM that compiles less
                   # starts sooner
                   "SPARK_DAEMON_JAVA_OPTS": os.environ.get(
                       "SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")}
            return self.popen(i, [str(home / "bin" / "spark-class"), cls, *args], name, env)[1]

        log = daemon(master, "master", "org.apache.spark.deploy.master.Master", "--host",
                     self.addresses[master], "--port", "0", "--webui-port", "0")
        url = _wait_for(log, _MASTER, "the master to start").group(1)
        self.master_ui = _wait_for(log, _MASTER_UI, "the master's web UI").group(1)
        logs = {i: daemon(i, f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host",
                          self.addresses[i], "--cores", str(cores), "--memory", memory,
                          "--webui-port", "0", "--work-dir", str(self.dir / f"work-{i}"), url)
                for i in workers}
        for i, log in logs.items():
            _wait_for(log, _REGISTERED, f"the worker on host {i} to register")
        yield url

    def alive_workers(self, master: int = 0) -> list[str]:
        """The hosts of the workers the master lists ALIVE now (from its web UI's JSON,
        read inside host ``master``)."""
        read = ("import sys, urllib.request; "
                "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")
        done = subprocess.run(["ip", "netns", "exec", self.names[master], sys.executable, "-c",
                               read, f"{self.master_ui}/json/"], capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"cannot read the master's state: {done.stderr.strip()}")
        return sorted(w["host"] for w in json.loads(done.stdout)["workers"]
                      if w["state"] == "ALIVE")

    def close(self) -> None:
        procs = [proc for proc, _ in reversed(self._procs)]
        for proc in procs:  # every group is told first, then each is waited for
            _terminate_group(proc)
        deadline = time.monotonic() + 10
        for proc in procs:
            _kill_group(proc, max(deadline - time.monotonic(), 0.1))
        for _, log in self._procs:
            log.close()  # type: ignore[attr-defined]
        self._procs.clear()
        for name in self.names + ([self._switch] if self._switch else []):
            # whatever still runs inside (a process that left its group) goes too
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Namespaces of these hosts that still exist (a test checks none do)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [n for n in self.names if n in listed]


def _terminate_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is None:
        _terminate_group(proc)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    else:  # the leader exited: its group may still hold children (executors, Python workers)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_for(log_path: Path, pattern: re.Pattern, what: str) -> re.Match:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = pattern.search(log_path.read_text())
        if match:
            return match
        time.sleep(0.2)
    tail = "\n".join(log_path.read_text().splitlines()[-20:])
    raise RuntimeError(f"timed out waiting for {what} ({log_path}):\n{tail}")
