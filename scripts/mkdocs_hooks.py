"""MkDocs hooks: the benchmarks' plots (benchmarks/results/*.png) published with the site
under results/, so that the Benchmarks page shows the latest figures without copies in
docs/; and the reference tables generated from the code, so they cannot drift:

- ``<!-- params -->`` (reference/options.md): every Param, from sparkddl/config.py's
  TrainConfig and sparkddl/ml/param_schema.py, with its type, default, whether it is
  required, its choices (the config's, and the built-in strategies for ``strategy``), preset
  key and description;
- ``<!-- params: TorchEstimator -->`` / ``<!-- params: TorchModel -->`` (reference/api.md):
  the Params of each class, with type and default;
- ``<!-- preset-keys -->`` (reference/cli.md): every key of a preset (sparkddl/cli/preset.py).

Nothing here imports pyspark or torch (the docs environment has neither): param_schema is
loaded without sparkddl.ml's __init__, and the strategies' names are read from their source.
tests/unit/test_reference_tables.py checks the tables against the real objects.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import sys
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OPTIONS_PAGE = "reference/options.md"
MARKER = "<!-- params -->"
CLASS_MARKER = re.compile(r"<!-- params: (TorchEstimator|TorchModel) -->")
PRESET_MARKER = "<!-- preset-keys -->"

# what the preset keys that are not training options mean (the others are Params: see
# options.md); preset_table() fails on a key missing here, so a new key needs its words
JOB_KEYS = {
    "spark.master": "Spark master, used only where spark-submit or spark-defaults set none",
    "spark.app_name": "the Spark application's name",
    "spark.conf": "Spark settings (`\"spark.x.y\" = \"value\"`), applied where not already set",
    "data.source": "`sklearn:<name>`, `table:<name>`, `parquet:<path>` or a path",
    "data.test_fraction": "rows held out (by row hash) for `evaluate` and the end of `train`",
    "model.name": "`mlp`, `cnn` or `package.module:factory`",
    "model.kwargs": "keyword arguments of the model factory",
    "optimizer.name": "`sgd`, `adam`, `adamw`, `rmsprop` or `adagrad`",
    "optimizer.lr": "learning rate",
    "optimizer.kwargs": "more optimizer arguments, e.g. `{ weight_decay = 1e-4 }`",
    "loss.name": "`cross_entropy`, `mse`, `bce_with_logits`, ...",
    "output.dir": "each run writes `<dir>/<run id>/` (model, history.json, curves.png, "
                  "metrics.json)",
    "output.mlflow": "log to MLflow, as TorchEstimator's `mlflow=True`",
}


def on_files(files, config):  # noqa: ANN001 - MkDocs' hook signature
    from mkdocs.structure.files import File  # here: the unit test loads this file without mkdocs
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File(f"results/{png.name}", str(RESULTS.parent), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001
    if page.file.src_uri == OPTIONS_PAGE:
        if MARKER not in markdown:
            raise ValueError(f"{OPTIONS_PAGE} lost its {MARKER} marker")
        markdown = markdown.replace(MARKER, params_table())
    markdown = CLASS_MARKER.sub(lambda m: class_params_table(m.group(1)), markdown)
    if PRESET_MARKER in markdown:
        markdown = markdown.replace(PRESET_MARKER, preset_table())
    return markdown


def _schema():
    """sparkddl.ml.param_schema without sparkddl.ml's __init__ (which imports pyspark, not
    installed in the docs environment)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    name = "_sparkddl_param_schema"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "sparkddl" / "ml" / "param_schema.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def strategy_names() -> list[str]:
    """The built-in strategies' names, read from the source of sparkddl/strategies (whose
    modules import torch): BUILT_IN's classes, each class's ``name = "..."``."""
    package = ROOT / "sparkddl" / "strategies"
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    modules = {alias.asname or alias.name: node.module for node in tree.body
               if isinstance(node, ast.ImportFrom) for alias in node.names}
    built_in = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                    and getattr(node.target, "id", "") == "BUILT_IN")
    names = []
    for element in built_in.elts:
        module = modules[element.id].rsplit(".", 1)[-1]
        source = ast.parse((package / f"{module}.py").read_text(encoding="utf-8"))
        cls = next(node for node in source.body
                   if isinstance(node, ast.ClassDef) and node.name == element.id)
        names += [stmt.value.value for stmt in cls.body if isinstance(stmt, ast.Assign)
                  and [getattr(t, "id", "") for t in stmt.targets] == ["name"]]
    return names


