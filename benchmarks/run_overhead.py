"""Wall time of a trivial 2-worker run: sparkddl.run vs pyspark's TorchDistributor.

Both run on the same local[2] session in one process, each measured as the median of 5
after one warm-up call. The function initializes a gloo process group and allreduces one
tensor, which is the least any distributed job does.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, median, timed, write_results

REPEATS = 5


def trivial() -> float:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t.item())


def main() -> None:
    from pyspark.ml.torch.distributor import TorchDistributor

    import sparkddl

    logging.getLogger("TorchDistributor").setLevel(logging.ERROR)
    spark = local_spark()
    runners = {
        "sparkddl.run": lambda: sparkddl.run(trivial, num_workers=2, spark=spark),
        "TorchDistributor(local_mode=False)": lambda: TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False).run(trivial),
    }
    rows = []
    for name, call in runners.items():
        assert call() in (2.0, None)  # warm-up; TorchDistributor returns rank 0's value too
        times = timed(call, REPEATS)
        rows.append({"runner": name, "median_s": median(times), "min_s": min(times),
                     "max_s": max(times), "runs": REPEATS})
    base = rows[1]["median_s"]
    for row in rows:
        row["ratio_vs_torchdistributor"] = row["median_s"] / base
    spark.stop()

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.barh([r["runner"] for r in rows], [r["median_s"] for r in rows], color=["C0", "C1"])
        ax.set_xlabel("median wall time of a trivial 2-worker run (s)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    write_results("run_overhead", rows, ["runner", "median_s", "min_s", "max_s",
                                         "ratio_vs_torchdistributor"],
                  "Trivial 2-worker run on local[2] (median of 5)", plot)


if __name__ == "__main__":
    main()
