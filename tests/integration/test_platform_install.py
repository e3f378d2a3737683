"""Each platform's install line in docs/install.md, run as a pip dry run into the stack that
mirrors the platform: it installs sparkddl and changes nothing the runtime ships.

A recipe's line is marked ``<!-- install-line: STACK ... -->`` above its code block; the
line run is the block's last ``pip install`` of a wheel (``%pip install``, ``python3 -m pip
install``, ``/opt/conda/default/bin/pip install``), with the wheel built from this checkout
in place of the path the docs show. ``--no-index``: everything sparkddl needs must already
be there, as on the platform; nothing is fetched."""
from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.stacks import ROOT, STACK_NAME

MARK = re.compile(r"<!-- install-line: ([^>]*)-->\s*```\w*\n(.*?)```", re.S)
PIP = re.compile(r"^(?:%pip|\S*python3? -m pip|\S*/pip|sudo python3 -m pip) install (\S+\.whl)$")


def recipes() -> list[tuple[list[str], str]]:
    """(the stacks a recipe is run against, its wheel's install line) from the Install page."""
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    out = []
    for stacks, block in MARK.findall(text):
        lines = [line.strip() for line in block.splitlines() if PIP.match(line.strip())]
        assert lines, f"no pip install of a wheel in the block marked for {stacks}: {block}"
        out.append((stacks.split(), lines[-1]))
    return out


def test_every_platform_recipe_names_a_tested_stack():
    found = recipes()
    assert len(found) >= 4  # Databricks, EMR, Dataproc, Fabric
    names = {p.stem.removeprefix("constraints-") for p in ROOT.glob("constraints-*.txt")}
    assert {s for stacks, _ in found for s in stacks} <= names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of this checkout, built from a copy of what goes in it: a build in the
    checkout would leave a sparkddl.egg-info there, which the tests' sys.path would read as
    the installed package's metadata."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "sparkddl", source / "sparkddl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(source)],
                   check=True, timeout=300, cwd=out)
    [built] = out.glob("sparkddl-*.whl")
    return built


@pytest.mark.timeout(300)
def test_the_platforms_install_line_changes_nothing_the_runtime_ships(wheel, tmp_path):
    mine = [line for stacks, line in recipes() if STACK_NAME in stacks]
    if not mine:
        pytest.skip(f"no platform recipe is run against the {STACK_NAME} stack")
    for line in mine:
        report = tmp_path / "report.json"
        args = PIP.match(line).group(1)  # the docs' path stands for the wheel built here
        assert args.endswith("sparkddl-0.1.0-py3-none-any.whl")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
             "--disable-pip-version-check", "--report", str(report), str(wheel)],
            capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        planned = [p["metadata"]["name"] for p in json.loads(report.read_text())["install"]]
        # [] where this checkout's sparkddl (the same version) is installed already
        assert set(planned) <= {"sparkddl"}, f"{line} would also install {planned}"
    # and, from the wheel's own metadata, what pip checks: every dependency is met by what
    # the stack has, at the version it has
    assert _unmet(wheel) == []


def _unmet(wheel) -> list[str]:
    from packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(name).decode()
    unmet = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's, or another Python's
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req} (the stack has {version})")
    return unmet


def test_the_wheel_carries_its_package_data_and_says_it_is_typed(wheel):
    """The embedded preset (the CLI's default) and py.typed (PEP 561: type checkers read the
    package's annotations) are in the wheel, beside every subpackage."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"sparkddl/py.typed", "sparkddl/presets/digits.toml",
            "sparkddl/tables/__init__.py", "sparkddl/fit/__init__.py"} <= names
