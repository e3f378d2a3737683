"""The pinned stack is what is installed, and it imports together."""
from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
CORE = ["pyspark", "pyarrow", "numpy", "pandas", "petastorm", "torch", "setuptools"]


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def test_python_is_3_11():
    assert sys.version_info[:2] == (3, 11)


@pytest.mark.parametrize("package", CORE)
def test_core_package_matches_its_pin(package):
    installed = md.version(package).split("+")[0]  # torch's CPU wheel is 2.13.0+cpu
    assert installed == pins()[package]


def test_stack_constraints_hold():
    v = pins()
    assert v["pyspark"].startswith("4.0.") and v["pyarrow"] == "14.0.2"
    assert v["numpy"].startswith("1.26.") and v["pandas"].startswith("2.2.")
    assert v["petastorm"] == "0.13.1" and v["torch"] == "2.13.0"
    assert int(v["setuptools"].split(".")[0]) < 70


def test_everything_imports_together():
    import numpy
    import pandas
    import petastorm
    import pyarrow.parquet
    import pyspark
    import torch
    from petastorm import make_batch_reader  # noqa: F401
    from petastorm.pytorch import DataLoader  # noqa: F401
    assert torch.tensor(numpy.arange(3)).sum().item() == 3
    assert pandas.__version__ and pyarrow.parquet and petastorm.__version__ and pyspark.__version__
