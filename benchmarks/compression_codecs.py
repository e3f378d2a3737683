"""Top-k and sign exchanges against a plain allreduce of the same gradient, before and after
their encode/decode were made faster, in one run.

2 ranks on this host, gloo, 1 torch thread each (torch.multiprocessing, no Spark). The
gradient is one flat float32 bucket the size of the ``wide`` model of
``benchmarks/strategies.py`` (MLP 256-2048-2048-10: 4.73 M entries, 18.9 MB). Per step and
rank: allreduce of the bucket; the top-k (1 %) and sign codecs' ``exchange`` as the
strategies call it (encode, all-gather, decode; error feedback included); and the same two
with the earlier selection and decode (``topk`` over the whole bucket; every sign bit
unpacked and summed with ``torch.where``), kept here as the reference. Each step starts after
a barrier; the median over the timed steps of rank 0.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spawn_ranks, write_results  # noqa: E402

ENTRIES = 256 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10  # the wide MLP
WARMUP, STEPS = 2, 8


def _earlier(monkey: Any) -> None:
    """The codecs as they were: topk over the whole bucket; every bit unpacked for sign."""
    import torch

    from sparkddl.strategies import compression as c

    def topk(magnitude, k):
        return magnitude.topk(k, sorted=False).indices

    def signed_mean(packed, scales, n):
        signs = c.unpack_bits(packed, n)
        return torch.where(signs, scales, -scales).sum(0) / len(packed)

    monkey["top_k_indices"], monkey["signed_mean"] = c.top_k_indices, c.signed_mean
    c.top_k_indices, c.signed_mean = topk, signed_mean


def measure(entries: int, warmup: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    from sparkddl.strategies import compression as c
    from sparkddl.strategies.comm import CommStats

    torch.manual_seed(dist.get_rank())
    grad = torch.randn(entries)
    shapes, keys = [grad.shape], [0]

    def allreduce():
        dist.all_reduce(grad.clone())

    def codec(make):
        state = make()
        return lambda: state.exchange(grad.clone(), keys, shapes).wait()

    runs = {"allreduce": lambda: allreduce,
            "topk 1%": lambda: codec(lambda: c.TopK(CommStats(), 0.01)),
            "sign": lambda: codec(lambda: c.Sign(CommStats()))}
    out: dict[str, float] = {}
    for version in ("now", "earlier"):
        saved: dict[str, Any] = {}
        if version == "earlier":
            _earlier(saved)
        try:
            for name, build in runs.items():
                if version == "earlier" and name == "allreduce":
                    continue
                step = build()
                times = []
                for i in range(warmup + steps):
                    dist.barrier()
                    started = time.perf_counter()
                    step()
                    if i >= warmup:
                        times.append(time.perf_counter() - started)
                key = name if version == "now" else f"{name} (earlier)"
                out[key] = statistics.median(times) * 1e3
        finally:
            for k, v in saved.items():
                setattr(c, k, v)
    return out


def main() -> None:
    ms = spawn_ranks(measure, 2, ENTRIES, WARMUP, STEPS)
    base = ms["allreduce"]
    sent = {"allreduce": 1.0, "topk 1%": 0.02, "sign": 1 / 32}  # bytes vs allreduce (approx.)
    rows = [{"exchange": name, "ms_per_step": round(v, 1), "vs_allreduce": round(v / base, 2),
             "bytes_vs_allreduce": sent[name.split(" (")[0]]} for name, v in ms.items()]

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.barh([r["exchange"] for r in rows][::-1], [r["ms_per_step"] for r in rows][::-1])
        ax.axvline(base, color="red", linestyle="--", label="allreduce")
        ax.set_xlabel("ms per exchange of a 4.73 M-entry bucket (2 ranks, gloo)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)

    write_results("compression_codecs", rows,
                  ["exchange", "ms_per_step", "vs_allreduce", "bytes_vs_allreduce"],
                  "Compressed exchanges vs allreduce, before and after (one run)", plot,
                  notes=f"2 ranks, gloo, 1 torch thread each; {ENTRIES:,} float32 entries; "
                        f"median of {STEPS} steps after {WARMUP}.")


if __name__ == "__main__":
    main()
