"""Every Python example of the README and the documentation runs as written, against the
test session's real Spark (local[2]): a page's blocks in order, in one namespace, in a
folder of their own; an example cannot rot."""
from __future__ import annotations

import importlib.util

import pytest

from tests.docs_examples import ROOT, blocks, with_examples


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run_as_written(page, spark_local, tmp_path, monkeypatch, request):
    import torch
    if any("import mlflow" in code for _, code, _ in blocks(page)):  # its globals restored
        request.getfixturevalue("mlflow_store")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}  # functions pickled by value, as from a notebook
    left_out = []  # blocks that need Petastorm where it cannot be imported
    for info, code, line in blocks(page):
        if "gpu" in info[1:] and not torch.cuda.is_available():
            pytest.skip(f"{page.name}:{line} needs a CUDA GPU")
        if "petastorm" in info[1:] and importlib.util.find_spec("petastorm") is None:
            left_out.append(f"{page.name}:{line}")
            continue
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    if left_out:
        pytest.skip(f"{', '.join(left_out)} need(s) Petastorm, which this stack cannot import "
                    "(the page's other blocks ran and passed)")
    if page.name == "README.md":  # the complete example trains a model worth its name
        assert namespace["accuracy"] > 0.9, namespace["accuracy"]
