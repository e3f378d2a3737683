"""The documentation's Python examples are found and are valid Python; running them is
tests/integration/test_docs_examples.py's job."""
from __future__ import annotations

from tests.docs_examples import FENCE, ROOT, blocks, with_examples


def test_every_page_s_examples_are_found_and_compile():
    found = {str(p.relative_to(ROOT)): blocks(p) for p in with_examples()}
    # the README's complete example and one per guide that shows code at least
    assert {"README.md", "docs/guides/estimator.md", "docs/guides/run.md",
            "docs/guides/data.md", "docs/guides/mlflow.md",
            "docs/guides/training-loop.md"} <= set(found)
    for page, examples in found.items():
        for _info, code, line in examples:
            compile(code, f"{page}:{line}", "exec")  # a SyntaxError names the page and line
            left_out = [n for n, text in enumerate(code.splitlines(), line)
                        if "..." in text.split("#")[0]]
            assert left_out == [], f"{page}: lines {left_out} leave code out"


def test_tags_are_written_as_classes_mkdocs_renders():
    """``python gpu`` would be shown as raw text, fence and all; ``python {.gpu}`` renders."""
    for page in with_examples():
        for match in FENCE.finditer(page.read_text(encoding="utf-8")):
            tags = match.group(1).split()[1:]
            assert not tags or (tags[0].startswith("{") and tags[-1].endswith("}")), \
                f"{page.relative_to(ROOT)}: write ```{match.group(1)} as python {{.tag}}"
