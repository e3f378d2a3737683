"""Every Python example of the README and the documentation runs as written, as a reader
runs it: each page's blocks in order, in one namespace, in a fresh Python process started
in an empty folder, with only what the install page tells a reader to set
(``PYSPARK_PYTHON``: the executors' Python). Not inside the suite's session: a page that
leans on a session, a variable or an import the suite happens to have fails here.

The selected pages share that one process (tests/run_pages.py), one after another, each in
a namespace, a folder and a Spark session of its own, with the process's environment put
back after it: a page cannot lean on another page either, and the JVM and torch start once
instead of once per page (14 fresh processes cost about 8 minutes more on 2 cores)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.docs_examples import ROOT, blocks, reader_environment, with_examples

PAGES = with_examples()
PER_PAGE_S = 90  # a page's budget in the shared process; the process gets it times the pages


def _name(page) -> str:
    return str(page.relative_to(ROOT))


def _plan(page) -> tuple[list, list, int | None]:
    """(blocks to run, Petastorm blocks left out, line of the first GPU block or None)."""
    import torch
    runnable, left_out = [], []
    for info, code, line in blocks(page):
        if "gpu" in info[1:] and not torch.cuda.is_available():
            return runnable, left_out, line  # it and the rest of the page need a CUDA GPU
        if "petastorm" in info[1:] and importlib.util.find_spec("petastorm") is None:
            left_out.append(f"{page.name}:{line}")
            continue
        runnable.append((_name(page), line, code))
    return runnable, left_out, None


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory) -> dict:
    """Runs the pages this session selected in one fresh reader's process; their results."""
    wanted = {item.callspec.params["page"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    pages = [[_name(p), _plan(p)[0]] for p in PAGES if p in wanted and _plan(p)[0]]
    folder = tmp_path_factory.mktemp("docs")
    work = folder / "reader"
    work.mkdir()
    (folder / "pages.json").write_text(json.dumps(pages), encoding="utf-8")
    results = folder / "results.json"
    try:
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "run_pages.py"),
                               str(folder / "pages.json"), str(results)],
                              cwd=work, env=reader_environment(), capture_output=True,
                              text=True, timeout=PER_PAGE_S * len(pages) + 60)
        log = done.stdout[-4000:] + "\n" + done.stderr[-6000:]
        code = done.returncode
    except subprocess.TimeoutExpired as late:  # what it printed until then says where it hung
        said = [_text(late.stdout)[-4000:], _text(late.stderr)[-6000:]]
        log, code = f"the pages' process outlived its {late.timeout:.0f} s\n" + \
            "\n".join(said), None
    found = json.loads(results.read_text(encoding="utf-8")) if results.exists() else {}
    return {"results": found, "returncode": code, "log": log}


def _text(output: str | bytes | None) -> str:
    """A timed-out run's partial output: bytes even where text=True was asked for."""
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


@pytest.mark.timeout(PER_PAGE_S * len(PAGES) + 180)
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_examples_run_as_written(page, ran):
    runnable, left_out, gpu_line = _plan(page)
    if not runnable:
        pytest.skip(f"{page.name}:{gpu_line} needs a CUDA GPU")
    outcome = ran["results"].get(_name(page))
    assert outcome is not None, f"{_name(page)} did not finish (rc {ran['returncode']}):\n" \
        + ran["log"]
    assert outcome["ok"], outcome.get("error")
    if page.name == "README.md":  # the complete example trains a model worth its name
        assert outcome["found"]["accuracy"] > 0.9, outcome["found"]["accuracy"]
    if left_out:
        pytest.skip(f"{', '.join(left_out)} need(s) Petastorm, which this stack cannot import "
                    "(the page's other blocks ran and passed)")
    if gpu_line is not None:
        pytest.skip(f"ran up to {page.name}:{gpu_line}, which needs a CUDA GPU")


def test_the_process_that_ran_the_pages_ended_cleanly(ran):
    """Every page passing is not enough: the process itself must end on its own, with 0."""
    if not ran["results"]:
        pytest.skip("no page with examples was selected")
    assert ran["returncode"] == 0, ran["log"]
