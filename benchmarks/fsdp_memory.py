"""Per-rank memory and step time: strategy ``fsdp`` (FSDP2) vs ``allreduce`` (DDP).

2 ranks on this host, gloo, 1 torch thread each, started by torch.multiprocessing (spawn),
no Spark. The model is an MLP 512-4096-4096-4096-4096-512 (54.5 M parameters, 218 MB of
float32), trained with Adam on 32 random rows per rank and step, through the training loop's
calls: ``strategy.wrap``, then per step forward, MSE loss, ``strategy.backward(loss)``,
``strategy.step(optimizer)``. Each strategy runs in fresh processes, so that the peak RSS
(``resource.getrusage(...).ru_maxrss``) is its own; fsdp uses its defaults (every Linear
layer a unit of its own: min_params=1,000,000; reshard_after_forward=True).

Per rank: peak RSS, its growth from before the model was built, and the bytes of the
parameters, gradients and Adam state that rank holds after the last step (its shards under
fsdp; DDP's gradient buckets are in the RSS, not in that sum). Step time: each step starts
after a barrier; a step lasts as long as its slowest rank; the mean over the timed steps.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, spawn_ranks, write_results

WIDTHS = [512, 4096, 4096, 4096, 4096, 512]
BATCH = 32
WARMUP = 2
STEPS = 6
RUNS = {"allreduce": ("allreduce", {}), "fsdp": ("fsdp", {})}
MB = 1e6


def build_model() -> Any:
    import torch.nn as nn

    layers: list[Any] = []
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(WIDTHS) - 2 else [])
    return nn.Sequential(*layers)


def _rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB  # KiB on Linux


def _local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor's local shard only)."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def measure(name: str, options: dict, warmup: int, steps: int) -> dict:
    """On every rank: train, then gather every rank's figures (rank 0's return is kept)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sparkddl import strategies

    rank = dist.get_rank()
    start_rss = _rss_mb()
    torch.manual_seed(0)  # the same initial weights on every rank and for both strategies
    module = build_model()
    count = sum(p.numel() for p in module.parameters())
    strategy = strategies.create(name, options)
    model = strategy.wrap(module)
    wrap_rss = _rss_mb()  # the peak so far: building the full model (and sharding it)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(BATCH, WIDTHS[0], generator=gen), torch.randn(BATCH, WIDTHS[-1],
                                                                     generator=gen)
    times = torch.zeros(steps, dtype=torch.float64)
    for i in range(warmup + steps):
        if i == warmup:
            strategy.end_epoch()  # traffic counted from here
        dist.barrier()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        strategy.backward(loss)
        strategy.step(optimizer)
        if i >= warmup:
            times[i - warmup] = time.perf_counter() - began
    comm = strategy.end_epoch()
    params = list(module.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    mine = torch.tensor([_rss_mb(), start_rss, wrap_rss, _local_bytes(params) / MB,
                         _local_bytes([p.grad for p in params if p.grad is not None]) / MB,
                         _local_bytes(state) / MB, times.mean().item(),
                         comm["comm_bytes"] / steps / MB, comm["comm_calls"] / steps,
                         loss.item()], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
    return {"ranks": [t.tolist() for t in everyone], "step_times_s": times.tolist(),
            "params": count}


FIELDS = ["peak_rss_MB", "start_rss_MB", "wrap_rss_MB", "params_MB", "grads_MB", "optim_MB",
          "step_s", "comm_MB_per_step", "comm_calls_per_step", "last_loss"]


def rows_of(label: str, got: dict) -> list[dict]:
    rows = []
    for rank, values in enumerate(got["ranks"]):
        row: dict[str, Any] = {"strategy": label, "rank": rank, **dict(zip(FIELDS, values))}
        row["rss_growth_MB"] = row["peak_rss_MB"] - row["start_rss_MB"]
        row["growth_at_wrap_MB"] = row["wrap_rss_MB"] - row["start_rss_MB"]
        row["held_MB"] = row["params_MB"] + row["grads_MB"] + row["optim_MB"]
        rows.append(row)
    return rows


def ratios(rows: list[dict], times: dict[str, list[float]]) -> list[dict]:
    """fsdp / allreduce, per rank, for every memory figure; step time from the slowest rank."""
    out = []
    for rank in sorted({r["rank"] for r in rows}):
        base, new = ({r["strategy"]: r for r in rows if r["rank"] == rank}[s]
                     for s in ("allreduce", "fsdp"))
        out.append({"rank": rank, **{f"{k}": new[k] / base[k] for k in
                                     ("peak_rss_MB", "rss_growth_MB", "held_MB",
                                      "comm_MB_per_step")}})
    mean = {s: sum(t) / len(t) for s, t in times.items()}
    for row in out:
        row["step_s"] = mean["fsdp"] / mean["allreduce"]
    return out


def plot(rows: list[dict], times: dict[str, list[float]], params: int) -> Any:
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt

        fig, (mem, speed) = plt.subplots(1, 2, figsize=(9, 3.6),
                                         gridspec_kw={"width_ratios": [3, 1]})
        labels = [f"{r['strategy']}\nrank {r['rank']}" for r in rows]
        xs = range(len(rows))
        for offset, key, what in ((-0.27, "rss_growth_MB", "peak RSS growth"),
                                  (0.0, "held_MB", "params+grads+Adam held"),
                                  (0.27, "peak_rss_MB", "peak RSS")):
            mem.bar([x + offset for x in xs], [r[key] for r in rows], 0.27, label=what)
        mem.set_xticks(list(xs), labels, fontsize=8)
        mem.set_ylabel("MB per rank")
        mem.legend(fontsize=7)
        mem.set_title(f"memory per rank, {params / 1e6:.1f} M-parameter MLP, Adam", fontsize=9)
        names = list(times)
        speed.bar(names, [sum(times[n]) / len(times[n]) for n in names],
                  color=["tab:gray", "tab:blue"])
        speed.set_ylabel("s per step (slowest rank)")
        speed.set_title("step time", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return draw


def main() -> None:
    rows: list[dict] = []
    times: dict[str, list[float]] = {}
    wall: dict[str, float] = {}
    params = 0
    for label, (name, options) in RUNS.items():
        began = time.perf_counter()
        got = spawn_ranks(measure, 2, name, options, WARMUP, STEPS)
        wall[label] = time.perf_counter() - began
        rows += rows_of(label, got)
        times[label] = got["step_times_s"]
        params = got["params"]
    ratio_rows = ratios(rows, times)
    more = "\n".join(["#### fsdp / allreduce", "", *md_table(
        ratio_rows, ["rank", "peak_rss_MB", "rss_growth_MB", "held_MB", "step_s",
                     "comm_MB_per_step"])])
    write_results(
        "fsdp_memory", rows,
        ["strategy", "rank", "peak_rss_MB", "rss_growth_MB", "growth_at_wrap_MB", "held_MB",
         "step_s", "comm_MB_per_step", "comm_calls_per_step", "last_loss"],
        "fsdp (FSDP2) vs allreduce (DDP): memory per rank and step time, 2 ranks, gloo",
        plot(rows, times, params),
        notes=(f"MLP {'-'.join(map(str, WIDTHS))} ({params / 1e6:.1f} M parameters), Adam, "
               f"{BATCH} rows per rank and step, 1 torch thread per rank; {WARMUP} warm-up "
               f"steps, then the mean of {STEPS} (each after a barrier; step_s here is the "
               "rank's own). rss_growth = peak RSS - RSS before the model was built; "
               "growth_at_wrap = the same, once wrap returned (every rank builds the full "
               "model before fsdp shards it); held = parameters + gradients + Adam state this "
               "rank holds (JSON: each part). comm: bytes handed to collectives per step "
               "(fsdp: all-gathers of shards, reduce-scatters of full gradients; on the wire "
               "that is 1.5x allreduce's, not 2x). The same last_loss: both trained the same "
               "model. Step time on CPU: gloo has no native reduce-scatter, and its all-gather "
               "and reduce-scatter were each slower than an allreduce of the same tensor here "
               "(64 MiB: 152 ms and 221 ms vs 90 ms), so fsdp's 15 calls per step cost more "
               "than DDP's 4; this says nothing of NCCL on GPUs. "
               "Wall time per run: "
               + ", ".join(f"{k} {v:.0f}s" for k, v in wall.items()) + "."),
        extra={"step_times_s": times, "ratios": ratio_rows}, more_md=more)


if __name__ == "__main__":
    main()
