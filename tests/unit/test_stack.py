"""The installed stack is one of the two tested stacks, pinned exactly, and imports together.

pyarrow tells them apart: Petastorm needs pyarrow < 15, so the stack with it
(constraints.txt) has pyarrow 14, and the current stack (constraints-current.txt) has
pyarrow >= 18 and no Petastorm (sparkddl reads with pyarrow.parquet there).
"""
from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PETASTORM_STACK = int(md.version("pyarrow").split(".")[0]) < 15
CONSTRAINTS = ROOT / ("constraints.txt" if PETASTORM_STACK else "constraints-current.txt")
CORE = ["pyspark", "pyarrow", "numpy", "pandas", "torch", "setuptools"] + \
    (["petastorm"] if PETASTORM_STACK else [])
only_with_petastorm = pytest.mark.skipif(
    not PETASTORM_STACK, reason="the current stack (pyarrow >= 15) has no Petastorm")


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_python_is_3_11():
    assert sys.version_info[:2] == (3, 11)


@pytest.mark.parametrize("package", CORE)
def test_core_package_matches_its_pin(package):
    installed = md.version(package).split("+")[0]  # torch's CPU wheel is 2.13.0+cpu
    assert installed == pins()[package]


def test_stack_constraints_hold():
    v = pins()
    assert v["torch"] == "2.13.0"
    if PETASTORM_STACK:
        assert v["pyspark"].startswith("4.0.") and v["pyarrow"] == "14.0.2"
        assert v["numpy"].startswith("1.26.") and v["pandas"].startswith("2.2.")
        assert v["petastorm"] == "0.13.1" and int(v["setuptools"].split(".")[0]) < 70
    else:
        assert (4, 1) <= major_minor(v["pyspark"]) < (5, 0)
        assert major_minor(v["pyarrow"]) >= (18, 0)
        assert v["numpy"].startswith("2.") and v["pandas"].startswith("2.")
        assert "petastorm" not in v


def test_everything_imports_together():
    import numpy
    import pandas
    import pyarrow.dataset
    import pyspark
    import torch

    import sparkddl
    assert torch.tensor(numpy.arange(3)).sum().item() == 3
    assert pandas.__version__ and pyarrow.dataset and pyspark.__version__ and sparkddl.__version__


@only_with_petastorm
def test_petastorm_imports_with_the_stack():
    import petastorm
    from petastorm import make_batch_reader  # noqa: F401
    from petastorm.pytorch import DataLoader  # noqa: F401

    from sparkddl.data import petastorm_source
    assert petastorm.__version__
    # what the Petastorm tests skip on: it must not happen on this stack
    assert petastorm_source.unavailable_reason() is None
