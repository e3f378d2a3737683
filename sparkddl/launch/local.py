"""Ranks as processes on the driver's own host, no Spark stage: ``TorchDistributor``'s
``local_mode=True``.

The driver opens the run's TCPStore on port 0 (no port race) and starts N Python processes
with the torchrun environment pointing at it; each runs the function (or script) and writes
its outcome to a file of its own: rank 0's return value, or any rank's traceback. Their
output reaches the driver's stdout prefixed ``[rank N]``. The first rank to fail ends the
run: the others are killed at once and the error names the rank with its traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sparkddl.errors import RankFailure, TrainingFailedError
from sparkddl.launch.pickling import serialize_call
from sparkddl.task.frameworks import GroupWatch, warn_unsynced

POLL_S = 0.05
KILL_WAIT_S = 5.0


def run_local(fn: Any, args: tuple, kwargs: dict, num_processes: int, use_gpu: bool,
              timeout_s: float | None = None, caller: str = "TorchDistributor.run",
              gpus: list[str] | None = None) -> Any:
    """``fn(*args, **kwargs)`` in ``num_processes`` processes on this host, one torchrun
    node; rank 0's value. ``gpus``: the CUDA devices the processes may see (all of them see
    the list, LOCAL_RANK picks one, as under pyspark's local mode); None leaves
    ``CUDA_VISIBLE_DEVICES`` as it is."""
    import torch.distributed as dist
    from pyspark import cloudpickle

    payload = serialize_call(fn, args, kwargs)
    store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage] - public at run time
        "127.0.0.1", 0, num_processes + 1, is_master=True,
                          wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="sparkddl-local-") as folder:
        call = Path(folder, "call.pkl")
        call.write_bytes(payload)
        run_id = uuid.uuid4().hex[:12]
        procs = [_start(rank, num_processes, store.port, call, folder, use_gpu, run_id, gpus)
                 for rank in range(num_processes)]
        relays = [threading.Thread(target=_relay, args=(p, rank), daemon=True)
                  for rank, p in enumerate(procs)]
        for t in relays:
            t.start()
        try:
            failure = _wait(procs, folder, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(KILL_WAIT_S)
            for t in relays:
                t.join(KILL_WAIT_S)
        if failure is not None:
            raise failure
        groups = [Path(folder, f"group-{r}.txt") for r in range(num_processes)]
        warn_unsynced(num_processes, [int(g.read_text()) if g.exists() else -1
                                      for g in groups], caller)
        result = Path(folder, "result-0.pkl")
        return cloudpickle.loads(result.read_bytes()) if result.exists() else None


def _start(rank: int, world: int, port: int, call: Path, folder: str,
           use_gpu: bool, run_id: str, gpus: list[str] | None = None) -> subprocess.Popen:
    """A rank's process with torchrun's environment for one node of ``world`` processes:
    its run id, and the host's cores shared out (OMP_NUM_THREADS, unless set)."""
    threads = str(max(1, (os.cpu_count() or 1) // world))
    env = {"OMP_NUM_THREADS": threads, **os.environ, "RANK": str(rank),
           "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
           "GROUP_RANK": "0", "NODE_RANK": "0", "ROLE_RANK": str(rank),
           "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": run_id,
           "TORCHELASTIC_RESTART_COUNT": "0", "SPARKDDL_LOCAL_RANK": str(rank),
           "SPARKDDL_LOCAL_WORLD_SIZE": str(world), "SPARKDDL_NODE_RANK": "0",
           "SPARKDDL_USE_GPU": "1" if use_gpu else "0", "PYTHONUNBUFFERED": "1"}
    if use_gpu and gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return subprocess.Popen([sys.executable, "-m", "sparkddl.launch.local", str(call), folder],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=os.getcwd())


def _relay(proc: subprocess.Popen, rank: int) -> None:
    # (stdout is the PIPE _spawn asked for)
    for line in iter(proc.stdout.readline, b""):  # pyright: ignore[reportOptionalMemberAccess]
        sys.stdout.write(f"[rank {rank}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def _wait(procs: list[subprocess.Popen], folder: str,
          timeout_s: float | None) -> TrainingFailedError | None:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:  # the first to fail, by the time its report was written
            failed.sort(key=lambda r: _reported_at(folder, r))
            return TrainingFailedError([_failure(folder, r, codes[r])  # pyright: ignore[reportArgumentType]
                                        for r in failed[:1]],
                                       reason="local training failed")
        if all(c == 0 for c in codes):
            return None
        if deadline is not None and time.monotonic() > deadline:
            return TrainingFailedError([], reason=f"local training did not finish within "
                                                  f"{timeout_s:g} s")
        time.sleep(POLL_S)


def _reported_at(folder: str, rank: int) -> float:
    path = Path(folder, f"error-{rank}.txt")
    return path.stat().st_mtime if path.exists() else float("inf")


def _failure(folder: str, rank: int, code: int) -> RankFailure:
    path = Path(folder, f"error-{rank}.txt")
    if path.exists():
        message, _, tb = path.read_text().partition("\n")
        return RankFailure(rank, message, tb)
    return RankFailure(rank, f"the process exited with status {code} without a report")


def _main(call: str, folder: str) -> None:
    """A rank's process: run the call, write the outcome, leave without interpreter
    teardown (a process group's destructor can block it on old torch)."""
    import traceback

    from pyspark import cloudpickle

    rank = int(os.environ["RANK"])
    code = 0
    try:
        fn, args, kwargs = cloudpickle.loads(Path(call).read_bytes())
        with GroupWatch().watching() as watch:
            value = fn(*args, **kwargs)
        Path(folder, f"group-{rank}.txt").write_text(str(watch.largest))
        if rank == 0:
            Path(folder, "result-0.pkl").write_bytes(cloudpickle.dumps(value))
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        code = 1
        Path(folder, f"error-{rank}.txt").write_text(
            f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
