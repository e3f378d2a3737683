"""``python -m sparkddl`` is the ``sparkddl`` command (a Python whose scripts folder is not
on the PATH still has the CLI)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_python_m_sparkddl_is_the_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "sparkddl", "--help"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sparkddl") and "train" in done.stdout
    wrong = subprocess.run([sys.executable, "-m", "sparkddl", "no-such-command"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
