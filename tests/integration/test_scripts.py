"""``sparkddl.run(path, *args)``: a Python file run as ``__main__`` on every rank, as
torchrun would, on real Spark (local[2])."""
from __future__ import annotations

import json
import textwrap
import time

import pytest

import sparkddl
from sparkddl import ConfigError, TrainingFailedError

TRAIN = '''
import argparse, json, os, sys
import torch
import torch.distributed as dist
from helper import scale  # a module beside the script

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([scale(args.lr) * (rank + 1)])
dist.all_reduce(t)
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"name": __name__, "argv": sys.argv[1:], "sum": t.item(),
               "world": dist.get_world_size(), "file": os.path.basename(__file__)}, f)
dist.destroy_process_group()
if rank == 1:
    sys.exit(0)  # an explicit success
'''


def write(folder, name: str, text: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.timeout(300)
def test_a_script_runs_as_main_on_every_rank_with_its_arguments(spark_local, tmp_path):
    script = write(tmp_path, "train.py", TRAIN)
    write(tmp_path, "helper.py", "def scale(x):\n    return 10 * x\n")
    out = tmp_path / "out"
    out.mkdir()
    result = sparkddl.run(script, "--lr", "0.5", "--out", str(out), num_workers=2,
                          spark=spark_local, timeout=120)
    assert result is None
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for got in seen:
        assert got == {"name": "__main__", "argv": ["--lr", "0.5", "--out", str(out)],
                       "sum": pytest.approx(5 * 1 + 5 * 2), "world": 2, "file": "train.py"}


@pytest.mark.timeout(300)
def test_a_failing_script_names_the_rank_and_its_line(spark_local, tmp_path):
    script = write(tmp_path, "fails.py", '''
        import os, sys
        import torch.distributed as dist
        dist.init_process_group("gloo")
        if os.environ["RANK"] == "1":
            raise ValueError("the learning rate is negative")
        dist.barrier()
        ''')
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        sparkddl.run(script, num_workers=2, spark=spark_local, timeout=120)
    err = str(info.value)
    assert info.value.failures[0].rank == 1
    assert "ValueError: the learning rate is negative" in err
    assert 'raise ValueError("the learning rate is negative")' in err  # the script's line
    assert time.monotonic() - started < 60
    exits = write(tmp_path, "exits.py", '''
        import sys
        import torch.distributed as dist
        dist.init_process_group("gloo")
        sys.exit(3)
        ''')
    with pytest.raises(TrainingFailedError, match=r"exits.py exited with status 3"):
        sparkddl.run(exits, num_workers=2, spark=spark_local, timeout=120)


@pytest.mark.timeout(300)
def test_a_script_without_a_process_group_is_an_error_on_two_ranks(spark_local, tmp_path):
    script = write(tmp_path, "alone.py", "print('training on my own')\n")
    with pytest.raises(TrainingFailedError, match=r"finished without calling "
                                                  r"torch.distributed.init_process_group"):
        sparkddl.run(script, num_workers=2, spark=spark_local, timeout=120)
    assert sparkddl.run(script, num_workers=1, spark=spark_local, timeout=120) is None


def test_bad_scripts_fail_on_the_driver(spark_local, tmp_path):
    with pytest.raises(ConfigError, match=r"script '.*nowhere.py' not found"):
        sparkddl.run(str(tmp_path / "nowhere.py"), num_workers=2, spark=spark_local)
    broken = write(tmp_path, "broken.py", "def f(:\n")
    with pytest.raises(ConfigError, match=r"broken.py is not valid Python: .* \(line 1\)"):
        sparkddl.run(broken, num_workers=2, spark=spark_local)
    fine = write(tmp_path, "fine.py", "pass\n")
    with pytest.raises(ConfigError, match=r"command-line strings.*got 0.1"):
        sparkddl.run(fine, "--lr", 0.1, num_workers=2, spark=spark_local)
