"""The documentation's Python examples are found and are valid Python; running them is
tests/integration/test_docs_examples.py's job."""
from __future__ import annotations

from tests.docs_examples import ROOT, blocks, with_examples


def test_every_page_s_examples_are_found_and_compile():
    found = {str(p.relative_to(ROOT)): blocks(p) for p in with_examples()}
    # the README's complete example and one per guide that shows code at least
    assert {"README.md", "docs/guides/estimator.md", "docs/guides/run.md",
            "docs/guides/data.md", "docs/guides/mlflow.md",
            "docs/guides/training-loop.md"} <= set(found)
    for page, examples in found.items():
        for info, code, line in examples:
            compile(code, f"{page}:{line}", "exec")  # a SyntaxError names the page and line
            left_out = [n for n, text in enumerate(code.splitlines(), line)
                        if "..." in text.split("#")[0]]
            assert left_out == [], f"{page}: lines {left_out} leave code out"
