"""MkDocs hooks: the benchmarks' plots (benchmarks/results/*.png) published with the site
under results/, so that the Benchmarks page shows the latest figures without copies in
docs/; and the table of every Param of reference/options.md, generated from the schema
(sparkddl/config.py's TrainConfig and sparkddl/ml/param_schema.py), so it cannot drift."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OPTIONS_PAGE = "reference/options.md"
MARKER = "<!-- params -->"


def on_files(files, config):  # noqa: ANN001 - MkDocs' hook signature
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File(f"results/{png.name}", str(RESULTS.parent), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001
    if page.file.src_uri != OPTIONS_PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{OPTIONS_PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, params_table())


def _schema():
    """sparkddl.ml.param_schema without sparkddl.ml's __init__ (which imports pyspark, not
    installed in the docs environment)."""
    sys.path.insert(0, str(ROOT))
    path = ROOT / "sparkddl" / "ml" / "param_schema.py"
    spec = importlib.util.spec_from_file_location("_sparkddl_param_schema", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def params_table() -> str:
    schema = _schema()
    presets = {f.name: f.metadata.get("preset") for f in dataclasses.fields(schema.TrainConfig)}
    rows = ["| Param | default | preset key | on TorchModel | what it does |",
            "|---|---|---|---|---|"]
    for p in schema.all_params():
        section = presets.get(p.field) if p.field else None
        key = f"`[{section}] {p.field}`" if section else ""
        default = "" if p.default is None else f"`{p.default!r}`"
        doc = p.doc.replace("|", "\\|")
        rows.append(f"| `{p.name}` | {default} | {key} | {'yes' if p.model else ''} | {doc} |")
    return "\n".join(rows)
