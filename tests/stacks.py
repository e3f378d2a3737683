"""What this environment has, for tests that need Petastorm or a CUDA GPU, and which tested
stack it is (a constraints file named after the platform it mirrors)."""
from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

from sparkddl.data import petastorm_source

PETASTORM_PROBLEM = petastorm_source.unavailable_reason()
# Petastorm loads on the pinned stack (constraints.txt), so there these tests always run
needs_petastorm = pytest.mark.skipif(PETASTORM_PROBLEM is not None,
                                     reason=f"no usable Petastorm here: {PETASTORM_PROBLEM}")


def _cuda_problem() -> str | None:
    import torch
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return "torch has CUDA but sees no GPU (no driver or no device)"
    return None


CUDA_PROBLEM = _cuda_problem()


def needs_gpu(test):
    """Marked ``gpu`` (``-m gpu`` selects these) and skipped, saying why, without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(
        CUDA_PROBLEM is not None, reason=f"needs a CUDA GPU: {CUDA_PROBLEM}")(test))


ROOT = Path(__file__).resolve().parents[1]
CORE = ["pyspark", "pyarrow", "numpy", "pandas", "torch"]


def read_pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def header(path: Path, key: str) -> str:
    """A constraints file's ``# key: value`` line (python, core, build-first), or ''."""
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return ""


def installed(package: str) -> str:
    return md.version(package).split("+")[0]  # torch's CPU wheel is 2.13.0+cpu


def _this_stack() -> Path | None:
    """The constraints file whose Python and core are what is installed here (the benchmarks'
    and the docs' files name no core: they are no stack of the suite)."""
    python = "{}.{}".format(*sys.version_info[:2])
    for path in sorted(ROOT.glob("constraints*.txt")):
        pins = read_pins(path)
        if header(path, "core") and header(path, "python") == python and \
                all(pins.get(p) == installed(p) for p in CORE):
            return path
    return None


STACK = _this_stack()
# the stack's name: constraints-emr-7.txt is "emr-7", constraints.txt "petastorm"
STACK_NAME = None if STACK is None else \
    STACK.stem.removeprefix("constraints-") if STACK.stem != "constraints" else "petastorm"