def choices(p) -> tuple[str, ...]:  # noqa: ANN001 - a ParamSpec
    """The values ``p`` allows, where it allows a fixed set (the config's ``choices``; for
    ``strategy``, the built-in strategies: registered ones are allowed too)."""
    if p.field == "strategy":
        return tuple(strategy_names())
    if p.field is None:
        return ()
    field = next(f for f in dataclasses.fields(_schema().TrainConfig) if f.name == p.field)
    return tuple(field.metadata["choices"] or ())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code in a table cell: an escaped pipe would show its backslash in backticks."""
    return "<code>" + text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "&#124;") \
        + "</code>"


def _default(p) -> str:  # noqa: ANN001
    return "required" if p.required else f"`{p.default!r}`"


def params_table() -> str:
    schema = _schema()
    presets = {f.name: f.metadata.get("preset") for f in dataclasses.fields(schema.TrainConfig)}
    rows = ["| Param | type | default | required | choices | preset key | on TorchModel | "
            "what it does |", "|---|---|---|---|---|---|---|---|"]
    for p in schema.all_params():
        section = presets.get(p.field) if p.field else None
        key = f"`[{section}] {p.field}`" if section else ""
        allowed = choices(p)
        doc = p.doc.removesuffix(f" (one of: {', '.join(allowed)})")
        if p.field == "strategy":
            doc += " (a built-in one, or one registered with `sparkddl.strategies.register`)"
        listed = ", ".join(f"`{c}`" for c in allowed)
        rows.append(f"| `{p.name}` | {_code(schema.value_type(p))} | {_default(p)} | "
                    f"{'yes' if p.required else ''} | {listed} | {key} | "
                    f"{'yes' if p.model else ''} | {_cell(doc)} |")
    return "\n".join(rows)


def class_params_table(cls: str) -> str:
    """The Params of TorchEstimator (all) or TorchModel (those it shares), for api.md."""
    schema = _schema()
    specs = [p for p in schema.all_params() if cls == "TorchEstimator" or p.model]
    rows = ["| Param | type | default |", "|---|---|---|"]
    rows += [f"| [`{p.name}`](options.md) | {_code(schema.value_type(p))} | {_default(p)} |"
             for p in specs]
    return "\n".join(rows)


def _toml_type(hint: typing.Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_toml_type(a) for a in args if a is not type(None))
    if origin is list:
        return f"array of {_toml_type(args[0])}"
    if origin is dict or hint is dict:
        return "table"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def preset_table() -> str:
    """Every preset key: section, key, TOML type, default (as in a preset: the job's own
    defaults), and what it is (the Param it sets, or its words from JOB_KEYS)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from sparkddl.cli import preset
    from sparkddl.config import TrainConfig
    params = {f.name: f.metadata["param"] for f in dataclasses.fields(TrainConfig)}
    rows = ["| key | type | default | what it is |", "|---|---|---|---|"]
    for section in dataclasses.fields(preset.JobConfig):
        cls = typing.get_type_hints(preset.JobConfig)[section.name]
        hints = typing.get_type_hints(cls)
        instance = cls()
        for f in dataclasses.fields(cls):
            key = f"{section.name}.{f.name}"
            nullable = type(None) in typing.get_args(hints[f.name])
            value = getattr(instance, f.name)
            default = "unset" if value is None else f"`{value!r}`"
            if key in JOB_KEYS:
                what = JOB_KEYS[key]
            elif params.get(f.name):
                what = f"sets [`{params[f.name]}`](options.md)"
            else:
                raise ValueError(f"preset key {key} has no description: add it to "
                                 "scripts/mkdocs_hooks.py JOB_KEYS")
            kind = _toml_type(hints[f.name]) + (" (or unset)" if nullable else "")
            rows.append(f"| `{key}` | {kind} | {_cell(default)} | {_cell(what)} |")
    return "\n".join(rows)
