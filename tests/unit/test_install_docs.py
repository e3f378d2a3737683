"""The install instructions say what setup.cfg installs: every runtime dependency is named in
the README's Install section (included in the docs), every extra in docs/install.md's table,
and no page tells users to install sparkddl from PyPI, where it is not."""
from __future__ import annotations

import configparser
import re

from packaging.requirements import Requirement

from tests.docs_examples import ROOT


def _setup() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    return cfg


def _values(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_the_readme_names_every_runtime_dependency():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("[start:install]"):text.index("[end:install]")]
    names = [Requirement(r).name for r in _values(_setup()["options"]["install_requires"])]
    assert len(names) >= 9
    assert [n for n in names if f"`{n}`" not in section] == [], "README's Install section"


def test_the_install_page_lists_every_extra():
    page = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    extras = list(_setup()["options.extras_require"])
    assert "mlflow" in extras
    assert [e for e in extras if f"| `{e}` |" not in page] == [], "docs/install.md's extras"


def test_the_license_is_shipped():
    assert _setup()["metadata"]["license_files"].strip() == "LICENSE"
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]


def test_no_page_installs_sparkddl_from_pypi():
    pypi = re.compile(r"pip install +['\"]?sparkddl\b|sparkddl\[")
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/**/*.md"),
             *ROOT.glob("conf/*.toml"), *ROOT.glob("notebooks/*.ipynb"),
             *ROOT.glob("sparkddl/**/*.py"), *ROOT.glob("sparkddl/**/*.toml")]
    found = [f"{path.relative_to(ROOT)}:{n}" for path in files
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if pypi.search(line)]
    assert found == [], "sparkddl is not on PyPI: link to docs/install.md instead"
