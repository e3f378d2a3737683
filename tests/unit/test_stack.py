"""The installed stack is one of the tested stacks, pinned exactly, and imports together;
the package's declared ranges admit what the platforms ship.

Each stack is a constraints file named after the platform it mirrors (constraints.txt: the
Petastorm stack; constraints-<stack>.txt: the others); its header names its Python and its
core, the platform's own versions. The installed stack is the one whose core is installed.
"""
from __future__ import annotations

import importlib.metadata as md
import sys

import pytest

from tests.stacks import CORE, STACK, header, installed, read_pins

PETASTORM_STACK = STACK is not None and STACK.name == "constraints.txt"
only_with_petastorm = pytest.mark.skipif(
    not PETASTORM_STACK, reason="only the Petastorm stack (constraints.txt) has Petastorm")


def pins() -> dict[str, str]:
    assert STACK is not None
    return read_pins(STACK)


def major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_this_environment_is_one_of_the_tested_stacks():
    python = "{}.{}".format(*sys.version_info[:2])
    assert STACK is not None, (
        f"Python {python} with " + ", ".join(f"{p} {installed(p)}" for p in CORE) +
        " is no stack's core (constraints*.txt); build the venv with `make venv STACK=...`")


@pytest.mark.parametrize("package", CORE + ["setuptools"] + (["petastorm"] if PETASTORM_STACK
                                                            else []))
def test_core_package_matches_its_pin(package):
    assert installed(package) == pins()[package.lower()]


def test_the_core_of_the_header_is_what_is_pinned():
    """The header's core (the platform's versions) is what the lock holds: a relock that let
    pip move one of them would no longer mirror the platform."""
    assert STACK is not None
    for spec in header(STACK, "core").split():
        name, version = spec.split("==")
        assert pins()[name] == version, f"{STACK.name}: {name}"


def test_petastorm_stack_constraints_hold():
    v = pins()
    if PETASTORM_STACK:
        assert v["pyspark"].startswith("4.0.") and v["pyarrow"] == "14.0.2"
        assert v["numpy"].startswith("1.26.") and v["pandas"].startswith("2.2.")
        assert v["petastorm"] == "0.13.1" and int(v["setuptools"].split(".")[0]) < 70
    else:
        assert "petastorm" not in v
        assert major_minor(v["pyarrow"]) >= (15, 0)


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


PLATFORMS = {  # what each platform ships (docs/reference/stacks.md)
    "Databricks Runtime 16.4 LTS ML": dict(pyspark="3.5.2", torch="2.6.0", numpy="1.26.4",
                                           pandas="1.5.3", pyarrow="15.0.2"),
    "Databricks Runtime 17.3 LTS ML": dict(pyspark="4.0.0", torch="2.7.0", numpy="2.1.3",
                                           pandas="2.2.3", pyarrow="19.0.1"),
    "Amazon EMR 7.13": dict(pyspark="3.5.6"), "Dataproc 2.2": dict(pyspark="3.5.1"),
    "Microsoft Fabric 2.0": dict(pyspark="4.1.1"),
    "a GPU image (the H100 machine of the GPU issue)": dict(torch="2.11.0"),
    "the newest": dict(numpy="2.5.0", pandas="3.0.0", pyarrow="26.0.1"),
}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_installed_metadata_admits_what_the_platforms_ship(platform):
    """Read from the installed package's metadata (what pip checks), not from setup.cfg:
    ``pip install sparkddl`` must keep the runtime's Spark, torch and libraries as they are."""
    for package, version in PLATFORMS[platform].items():
        assert _admits(_requirement(package), version), f"{platform}: {package} {version}"


def test_installed_metadata_bounds_torch_and_spark_to_the_tested_range():
    assert not _admits(_requirement("torch"), "2.5.1")  # no tested stack has it
    assert not _admits(_requirement("torch"), "2.14.0")
    assert not _admits(_requirement("pyspark"), "3.4.4")
    # its mimalloc crashes a thread's first Parquet read (apache/arrow#50471); 25.0.1 is fixed
    assert not _admits(_requirement("pyarrow"), "25.0.0")
    assert _admits(_requirement("pyarrow"), "25.0.1")
    assert not _admits(_requirement("pyspark"), "5.0.0")


def test_python_3_12_gets_distutils_for_spark_3_5():
    """pyspark 3.5's Arrow conversions import distutils, which only setuptools provides on
    Python 3.12 and later."""
    from packaging.requirements import Requirement
    found = [Requirement(r) for r in md.requires("sparkddl") or []
             if Requirement(r).name == "setuptools"]
    assert found and found[0].marker.evaluate({"python_version": "3.12"})
    assert not found[0].marker.evaluate({"python_version": "3.11"})


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
