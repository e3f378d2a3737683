"""The Python examples of the README and the documentation, as written: every fenced block
whose info string starts with ``python``, in page order. A page's blocks share one namespace
(a reader pastes them one after another). ``python gpu`` marks a block that needs a CUDA
GPU: it and the rest of its page run only where torch sees one."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(python[^\n]*)\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(info string, code, line) of every Python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(m.group(1).split(), m.group(2), text.count("\n", 0, m.start()) + 2)
            for m in FENCE.finditer(text)]


def with_examples() -> list[Path]:
    return [p for p in pages() if blocks(p)]
