"""tests/run_pages.py runs several documentation pages in one process; nothing a page made
may reach the next, or a page leaning on another would pass there and fail for a reader."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.docs_examples import ROOT


def test_a_page_cannot_lean_on_an_earlier_page(tmp_path):
    first = ("import os, sys\nos.environ['FROM_PAGE_ONE'] = '1'\nsys.argv.append('x')\n"
             "open('made.txt', 'w').close()\nshared = 41\nanswer = shared + 1\n")
    second = ("import os, sys\nassert 'FROM_PAGE_ONE' not in os.environ\n"
              "assert 'x' not in sys.argv\nassert not os.path.exists('made.txt')\n"
              "print(shared)\n")
    third = "import sys\nfine = sys.version_info[0]\n"
    pages = [["one.md", [["one.md", 3, first]]], ["two.md", [["two.md", 7, second]]],
             ["three.md", [["three.md", 1, third]]]]
    (tmp_path / "pages.json").write_text(json.dumps(pages), encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "run_pages.py"),
                           str(tmp_path / "pages.json"), str(tmp_path / "results.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert results["one.md"] == {"ok": True, "found": {"shared": 41, "answer": 42}}
    # the second page got past the environment, argv and folder checks, and then met the
    # name only the first page defined, named at its own page and line
    assert not results["two.md"]["ok"]
    assert "NameError: name 'shared' is not defined" in results["two.md"]["error"]
    assert 'File "two.md:7", line 5' in results["two.md"]["error"]
    assert results["three.md"] == {"ok": True, "found": {"fine": sys.version_info[0]}}
