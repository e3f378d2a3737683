"""The reference tables the docs build generates (scripts/mkdocs_hooks.py) against the real
objects: every Param with its type, the required ones, the choices (the built-in strategies
read from source equal the registry's), every preset key; and the public names griffe sees
in sparkddl/__init__.py's TYPE_CHECKING block equal the lazy exports."""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

import sparkddl
from sparkddl.config import TrainConfig
from sparkddl.ml import param_schema

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("_mkdocs_hooks", ROOT / "scripts" /
                                                  "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(table: str) -> dict[str, list[str]]:
    """The table's rows by their first cell's name (without backticks/links)."""
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        out[re.sub(r"[`\[\]]|\(options\.md\)", "", cells[0])] = cells
    return out


def test_every_param_has_a_row_with_its_type_and_default(hooks):
    rows = _rows(hooks.params_table())
    assert list(rows) == [p.name for p in param_schema.all_params()]
    for p in param_schema.all_params():
        name, kind, default, required = rows[p.name][:4]
        assert kind == f"<code>{param_schema.value_type(p).replace('|', '&#124;')}</code>"
        assert kind != "<code></code>"
        if p.required:
            assert (default, required) == ("required", "yes")
        else:
            assert (default, required) == (f"`{p.default!r}`", "")


def test_required_params_are_those_a_fit_refuses_to_start_without(hooks):
    assert [p.name for p in param_schema.all_params() if p.required] == \
        ["model", "optimizer", "loss"]


def test_strategy_lists_the_built_in_strategies(hooks):
    from sparkddl.strategies import BUILT_IN
    names = [cls.name for cls in BUILT_IN]
    assert hooks.strategy_names() == names
    choices = _rows(hooks.params_table())["strategy"][4]
    assert choices == ", ".join(f"`{n}`" for n in names)
    assert "allreduce" in names and "fsdp" in names


def test_choices_are_the_configs(hooks):
    rows = _rows(hooks.params_table())
    by_field = {p.field: p.name for p in param_schema.config_params()}
    checked = 0
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["choices"] and f.name in by_field:
            assert rows[by_field[f.name]][4] == ", ".join(f"`{c}`" for c in
                                                          f.metadata["choices"])
            assert "(one of:" not in rows[by_field[f.name]][-1]  # not twice
            checked += 1
    assert checked >= 7  # evaluation, bestByMode, finalWeights, readerPool, reader, ...


def test_class_tables(hooks):
    estimator = _rows(hooks.class_params_table("TorchEstimator"))
    model = _rows(hooks.class_params_table("TorchModel"))
    assert list(estimator) == [p.name for p in param_schema.all_params()]
    assert list(model) == [p.name for p in param_schema.all_params() if p.model]


def test_every_preset_key_is_in_the_table(hooks):
    from sparkddl.cli import preset
    rows = _rows(hooks.preset_table())
    keys = [f"{s.name}.{f.name}" for s in dataclasses.fields(preset.JobConfig)
            for f in dataclasses.fields(s.default_factory())]
    assert list(rows) == keys
    assert all(cells[1] and cells[3] for cells in rows.values())
    assert set(hooks.JOB_KEYS) <= set(keys)  # no words for keys that are gone


def test_type_checking_names_are_the_lazy_exports():
    """griffe (the API page) and type checkers see the names sparkddl hands out lazily."""
    tree = ast.parse((ROOT / "sparkddl" / "__init__.py").read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in guarded.body
                for alias in node.names}
    exports = dict(sparkddl._EXPORTS)
    for name, module in imported.items():  # a package re-exporting it is the same object
        assert getattr(__import__(module, fromlist=[name]), name) is getattr(sparkddl, name)
    assert set(imported) == set(exports)
