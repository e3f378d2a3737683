"""The performance model: time per epoch and speed-up for N workers and each strategy, from
a calibration on the user's cluster, naming the bottleneck.

Per step and rank::

    compute  = a local training step (measured alone for N = 1, with every rank computing at
               once for N > 1) + the strategy's codec work (measured)
    comm(N)  = the strategy's collective for its bytes per step (measured), priced with the
               link latency a and bandwidth b fitted to an allreduce sweep:
               allreduce  2(N-1)a + 2(N-1)/N * bytes/b        (ring)
               allgather  (N-1)a + (N-1) * bytes/b            (top-k, sign)
               p2p        a + bytes/b                          (gossip: fixed neighbours)
               server     N * (a + bytes/b)                    (SSP: rank 0 serves everyone)
               sharded    (N-1)a + (N-1)/N * bytes/b           (fsdp: ring all-gathers and
                          reduce-scatters; bytes = the full size they assemble per step)
    hidden   = min(comm, backward pass) when the strategy overlaps communication with it
    input    = batch / the reader's rows per second (measured on the real shard)
    step     = compute + comm - hidden + input   (the reader shares the rank's cores)
    epoch(N) = rows / (N * batch) steps + per-epoch snapshot and checkpoint costs
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# how each candidate's traffic behaves as workers are added, and whether it overlaps
KIND = {"allreduce": "allreduce", "allreduce-no-overlap": "allreduce", "fp16": "allreduce",
        "bf16": "allreduce", "powersgd": "allreduce", "topk": "allgather", "sign": "allgather",
        "local_sgd": "allreduce", "dynamic_averaging": "allreduce", "gossip": "p2p",
        "ssp": "server", "fsdp": "sharded"}
OVERLAPS = {"allreduce", "fp16", "bf16", "powersgd", "topk", "sign"}


@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float


@dataclass(frozen=True)
class Prediction:
    strategy: str
    workers: int
    compute_s: float
    comm_s: float
    input_s: float
    step_s: float
    epoch_s: float
    speedup: float
    bottleneck: str


def fit_link(sweep: dict[int, float], world: int) -> Link:
    """Least squares of the ring allreduce time T(n) = 2(W-1)a + 2(W-1)/W * n/b."""
    xs, ys = [float(n) for n in sweep], [float(t) for t in sweep.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = max(my - slope * mx, 0.0)
    hops = max(2 * (world - 1), 1)
    return Link(intercept / hops, hops / max(world, 1) / max(slope, 1e-15))


def comm_time(kind: str, nbytes: float, calls: float, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    a, b = link.latency_s, link.bandwidth_Bps
    if kind == "allreduce":
        return calls * 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b
    if kind == "allgather":
        return calls * (n - 1) * a + (n - 1) * nbytes / b
    if kind == "p2p":
        return calls * a + nbytes / b
    if kind == "server":
        return n * (calls * a + nbytes / b)
    if kind == "sharded":
        return calls * (n - 1) * a + (n - 1) / n * nbytes / b
    raise ValueError(f"unknown traffic kind {kind!r}")


class Model:
    """Predictions from one calibration (the dict ``calibrate`` returns)."""

    def __init__(self, cal: dict[str, Any]):
        self.cal = cal
        self.world = int(cal["world"])
        self.batch = int(cal["batch_size"])
        self.link = fit_link({int(k): v for k, v in cal["allreduce"].items()}, self.world)

    def _hidden(self, label: str, comm: float) -> float:
        return min(comm, self.cal["backward_s"]) if label in OVERLAPS else 0.0

    def codec_s(self, label: str) -> float:
        """Measured step time not explained by the local step and the priced traffic."""
        s = self.cal["strategies"][label]
        comm = comm_time(KIND[label], s["bytes"], s["calls"], self.world, self.link)
        return max(0.0, s["step_s"] - self.cal["step_s"] - comm + self._hidden(label, comm))

    def local_step_s(self, n: int) -> float:
        """One worker has the machine to itself; N share it as in the calibration."""
        alone = self.cal.get("step_alone_s") or self.cal["step_s"]
        return alone if n == 1 else self.cal["step_s"]

    def predict(self, label: str, n: int, rows: int) -> Prediction:
        s = self.cal["strategies"][label]
        compute = self.local_step_s(n) + (self.codec_s(label) if n > 1 else 0.0)
        comm = comm_time(KIND[label], s["bytes"], s["calls"], n, self.link)
        exposed = comm - self._hidden(label, comm)
        read = self.batch / self.cal["reader_rows_s"]
        step = compute + exposed + read
        steps = max(rows // (n * self.batch), 1)
        epoch = steps * step + self.cal["epoch_overhead_s"]
        parts = {"compute": compute, "communication": exposed, "input": read}
        single = max(rows // self.batch, 1) * (self.local_step_s(1) + read) + \
            self.cal["epoch_overhead_s"]
        return Prediction(label, n, compute, exposed, read, step, epoch, single / epoch,
                          # (pyright cannot match dict.get's overloads to max's key)
                          max(parts, key=parts.get))  # pyright: ignore[reportCallIssue, reportArgumentType]
