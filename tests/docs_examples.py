"""The Python examples of the README and the documentation, as written: every fenced block
whose info string starts with ``python``, in page order. A page's blocks share one namespace
(a reader pastes them one after another). Tags follow the language as classes, the form
MkDocs renders (``python {.gpu}``; a bare ``python gpu`` reaches the reader as raw text).
``gpu`` marks a block that needs a CUDA GPU: it and the rest of its page run only where torch
sees one. ``petastorm`` marks a block that needs Petastorm (a "before" of a migration
guide): where Petastorm cannot be imported that block alone is left out, the page's other
blocks run, and the test then skips, saying so."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(python[^\n]*)\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language and tags, code, line) of every Python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [([word.strip("{}.") for word in m.group(1).split()], m.group(2),
             text.count("\n", 0, m.start()) + 2)
            for m in FENCE.finditer(text)]


def with_examples() -> list[Path]:
    return [p for p in pages() if blocks(p)]


# what the suite sets and a reader's shell has not: Spark Connect's local mode, the suite's
# checkout on the path (replaced by the same checkout, as `pip install -e .` would put it)
NOT_A_READER_S = ("PYSPARK_DRIVER_PYTHON", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                  "SPARK_LOCAL_REMOTE", "PYTHONPATH", "MLFLOW_TRACKING_URI")


def reader_environment(executors_python: bool = True) -> dict[str, str]:
    """The environment of a reader who followed docs/install.md: ``PYSPARK_PYTHON`` set to
    the Python sparkddl is installed in (unless ``executors_python`` is false: a notebook
    that sets it itself)."""
    env = {k: v for k, v in os.environ.items()
           if k not in NOT_A_READER_S and not k.startswith("SPARKDDL_")}
    env.pop("PYSPARK_PYTHON", None)
    if executors_python:
        env["PYSPARK_PYTHON"] = sys.executable  # docs/install.md: export PYSPARK_PYTHON
    env["PYTHONPATH"] = str(ROOT)  # this checkout is the installed sparkddl
    return env
