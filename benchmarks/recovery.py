"""Recovery from a failed rank in a 2-worker digits fit: how long from the failure to
training resuming, and how much work was redone.

Rank 1 raises (first attempt only) a few steps into epoch 3 of 6; checkpoints every epoch,
then again with checkpoints every 5 steps. A second scenario kills rank 1's Python process
(os._exit) instead of raising.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import local_spark, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.digits import digits_df, mlp  # noqa: E402
from tests.integration.test_fault_tolerance import STEPS, FailingLoss  # noqa: E402


def scenario(spark, how: str, every_steps: int, at_step: int) -> dict:
    import torch

    from sparkddl import TorchEstimator
    with tempfile.TemporaryDirectory() as tmp:
        loss = FailingLoss(os.path.join(tmp, "marker"), at_step=at_step, how=how)
        start = time.perf_counter()
        model = TorchEstimator(
            model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3), loss=loss,
            batchSize=32, epochs=6, numWorkers=2, validation=0.2, store=os.path.join(tmp, "s"),
            checkpointEvery=1, checkpointEverySteps=every_steps, progress=False).fit(
                digits_df(spark))
        wall = time.perf_counter() - start
    [r] = model.restarts
    return {"failure": how, "checkpoints": "every epoch" + (
                f" + every {every_steps} steps" if every_steps else ""),
            "failed_at_step": at_step, "resumed_from": f"epoch {r['resumed_from_epoch']} "
            f"step {r['resumed_from_step']}", "steps_redone": r["steps_redone"],
            "recovery_s": r["recovery_s"], "fit_wall_s": wall,
            "epochs_in_history": len(model.history)}


def main() -> None:
    # executors import FailingLoss from the tests
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    spark = local_spark()
    at = 2 * STEPS + 12  # 12 steps into epoch 3
    rows = [scenario(spark, "raise", 0, at), scenario(spark, "raise", 5, at),
            scenario(spark, "exit", 0, at)]
    spark.stop()

    def plot(path: Path) -> None:
        import matplotlib.pyplot as plt
        labels = [f"{r['failure']}, {r['checkpoints']}" for r in rows]
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 2.8))
        a.barh(labels[::-1], [r["recovery_s"] for r in rows][::-1])
        a.set_xlabel("failure -> next attempt's first step (s)")
        b.barh(labels[::-1], [r["steps_redone"] for r in rows][::-1], color="C1")
        b.set_xlabel("steps redone per rank")
        for ax in (a, b):
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)

    write_results("recovery", rows, ["failure", "checkpoints", "failed_at_step", "resumed_from",
                                     "steps_redone", "recovery_s", "fit_wall_s",
                                     "epochs_in_history"],
                  "Recovery from a failed rank (2-worker digits fit, 6 epochs)",
                  notes="recovery_s: from the failure reaching the driver to the first "
                        "training step of the next attempt reporting.", plot=plot)


if __name__ == "__main__":
    main()
