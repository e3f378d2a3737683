"""Top-k and sign exchanges against a plain allreduce of the same gradient, before and after
their encode/decode were made faster, in one run.

2 ranks on this host, gloo, 1 torch thread each (torch.multiprocessing, no Spark). The
gradient is one flat float32 bucket the size of the ``wide`` model of
``benchmarks/strategies.py`` (MLP 256-2048-2048-10: 4.73 M entries, 18.9 MB). Per step and
rank: allreduce of the bucket; the top-k (1 %) and sign codecs' ``exchange`` as the
strategies call it (encode, all-gather, decode; error feedback included); and the same two
with the earlier selection and decode (``topk`` over the whole bucket; every sign bit
unpacked and summed with ``torch.where``), kept here as the reference. The bucket is one
tensor refilled every step, as DDP's bucket is for its communication hook (the default,
``overlap``), and its refill is not timed. The exchanges take turns step by step, so a slow
spell of the host hits all of them; each step starts after a barrier; the median over the
timed steps of rank 0.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spawn_ranks, write_results

ENTRIES = 256 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10  # the wide MLP
WARMUP, STEPS = 3, 30


def _earlier() -> dict:
    """The codecs' functions as they were: topk over the whole bucket; every bit unpacked
    for sign."""
    import torch

    from sparkddl.strategies import compression as c

    def topk(x, k, above=None):
        return x.abs().topk(k, sorted=False).indices

    def signed_mean(packed, scales, out):
        negative = c.unpack_bits(packed, out.numel())
        scales = scales.unsqueeze(1)
        return out.copy_(torch.where(negative, -scales, scales).sum(0) / len(packed))

    return {"top_k_indices": topk, "signed_mean": signed_mean}


def measure(entries: int, warmup: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    from sparkddl.strategies import compression as c
    from sparkddl.strategies.comm import CommStats

    torch.manual_seed(dist.get_rank())
    grad = torch.randn(entries)
    shapes, keys = [grad.shape], [0]
    bucket = torch.empty_like(grad)  # as DDP's bucket: the same tensor every step
    earlier, now = _earlier(), {name: getattr(c, name) for name in _earlier()}

    def run(make_codec, functions):
        codec = make_codec()

        def step(flat):
            vars(c).update(functions)  # the selection and decode of this version
            try:
                return codec.exchange(flat, keys, shapes).wait()
            finally:
                vars(c).update(now)
        return step

    exchanges = {"allreduce": lambda flat: dist.all_reduce(flat),
                 "topk 1%": run(lambda: c.TopK(CommStats(), 0.01), now),
                 "sign": run(lambda: c.Sign(CommStats()), now),
                 "topk 1% (earlier)": run(lambda: c.TopK(CommStats(), 0.01), earlier),
                 "sign (earlier)": run(lambda: c.Sign(CommStats()), earlier)}
    # interleaved, step by step: a slow spell of the host hits every exchange alike
    times: dict[str, list[float]] = {name: [] for name in exchanges}
    for i in range(warmup + steps):
        for name, exchange in exchanges.items():
            bucket.copy_(grad)  # this step's gradient (not timed)
            dist.barrier()
            started = time.perf_counter()
            exchange(bucket)
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    return {key: statistics.median(t) * 1e3 for key, t in times.items()}


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
