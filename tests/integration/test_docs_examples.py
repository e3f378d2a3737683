"""Every Python example of the README and the documentation runs as written, as a reader
runs it: each page's blocks in order, in one namespace, in a fresh Python process started
in an empty folder, with only what the install page tells a reader to set
(``PYSPARK_PYTHON``: the executors' Python). Not inside the suite's session: a page that
leans on a session, a variable or an import the suite happens to have fails here."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.docs_examples import ROOT, blocks, reader_environment, with_examples


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run_as_written(page, tmp_path):
    import torch
    runnable, skipped_at = [], None
    left_out = []  # blocks that need Petastorm where it cannot be imported
    for info, code, line in blocks(page):
        if "gpu" in info[1:] and not torch.cuda.is_available():
            skipped_at = line  # it and the rest of the page need a CUDA GPU
            break
        if "petastorm" in info[1:] and importlib.util.find_spec("petastorm") is None:
            left_out.append(f"{page.name}:{line}")
            continue
        runnable.append((str(page.relative_to(ROOT)), line, code))
    if not runnable:
        pytest.skip(f"{page.name}:{skipped_at} needs a CUDA GPU")
    work = tmp_path / "reader"
    work.mkdir()
    (tmp_path / "blocks.json").write_text(json.dumps(runnable), encoding="utf-8")
    results = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "run_page.py"),
                           str(tmp_path / "blocks.json"), str(results)],
                          cwd=work, env=reader_environment(), capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, (done.stdout[-4000:] + "\n" + done.stderr[-6000:])
    found = json.loads(results.read_text(encoding="utf-8"))
    if page.name == "README.md":  # the complete example trains a model worth its name
        assert found["accuracy"] > 0.9, found["accuracy"]
    if left_out:
        pytest.skip(f"{', '.join(left_out)} need(s) Petastorm, which this stack cannot import "
                    "(the page's other blocks ran and passed)")
    if skipped_at is not None:
        pytest.skip(f"ran up to {page.name}:{skipped_at}, which needs a CUDA GPU")
