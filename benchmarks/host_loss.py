"""A host lost in the middle of a fit, on two hosts made of network namespaces
(tests/hosts.py; needs root): seconds from the loss (host 1's link taken down after epoch 2)
to the driver knowing, to its decision, and to the first training step after resuming.

Scenarios: ``elastic`` (minWorkers=1: goes on with one rank after slotWaitTimeout=10 s),
``healed`` (host 1 comes back 12 s after the cut, while the driver waits up to 120 s for its
slot: the fit resumes at full width), ``no elastic`` (minWorkers unset: a ClusterError after
the 10 s wait). Digits, an MLP, 2 ranks of 1 core, 10 ms a step.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests import hosts as harness  # noqa: E402

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "multihost.py"
SCENARIOS = {"elastic": ("elastic", None), "healed": ("heal", 12.0),
             "no elastic": ("lost", None)}


def first(log: str, pattern: str) -> float | None:
    found = re.search(rf"^LOG (\d+\.\d+) {pattern}", log, re.M)
    return float(found.group(1)) if found else None


def scenario(name: str) -> dict:
    mode, heal_after = SCENARIOS[name]
    with harness.Hosts(2) as hosts, hosts.spark(workers=[0, 1]) as url:
        env = {"SPARK_LOCAL_IP": hosts.addresses[0], "PYSPARK_PYTHON": sys.executable}
        proc, log_path = hosts.popen(0, [sys.executable, str(SCRIPT), mode, url,
                                         str(hosts.dir / "store")], "driver", env)
        while "EPOCH 2 " not in log_path.read_text():
            if proc.poll() is not None:
                raise RuntimeError(log_path.read_text()[-3000:])
            time.sleep(0.1)
        cut = time.time()
        hosts.cut(1)
        if heal_after is not None:
            time.sleep(heal_after)
            hosts.heal(1)
        proc.wait(400)
        log = log_path.read_text()
    result = json.loads(log.split("RESULT ", 1)[1].splitlines()[0])
    knows = first(log, "lost rank")
    # the relaunch, or (no elastic) the ClusterError ending the fit
    decided = first(log, r"attempt 1 resumes run") or result["ended_at"]
    failed = first(log, r"attempt 0 of run .* failed")
    restart = (result.get("restarts") or [{}])[0]
    resumed = (failed + restart["recovery_s"]) if failed and restart.get("recovery_s") \
        else None

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - cut, 1)

    return {"scenario": name, "knows_s": since(knows), "decided_s": since(decided),
            "first_step_s": since(resumed),
            "world_after": restart.get("world_size") or "-",
            "outcome": "completed" if result.get("ok") else result.get("error"),
            "epochs": len(result.get("history") or [])}


def plot(rows: list[dict]):
    def draw(path: Path) -> None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3))
        for i, r in enumerate(rows):
            marks = [(r["knows_s"], "knows", "tab:red"), (r["decided_s"], "decided", "tab:blue"),
                     (r["first_step_s"], "first step", "tab:green")]
            for value, label, color in marks:
                if value is not None:
                    ax.scatter(value, i, color=color, label=label if i == 0 else None, zorder=3)
            ax.hlines(i, 0, max(v for v, _, _ in marks if v is not None), color="grey")
        ax.set_yticks(range(len(rows)), [r["scenario"] for r in rows])
        ax.set_xlabel("seconds after host 1 was cut off")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(path)
    return draw


def main() -> None:
    why = harness.unavailable()
    if why:
        raise SystemExit(f"host_loss needs network namespaces: {why}")
    rows = [scenario(name) for name in SCENARIOS]
    write_results("host_loss", rows, ["scenario", "knows_s", "decided_s", "first_step_s",
                                      "world_after", "outcome", "epochs"],
                  "A host lost mid-fit (two network-namespace hosts)", plot(rows),
                  notes="Seconds after host 1's link went down (after epoch 2 of 8).")


if __name__ == "__main__":
    main()
