"""The installed stack is one of the three tested stacks, pinned exactly, and imports
together; the package's declared ranges admit what GPU images ship.

pyarrow and torch tell the stacks apart: Petastorm needs pyarrow < 15, so the stack with it
(constraints.txt) has pyarrow 14; the current stack (constraints-current.txt) has pyarrow
>= 18 and no Petastorm (sparkddl reads with pyarrow.parquet there); the oldest stack
(constraints-oldest.txt) is the current one with the oldest torch admitted, 2.4.
"""
from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PETASTORM_STACK = int(md.version("pyarrow").split(".")[0]) < 15
TORCH = md.version("torch").split("+")[0]  # the CPU wheel is 2.13.0+cpu, 2.4.1 +cu121
OLDEST_STACK = tuple(int(p) for p in TORCH.split(".")[:2]) < (2, 13)
CONSTRAINTS = ROOT / ("constraints.txt" if PETASTORM_STACK else
                      "constraints-oldest.txt" if OLDEST_STACK else "constraints-current.txt")
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
    assert v["torch"] == ("2.4.1" if OLDEST_STACK else "2.13.0")
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


def _admits(requirement: str, version: str) -> bool:
    from packaging.requirements import Requirement
    return Requirement(requirement).specifier.contains(version, prereleases=False)


def _requirement(name: str) -> str:
    from packaging.requirements import Requirement
    found = [r for r in md.requires("sparkddl") or []
             if Requirement(r).name.lower() == name and not Requirement(r).marker]
    assert len(found) == 1, f"sparkddl's metadata declares {found} for {name}"
    return found[0]


@pytest.mark.parametrize("package, version", [
    # a GPU image (the H100 machine of the GPU issue) and the ends of the tested range
    ("torch", "2.11.0"), ("torch", "2.4.0"), ("torch", "2.13.0"),
    ("numpy", "2.5.0"), ("pandas", "3.0.0"), ("pyarrow", "25.0.0"), ("pyspark", "4.0.5")])
def test_installed_metadata_admits_what_gpu_images_ship(package, version):
    """Read from the installed package's metadata (what pip checks), not from setup.cfg:
    ``pip install sparkddl`` must keep the CUDA torch and the libraries already there."""
    assert _admits(_requirement(package), version)


def test_installed_metadata_bounds_torch_to_the_tested_range():
    assert not _admits(_requirement("torch"), "2.3.1")
    assert not _admits(_requirement("torch"), "2.14.0")


@pytest.mark.parametrize("python, admitted", [
    ("3.10.0", True), ("3.11.9", True), ("3.12.3", True), ("3.13.1", True), ("3.9.18", False)])
def test_installed_metadata_admits_the_pythons_gpu_runtimes_have(python, admitted):
    from packaging.specifiers import SpecifierSet
    assert (python in SpecifierSet(md.metadata("sparkddl")["Requires-Python"])) is admitted


def test_python_3_10_gets_a_toml_parser():
    """Presets are TOML; tomllib is 3.11+, so 3.10 installs need tomli."""
    from packaging.requirements import Requirement
    tomli = [Requirement(r) for r in md.requires("sparkddl") or []
             if Requirement(r).name == "tomli"]
    assert tomli and tomli[0].marker.evaluate({"python_version": "3.10"})
    assert not tomli[0].marker.evaluate({"python_version": "3.11"})
